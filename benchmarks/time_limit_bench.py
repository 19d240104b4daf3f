"""Does ``options.time_limit_s`` hold? Requested against measured wall time of whole solves
(enumeration to sealed plan), on an idle machine and beside a CPU hog.

    .venv/bin/python -m benchmarks.time_limit_bench [--limits 1,5] [--hogs 2]
        [--workloads criteo/8,medium/32,...] [--json results.json]

The contract is wall time <= time_limit_s + max(5%, 0.25 s). Each solve runs in a fresh
child process (so one solve's memory and threads do not slow the next) and its wall time
is measured inside the child, around ``solve()`` only: process start-up and imports are
outside the contract. The hog is ``--hogs`` busy processes (default: one per core), started
before the solve and stopped after, so the solver shares every core with them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
from typing import Any

from benchmarks.workloads import named_workload, nvidia_tables, workload_request
from planner_service.solve.deadline import finish_slack_s

DEFAULT_WORKLOADS = (
    "criteo/8",
    "criteo-60/16",
    "small/32",
    "medium/32",
    "large/128",
    "colossal/128",
    "colossal-10000/128",
)

CHILD = """
import json, sys, time
from benchmarks.time_limit_bench import build
from planner_service.solve.pipeline import solve
request = build(sys.argv[1], float(sys.argv[2]))
start = time.perf_counter()
outcome = solve(request)
wall = time.perf_counter() - start
plan = outcome.plan
print(json.dumps({
    "wall_s": wall,
    "status": (plan.solver.status if plan else outcome.infeasibility.status).value,
    "stop_reason": plan.solver.stop_reason.value if plan and plan.solver.stop_reason else "-",
    "gap": plan.solver.gap if plan else None,
}))
"""


def build(name: str, time_limit_s: float) -> Any:
    """A workload by name: ``model/world_size``, a public workload
    (``workloads.named_workload``: ``criteo-60`` is the multi-host reproducer) or
    ``colossal-10000``, the colossal model's tables repeated to 10,000."""
    model, world = name.split("/")
    options = {"time_limit_s": time_limit_s, "gap_limit": 0}
    if model.startswith("colossal-"):
        base = nvidia_tables("colossal")
        count = int(model.split("-")[1])
        tables = [dict(base[i % len(base)], name=f"t{i}") for i in range(count)]
        return workload_request(tables, int(world), options=options)
    return named_workload(model, int(world), options)


def _hog() -> None:
    while True:
        pass


def run(name: str, limit: float, hogs: int) -> dict[str, Any]:
    workers = [multiprocessing.Process(target=_hog, daemon=True) for _ in range(hogs)]
    for worker in workers:
        worker.start()
    try:
        completed = subprocess.run(
            [sys.executable, "-c", CHILD, name, str(limit)],
            capture_output=True,
            text=True,
            timeout=limit * 20 + 300,
            check=False,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
    finally:
        for worker in workers:
            worker.terminate()
            worker.join()
    if completed.returncode != 0:
        return {"error": completed.stderr[-300:]}
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    result["over_s"] = result["wall_s"] - limit
    result["within"] = result["wall_s"] <= limit + finish_slack_s(limit)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limits", default="1,5")
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    parser.add_argument("--json")
    args = parser.parse_args()
    limits = [float(x) for x in args.limits.split(",")]
    rows = []
    print("| workload | limit s | load | wall s | over s | within | status | stop | gap |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.workloads.split(","):
        for limit in limits:
            for hogs in (0, args.hogs):
                result = run(name, limit, hogs)
                rows.append({"workload": name, "limit_s": limit, "hogs": hogs, **result})
                load = f"{hogs} hogs" if hogs else "idle"
                if "error" in result:
                    print(f"| {name} | {limit:g} | {load} | error: {result['error']!r} |")
                    continue
                gap = "-" if result["gap"] is None else f"{result['gap']:.2%}"
                print(
                    f"| {name} | {limit:g} | {load} | {result['wall_s']:.2f} | "
                    f"{result['over_s']:+.2f} | {'yes' if result['within'] else '**no**'} | "
                    f"{result['status']} | {result['stop_reason']} | {gap} |",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
