"""How planning cost grows with tables x ranks, up to production scale.

    .venv/bin/python -m benchmarks.scale_bench [--sizes 5384x1024:10,10000x4096:60]
        [--jitter 0,0.3] [--batch 512] [--memory-tight FILL] [--seed 0] [--json results.json]

Each size is ``tables x ranks : time limit in seconds``; ranks are hosts of 8 with 80 GiB
HBM each, batch 512. Tables come from the NVIDIA synthetic distribution
(``workloads.synthetic_tables``): with jitter 0 they repeat its nine shapes, as production
models repeat shapes; with jitter 0.3 every table's rows are scaled by its own factor in
[0.7, 1.3], so no two tables share a shape. With ``--memory-tight FILL`` the tables are
``workloads.memory_tight_tables`` instead (seeded draws whose weights fill FILL of the HBM,
two of them larger than a rank's HBM), at ``--batch`` per rank. Each solve runs in a
fresh child process; wall and CPU time are measured there around ``solve()`` (request
parsing and imports outside), peak memory is the child's peak resident set (``ru_maxrss``,
imports included).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

DEFAULT_SIZES = "1000x128:10,2002x256:10,5384x1024:10,10000x4096:60"

CHILD = """
import json, resource, sys, time
from benchmarks.workloads import memory_tight_tables, synthetic_tables, workload_request
from planner_service.plan.codec import plan_bytes
from planner_service.solve.pipeline import solve
count, world = int(sys.argv[1]), int(sys.argv[2])
limit, jitter = float(sys.argv[3]), float(sys.argv[4])
batch, fill, seed = int(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])
tables = (
    memory_tight_tables(count, world, fill=fill, jitter=jitter, seed=seed)
    if fill
    else synthetic_tables(count, jitter=jitter)
)
request = workload_request(tables, world, batch_size=batch, options={"time_limit_s": limit})
start, cpu = time.perf_counter(), time.process_time()
outcome = solve(request)
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
plan = outcome.plan
row = {
    "wall_s": wall,
    "cpu_s": cpu,
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "status": (plan.solver.status if plan else outcome.infeasibility.status).value,
    "groups": outcome.details.get("groups"),
}
if plan:
    row.update(
        objective=plan.solver.objective,
        lower_bound=plan.solver.lower_bound,
        gap=plan.solver.gap,
        bound_source=plan.solver.lower_bound_source,
        stop_reason=plan.solver.stop_reason.value,
        shards=sum(t.num_shards for t in plan.tables.values()),
        plan_mib=len(plan_bytes(plan)) / 2**20,
    )
print(json.dumps(row))
"""


def run(
    count: int, world: int, limit: float, jitter: float, args: argparse.Namespace
) -> dict[str, Any]:
    numbers = (count, world, limit, jitter, args.batch, args.memory_tight, args.seed)
    completed = subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, numbers)],
        capture_output=True,
        text=True,
        timeout=limit * 10 + 600,
        check=False,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    if completed.returncode != 0:
        return {"error": completed.stderr[-300:]}
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES)
    parser.add_argument("--jitter", default="0,0.3")
    parser.add_argument("--batch", type=int, default=512, help="per rank")
    parser.add_argument(
        "--memory-tight", type=float, default=0.0, metavar="FILL", help="weights / HBM"
    )
    parser.add_argument("--seed", type=int, default=0, help="of the memory-tight draw")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    print(
        "| tables | ranks | shapes | limit s | wall s | CPU s | peak MiB | objective ms | "
        "bound ms | gap | stop | shards | plan MiB |"
    )
    print(
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"
    )
    for size in args.sizes.split(","):
        shape, limit_text = size.split(":")
        count, world = (int(x) for x in shape.split("x"))
        limit = float(limit_text)
        for jitter in (float(x) for x in args.jitter.split(",")):
            result = run(count, world, limit, jitter, args)
            rows.append({"tables": count, "ranks": world, "jitter": jitter, **result})
            shapes = "repeated" if jitter == 0 else f"distinct (±{jitter:.0%})"
            head = f"| {count:,} | {world:,} | {shapes} | {limit:g} |"
            if "error" in result:
                print(f"{head} error: {result['error']!r} |", flush=True)
                continue
            if "objective" not in result:
                print(
                    f"{head} {result['wall_s']:.2f} | {result['cpu_s']:.2f} | "
                    f"{result['peak_rss_mib']:,.0f} | {result['status']} |",
                    flush=True,
                )
                continue
            print(
                f"{head} {result['wall_s']:.2f} | {result['cpu_s']:.2f} | "
                f"{result['peak_rss_mib']:,.0f} | {result['objective']:.2f} | "
                f"{result['lower_bound']:.2f} | {result['gap']:.2%} | {result['stop_reason']} | "
                f"{result['shards']:,} | {result['plan_mib']:.1f} |",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
