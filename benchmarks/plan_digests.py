"""The plan (or infeasibility) every public workload gets, as one digest per line.

    .venv/bin/python -m benchmarks.plan_digests > after.jsonl
    .venv/bin/python -m benchmarks.plan_digests --compare before.jsonl

A refactoring that must not change behaviour runs this before and after: every NVIDIA
synthetic model and Criteo on 8, 32 and 128 ranks under both cost models, solved with the
deterministic work budgets only (no wall clock, so a loaded machine gives the same bytes).
A plan's digest is its ``plan_id`` (the SHA-256 of its canonical bytes); an infeasible
request's is the SHA-256 of its explanation. About 40 s on 2 cores. ``--expanded``: the
``plan_id`` of the plan written with shard lists (``plan.compact.expand_plan``, schema
1.x), what planners before schema 2.0 wrote: a change of the written form alone keeps it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from benchmarks.workloads import NVIDIA_MODELS, criteo_tables, nvidia_tables, workload_request
from planner_service.plan.compact import expand_plan
from planner_service.plan.types import PlanRequest
from planner_service.solve.deadline import Deadline
from planner_service.solve.pipeline import solve

WORLD_SIZES = (8, 32, 128)
COST_MODELS = ("shardplan", "torchrec-1.8")


def workloads() -> Iterator[tuple[str, Callable[[], PlanRequest]]]:
    models = [(model, lambda m=model: nvidia_tables(m)) for model in NVIDIA_MODELS]
    for model, tables in [*models, ("criteo", criteo_tables)]:
        for world in WORLD_SIZES:
            for cost_model in COST_MODELS:
                yield (
                    f"{model}/{world}/{cost_model}",
                    (
                        lambda t=tables, w=world, c=cost_model: workload_request(
                            t(), w, options={"cost_model": c}
                        )
                    ),
                )


def digest(request: PlanRequest, expanded: bool = False) -> str:
    outcome = solve(request, deadline=Deadline.never())
    if outcome.plan is not None:
        return (expand_plan(outcome.plan) if expanded else outcome.plan).plan_id
    assert outcome.infeasibility is not None
    text = outcome.infeasibility.model_dump_json().encode()
    return "infeasible:" + hashlib.sha256(text).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", type=Path, help="a previous run's output to compare with")
    parser.add_argument("--expanded", action="store_true", help="ids of plans as shard lists")
    args = parser.parse_args()
    before = {}
    if args.compare:
        lines = args.compare.read_text().splitlines()
        before = {row["workload"]: row["id"] for row in map(json.loads, lines)}
    changed = 0
    for name, build in workloads():
        start = time.perf_counter()
        ident = digest(build(), args.expanded)
        row = {"workload": name, "id": ident, "s": round(time.perf_counter() - start, 1)}
        if args.compare:
            row["same"] = before.get(name) == ident
            changed += not row["same"]
        print(json.dumps(row), flush=True)
    if args.compare:
        print(f"{changed} of {len(before)} workloads changed", file=sys.stderr)
        sys.exit(1 if changed else 0)


if __name__ == "__main__":
    main()
