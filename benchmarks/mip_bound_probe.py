"""Probe: how much tighter is a MIP solver's bound than CP-SAT's on our placement model?

    PYTHONPATH=. .venv/bin/python -m benchmarks.mip_bound_probe tiny 8 --seconds 20

Builds the exact (unrestricted) CP-SAT model the solver builds for a workload, solves it
with CP-SAT (8 workers) and, since the model is a pure integer linear program, hands the
same rows to SCIP through ``pywraplp``. Prints both objectives and bounds. This is a
research harness for the open gap target of the solver issue, not part of the product.
"""

from __future__ import annotations

import argparse
import time

from ortools.linear_solver import pywraplp
from ortools.sat.python import cp_model

from benchmarks.workloads import nvidia_tables, workload_request
from planner_service.solve.cpsat.model import PlacementModel
from planner_service.solve.cpsat.search import makespan_upper
from planner_service.solve.cpsat_runner import COST_RESOLUTION
from planner_service.solve.deadline import Deadline
from planner_service.solve.prepare import prepare, warm_start
from planner_service.solve.problem import loads_of

_INF_BOUND = 2**62


def scip_solve(proto: cp_model.cp_model_pb2.CpModelProto, seconds: float) -> tuple[float, float]:
    """(objective, bound) of the CP-SAT model's rows solved as a MIP by SCIP."""
    solver = pywraplp.Solver.CreateSolver("SCIP")
    inf = solver.infinity()
    # Variable domains as intervals [first, last]: holes dropped, so at worst a relaxation.
    # (The proto's repeated fields do not take negative indices: copy them to lists.)
    domains = [list(v.domain) for v in proto.variables]
    xs = [solver.IntVar(float(d[0]), float(d[-1]), "") for d in domains]
    for constraint in proto.constraints:
        linear = constraint.linear
        domain = list(linear.domain)
        low, high = domain[0], domain[-1]
        row = solver.Constraint(
            float(low) if low > -_INF_BOUND else -inf, float(high) if high < _INF_BOUND else inf
        )
        for var, coefficient in zip(linear.vars, linear.coeffs, strict=True):
            row.SetCoefficient(xs[var], row.GetCoefficient(xs[var]) + coefficient)
    objective = solver.Objective()
    for var, coefficient in zip(proto.objective.vars, proto.objective.coeffs, strict=True):
        objective.SetCoefficient(xs[var], coefficient)
    objective.SetMinimization()
    solver.SetTimeLimit(int(seconds * 1000))
    solver.Solve()
    return objective.Value(), objective.BestBound()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("world_size", type=int)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    request = workload_request(
        nvidia_tables(args.model), args.world_size, options={"cost_model": "torchrec-1.8"}
    )
    prepared = prepare(request)
    problem, groups = prepared.problem, prepared.groups
    assert problem is not None and groups is not None
    hint = warm_start(prepared)
    assert hint is not None
    scale = COST_RESOLUTION / loads_of(problem, hint).objective

    def model() -> cp_model.CpModel:
        built = PlacementModel(problem, groups, hint, scale, False, Deadline.never())
        built.model.minimize(built.makespan(0, makespan_upper(problem, hint, scale)))
        built.add_hint(hint)
        return built.model

    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 8
    solver.parameters.max_time_in_seconds = args.seconds
    began = time.perf_counter()
    solver.solve(model())
    print(
        f"{args.model}/{args.world_size} cp-sat: objective {solver.objective_value / scale:.6g} "
        f"bound {solver.best_objective_bound / scale:.6g} ({time.perf_counter() - began:.1f} s)"
    )
    began = time.perf_counter()
    mip_model = model()  # keep it alive: its proto is a view into it
    value, bound = scip_solve(mip_model.proto, args.seconds)
    print(
        f"{args.model}/{args.world_size} scip:   objective {value / scale:.6g} "
        f"bound {bound / scale:.6g} ({time.perf_counter() - began:.1f} s)"
    )


if __name__ == "__main__":
    main()
