"""Plan bytes and the runtime's load time vs tables x ranks, schema 2.0 (runs) against 1.1
(shard lists).

    .venv/bin/python -m benchmarks.plan_size_bench [--sizes 1000x128,5384x1024,10000x4096]
        [--jitter 0,0.3] [--time-limit-s 10] [--runs 2]

Each size is planned once (``workloads.synthetic_tables``, hosts of 8 with 80 GiB HBM,
batch 512, ``--time-limit-s``); the plan, as the planner writes it (2.0), and the same plan
expanded to shard lists (``plan.compact.expand_plan``, 1.1), are written to files, and
``runtime.load_plan`` reads each file once in each of ``--runs`` fresh processes (the
bytes read, their content address checked, the plan model built; the imports before the
clock starts): what every training rank does at startup. With jitter 0 tables repeat the
distribution's nine shapes; with 0.3 each table's rows are scaled by its own factor in
[0.7, 1.3].
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.workloads import synthetic_tables, workload_request
from planner_service.plan.codec import plan_bytes
from planner_service.plan.compact import expand_plan
from planner_service.plan.types import ShardingPlan
from planner_service.solve.pipeline import solve

# A training rank at startup: a fresh process that has imported the runtime loads the plan.
CHILD = (
    "import sys, time\n"
    "from runtime.startup import load_plan\n"
    "start = time.perf_counter()\n"
    "load_plan(sys.argv[1])\n"
    "print(time.perf_counter() - start)\n"
)


def load_seconds(path: Path, runs: int) -> list[float]:
    """Wall seconds of ``load_plan`` of the file in each of ``runs`` fresh processes
    (imports before the clock starts)."""
    times = []
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, check=True
        )
        times.append(float(done.stdout.strip().splitlines()[-1]))
    return times


def measure(plan: ShardingPlan, folder: Path, runs: int) -> list[tuple[str, int, list[float]]]:
    """(schema, bytes, load seconds per run) of the plan as written and expanded."""
    rows = []
    for form in (plan, expand_plan(plan)):
        path = folder / f"{form.plan_id}.json"
        data = plan_bytes(form)
        path.write_bytes(data)
        rows.append((form.schema_version, len(data), load_seconds(path, runs)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000x128,5384x1024,10000x4096")
    parser.add_argument("--jitter", default="0,0.3")
    parser.add_argument("--time-limit-s", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    print("| tables x ranks | jitter | shards | schema | plan MB | load_plan s (each run) |")
    print("| --- | ---: | ---: | --- | ---: | --- |")
    with tempfile.TemporaryDirectory(prefix="plan-size-bench-") as folder:
        for size in args.sizes.split(","):
            count, world = (int(part) for part in size.split("x"))
            for jitter in (float(j) for j in args.jitter.split(",")):
                request = workload_request(
                    synthetic_tables(count, jitter=jitter),
                    world,
                    options={"time_limit_s": args.time_limit_s},
                )
                plan = solve(request).plan
                if plan is None:
                    print(f"| {count:,} x {world:,} | {jitter} | no plan | | | |")
                    continue
                shards = sum(table.num_shards for table in plan.tables.values())
                for schema, size_bytes, times in measure(plan, Path(folder), args.runs):
                    each = ", ".join(f"{t:.2f}" for t in times)
                    print(
                        f"| {count:,} x {world:,} | {jitter} | {shards:,} | {schema} | "
                        f"{size_bytes / 1e6:.2f} | {each} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
