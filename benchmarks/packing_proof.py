"""Probe: a public workload's optimum, by solving its packing relaxation for long.

    PYTHONPATH=. .venv/bin/python -m benchmarks.packing_proof criteo-60/16/shardplan \\
        [--deterministic-s 40] [--workers 4]

The packing relaxation (``planner_service/solve/bounds/packing.py``) is a lower bound for
the request; when its optimum is proven and its solution, mapped back onto ranks, is a plan
costing the same, that plan is the request's optimum. The solver gives the relaxation one
worker and three runs of 10% of the time limit; this probe gives it ``--workers``
interleaved CP-SAT workers with presolve in one run of ``--deterministic-s`` deterministic
seconds, from the warm start, to tell what a remaining gap is made of: a plan above the
optimum, or a bound below it. A research harness, not part of the product.
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks.workloads import named_workload
from planner_service.solve.bounds import packing
from planner_service.solve.bounds.option_mix import option_mix_bound
from planner_service.solve.cpsat_runner import deterministic_solver
from planner_service.solve.deadline import Deadline
from planner_service.solve.prepare import prepare, warm_start
from planner_service.solve.problem import loads_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", help="name/world_size/cost_model, e.g. criteo/16/shardplan")
    parser.add_argument("--deterministic-s", type=float, default=40.0)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    name, world, cost_model = args.workload.split("/")
    request = named_workload(name, int(world), {"cost_model": cost_model})
    prepared = prepare(request, Deadline.never())
    problem, groups = prepared.problem, prepared.groups
    assert problem is not None and groups is not None
    hint = warm_start(prepared, Deadline.never())
    assert hint is not None
    upper = loads_of(problem, hint).objective
    mix = option_mix_bound(problem, groups, upper, time_limit_s=0.2, seed=0)
    known = max(prepared.lower_bound.value, mix.value if mix else 0.0)

    def solver(budget: float, seed: int):  # noqa: ANN202 - the relaxation's solver factory
        found = deterministic_solver(budget, seed)
        found.parameters.num_workers = args.workers
        return found

    packing.relaxation_solver = solver
    packing.PACKING_RUNS = (1.0,)
    start = time.perf_counter()
    result = packing.packing_bound(
        problem,
        groups,
        upper,
        time_limit_s=args.deterministic_s,
        seed=0,
        hint=hint,
        lower_bound=known,
    )
    assert result is not None
    plan = loads_of(problem, result.plan).objective if result.plan is not None else None
    bound = result.bound.value if result.bound is not None else None
    print(
        json.dumps(
            {
                "workload": args.workload,
                "warm_start": upper,
                "bound_before": known,
                "relaxation_bound": bound,
                "relaxation_plan": plan,
                "proven_optimal": plan is not None
                and bound is not None
                and plan - bound <= 1e-4 * plan,
                "deterministic_s": round(result.deterministic_time_s, 2),
                "wall_s": round(time.perf_counter() - start, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
