"""Proven gaps on multi-host clusters: every public workload of up to 500 tables on 2, 4
and 16 hosts of 8 ranks, solved as a request gets solved by default; memory-tight draws
on request (``--workloads tight-60,tight-80,tight-95``: weights at 60 to 95% of the HBM,
two tables larger than a rank's HBM; ``workloads.named_workload``).

    .venv/bin/python -m benchmarks.gap_bench [--workloads tiny,small,medium,criteo,criteo-60]
        [--world-sizes 16,32,128] [--cost-models shardplan,torchrec-1.8]
        [--time-limit 10] [--gap-limit 0.02] [--no-deadline] [--json results.json]

Workloads are ``workloads.named_workload`` (80 GiB per rank; the NVIDIA models and
Criteo at batch 512, ``criteo-60`` at batch 4,096 with rowwise_adagrad). Each solve runs in
this process with the request's defaults unless told otherwise (``time_limit_s`` 10,
``gap_limit`` 0.02), so wall-clock limits apply: on a loaded machine a solve may stop
earlier than on an idle one (its ``stop`` says ``time_limit`` then); ``--no-deadline``
runs the deterministic work budgets alone, which every machine reproduces. Per solve: the plan's
cost, the best proven bound and its source, the reported gap, what ended the search, and
which stage found the plan (warm start, packing relaxation or CP-SAT).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.workloads import named_workload
from planner_service.solve.deadline import Deadline
from planner_service.solve.pipeline import solve

WORKLOADS = ("tiny", "small", "medium", "criteo", "criteo-60")
WORLD_SIZES = (16, 32, 128)  # 2, 4 and 16 hosts of 8
COST_MODELS = ("shardplan", "torchrec-1.8")


def run_one(name: str, world: int, cost_model: str, args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {"cost_model": cost_model, "time_limit_s": args.time_limit}
    if args.gap_limit is not None:
        options["gap_limit"] = args.gap_limit
    request = named_workload(name, world, options)
    start = time.perf_counter()
    outcome = solve(request, deadline=Deadline.never() if args.no_deadline else None)
    row: dict[str, Any] = {
        "workload": name,
        "world_size": world,
        "hosts": request.topology.num_hosts,
        "tables": len(request.tables),
        "cost_model": cost_model,
        "wall_s": round(time.perf_counter() - start, 2),
    }
    if outcome.plan is None:
        assert outcome.infeasibility is not None
        row["status"] = outcome.infeasibility.status.value
        return row
    report = outcome.plan.solver
    details = outcome.details
    row.update(
        cost=report.objective,
        bound=report.lower_bound,
        gap=report.gap,
        source=str(report.lower_bound_source),
        status=report.status.value,
        stop=report.stop_reason.value if report.stop_reason else "-",
        found_by=_found_by(report.objective, details),
        packing=details.get("packing", "not run"),
    )
    return row


def _found_by(objective: float, details: dict[str, object]) -> str:
    """The first stage whose plan costs what the final plan costs."""
    for stage, key in (("warm start", "warm_start_objective"), ("packing", "packing_objective")):
        value = details.get(key)
        if isinstance(value, float) and abs(value - objective) <= 1e-9 * max(1.0, objective):
            return stage
    return "cp-sat"


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | ranks (hosts) | tables | cost model | wall s | cost | bound | gap | "
        "bound source | plan from | stop |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for r in rows:
        head = (
            f"| {r['workload']} | {r['world_size']} ({r['hosts']}) | {r['tables']} | "
            f"{r['cost_model']} | {r['wall_s']:.2f} | "
        )
        if "cost" not in r:
            lines.append(head + f"{r['status']} | - | - | - | - | - |")
            continue
        gap = f"**{r['gap']:.2%}**" if r["gap"] > 0.02 else f"{r['gap']:.2%}"
        lines.append(
            head + f"{r['cost']:.4f} | {r['bound']:.4f} | {gap} | {r['source']} | "
            f"{r['found_by']} | {r['stop']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--world-sizes", default=",".join(map(str, WORLD_SIZES)))
    parser.add_argument("--cost-models", default=",".join(COST_MODELS))
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--gap-limit", type=float, help="default: the request's (0.02)")
    parser.add_argument(
        "--no-deadline",
        action="store_true",
        help="deterministic work budgets only, no wall clock (what an idle machine gets)",
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows = []
    for name in args.workloads.split(","):
        for world in map(int, args.world_sizes.split(",")):
            for cost_model in args.cost_models.split(","):
                row = run_one(name, world, cost_model, args)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print(render(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
