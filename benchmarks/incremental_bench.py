"""Incremental re-planning against planning from scratch, when a model gains 5% tables.

    .venv/bin/python -m benchmarks.incremental_bench [--workloads medium/32,large/128,criteo/16]
        [--grow 0.05] [--time-limit 10] [--json results.json]

For each workload: plan the public tables (the old plan), add ``--grow`` of that many new
tables drawn from the workload's own tables (rows, width and pooling factor of a table
picked at random, seed 0, under a new name), then plan the grown model four ways: from
scratch; re-planned from the old plan with no limits (the fastest plan found, ties to
fewer moves); with ``options.max_moved_bytes`` 0 (every old table stays), 10% and 50% of
what the plan from scratch moves; and with ``options.move_cost_ms_per_gib`` 0.001. Each
reports the bytes moved from the old plan (``plan.diff``, weights and optimizer state, as
``shardplan diff --request`` counts them), the max-rank cost (the objective, ms), the
reported gap and the solve's wall time.
Topology: 8 ranks per host, 80 GiB HBM, batch 512 (``benchmarks/workloads.py``).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from typing import Any

from benchmarks.workloads import criteo_tables, nvidia_tables, workload_request
from planner_service.plan.canonical import canonical_bytes
from planner_service.plan.diff import diff_plans
from planner_service.plan.types import PlanRequest, ShardingPlan
from planner_service.plan.units import GiB
from planner_service.solve.pipeline import solve

WORKLOADS: dict[str, tuple[Callable[[], list[dict[str, Any]]], int]] = {
    "medium/32": (lambda: nvidia_tables("medium"), 32),
    "large/128": (lambda: nvidia_tables("large"), 128),
    "criteo/16": (criteo_tables, 16),  # 2 hosts of 8
}
MOVE_COST_MS_PER_GIB = 0.001
CAP_SHARES = (0.1, 0.5)  # of what the plan from scratch moves


def variants(scratch_moved: int) -> dict[str, dict[str, Any]]:
    """The incremental re-plans, by name: their options beside ``previous_plan``."""
    return {
        "incremental": {},
        "incremental, max_moved_bytes 0": {"max_moved_bytes": 0},
        **{
            f"incremental, max_moved_bytes {share:.0%} of scratch's": {
                "max_moved_bytes": int(scratch_moved * share)
            }
            for share in CAP_SHARES
        },
        f"incremental, move_cost {MOVE_COST_MS_PER_GIB} ms/GiB": {
            "move_cost_ms_per_gib": MOVE_COST_MS_PER_GIB
        },
    }


def grown(tables: list[dict[str, Any]], fraction: float, seed: int = 0) -> list[dict[str, Any]]:
    """``tables`` plus ``fraction`` as many new ones, each a copy of a random table under a
    new name (the same distribution of rows, widths and pooling factors)."""
    rng = random.Random(seed)
    count = max(1, round(len(tables) * fraction))
    new = [{**rng.choice(tables), "name": f"new_{i}"} for i in range(count)]
    for table in new:
        table.pop("feature_names", None)
    return tables + new


def request_for(
    tables: list[dict[str, Any]], world_size: int, time_limit_s: float, **options: Any
) -> PlanRequest:
    return workload_request(
        tables,
        world_size,
        options={"time_limit_s": time_limit_s, **options},
    )


def run(name: str, fraction: float, time_limit_s: float) -> list[dict[str, Any]]:
    build, world_size = WORKLOADS[name]
    tables = build()
    old_outcome = solve(request_for(tables, world_size, time_limit_s))
    old = old_outcome.plan
    assert old is not None, old_outcome.infeasibility
    new_tables = grown(tables, fraction)
    previous = json.loads(canonical_bytes(old))
    label = f"{len(tables)} + {len(new_tables) - len(tables)}"
    scratch = _row(
        name, label, "from scratch", old, request_for(new_tables, world_size, time_limit_s)
    )
    rows = [scratch]
    for variant, options in variants(int(scratch["moved_gib"] * GiB)).items():
        request = request_for(
            new_tables, world_size, time_limit_s, previous_plan=previous, **options
        )
        rows.append(_row(name, label, variant, old, request))
    return rows


def _row(
    name: str, label: str, variant: str, old: ShardingPlan, request: PlanRequest
) -> dict[str, Any]:
    start = time.perf_counter()
    outcome = solve(request)
    wall_s = time.perf_counter() - start
    row: dict[str, Any] = {
        "workload": name,
        "tables": label,
        "variant": variant,
        "wall_s": round(wall_s, 2),
    }
    plan = outcome.plan
    if plan is None:
        assert outcome.infeasibility is not None
        row["no_plan"] = outcome.infeasibility.render()
    else:
        row.update(_measure(old, plan, request))
    print(json.dumps(row), flush=True)
    return row


def _measure(old: ShardingPlan, plan: ShardingPlan, request: PlanRequest) -> dict[str, Any]:
    diff = diff_plans(old, plan, request)
    if plan.migration is not None:  # the plan's own report is the diff's number
        assert plan.migration.moved_bytes == diff.moved_bytes
    return {
        "moved_gib": round(diff.moved_bytes / GiB, 3),
        "tables_moved": sum(1 for t in diff.tables if t.moved_bytes),
        "max_rank_ms": round(plan.solver.objective, 4),
        "gap": round(plan.solver.gap, 4),
        "stop_reason": plan.solver.stop_reason.value if plan.solver.stop_reason else None,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | tables | plan | moved GiB | tables moved | max-rank cost ms | gap | wall s |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        if "no_plan" in row:
            cells = ["no plan", "", "", ""]
        else:
            cells = [
                f"{row['moved_gib']:.2f}",
                str(row["tables_moved"]),
                f"{row['max_rank_ms']:.4f}",
                f"{row['gap']:.2%}",
            ]
        lines.append(
            f"| {row['workload']} | {row['tables']} | {row['variant']} | "
            + " | ".join(cells)
            + f" | {row['wall_s']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--grow", type=float, default=0.05, help="new tables, as a fraction")
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    rows = []
    for name in args.workloads.split(","):
        rows += run(name, args.grow, args.time_limit)
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
