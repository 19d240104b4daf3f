"""Golden plans: the plan ids the planner makes for public workloads, recorded with the
planner version that made them.

A plan is looked up by request and planner version, so a change that alters the plan of
any request must bump the version (``version`` in pyproject.toml). tests/solve/test_golden.py
fails when a plan here changes under the same version; after a deliberate change, bump
the version and record the new plans:

    make golden        # = .venv/bin/python -m tests.solve.golden --write
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.workloads import criteo_tables, nvidia_tables, workload_request
from planner_service import PLANNER_VERSION
from planner_service.plan.types import PlanRequest
from planner_service.solve.deadline import Deadline
from planner_service.solve.pipeline import solve

GOLDEN = Path(__file__).with_name("golden_plans.json")
# Public workloads that solve in about a second each: one host and several, both cost
# models, exact and default gap limits.
WORKLOADS = {
    "tiny/8": lambda: workload_request(nvidia_tables("tiny"), 8),
    "small/16": lambda: workload_request(nvidia_tables("small"), 16),
    # CP-SAT overshoots its deterministic budget 5x here: a plan that stays put under load.
    "large/8": lambda: workload_request(nvidia_tables("large"), 8),
    "criteo/8": lambda: workload_request(criteo_tables(), 8),
    "criteo/32-exact": lambda: workload_request(criteo_tables(), 32, options={"gap_limit": 0}),
    "criteo/16-torchrec": lambda: workload_request(
        criteo_tables(), 16, options={"cost_model": "torchrec-1.8"}
    ),
}


def plan_id(request: PlanRequest) -> str:
    """The plan the deterministic budget gives (no wall clock: a loaded machine must not
    change a golden plan)."""
    outcome = solve(request, deadline=Deadline.never())
    assert outcome.plan is not None, outcome.infeasibility
    return outcome.plan.plan_id


def record() -> dict[str, object]:
    return {
        "planner_version": PLANNER_VERSION,
        "plans": {name: plan_id(build()) for name, build in WORKLOADS.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="record the golden plans")
    parser.add_argument("--write", action="store_true", help=f"write {GOLDEN.name}")
    args = parser.parse_args()
    text = json.dumps(record(), indent=2, sort_keys=True) + "\n"
    if args.write:
        GOLDEN.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
