"""What the solver's tests measure plans against: exhaustive search over every option and
placement of tiny instances, and the small constructions the tests share."""

from __future__ import annotations

import itertools
import math

from hypothesis import strategies as st

from planner_service.costs.enumerate import enumerate_options, fit_options
from planner_service.costs.options import DeviceClasses, Placement
from planner_service.plan.capacity import usable_capacity
from planner_service.plan.types import (
    ShardingType,
)
from planner_service.solve.pipeline import solve
from planner_service.solve.problem import Choice, Problem, loads_of, without_equivalents
from planner_service.validate.validator import validate_plan
from tests.support.builders import request, table

GIB = 2**30


def solved(req):
    outcome = solve(req)
    assert outcome.plan is not None, outcome.infeasibility
    assert validate_plan(req, outcome.plan) == []
    return outcome.plan


def problem_of(req):
    from planner_service.solve.problem import group_tables

    fitted = fit_options(req, enumerate_options(req))
    tables = without_equivalents(fitted.tables, req)
    problem = Problem(req, tables, fitted.capacities, DeviceClasses.of(req.topology))
    return problem, group_tables(problem)


def plan_from(problem, choices, req):
    """The plan of ``choices``, with 0 as its (trivial) lower bound."""
    from planner_service.plan.types import BoundSource
    from planner_service.solve.bounds.simple import LowerBound
    from planner_service.solve.emit import build_plan

    loads = loads_of(problem, choices)
    return build_plan(problem, choices, loads, LowerBound(0.0, BoundSource.WORK))


def costing(
    units: list[float],
    rows: list[int],
    sharding_type: str = "table_wise",
    topology: dict | None = None,
) -> tuple[list[dict], float]:
    """Tables whose ``sharding_type`` shards (fused kernel; on ``topology``, two ranks by
    default) each cost ``units[i]`` times a reference table's (the cost grows linearly with
    the pooling factor and does not depend on rows), and the reference cost."""
    topology = topology or {"world_size": 2}

    def cost(factor: float) -> float:
        req = request([table("t", dim=128, pooling_factors=[factor])], topology=topology)
        option = next(
            o
            for o in enumerate_options(req)[0].options
            if o.sharding_type.value == sharding_type and o.compute_kernel.value == "fused"
        )
        return option.shards[0].perf[0].total

    slope = cost(11.0) - cost(10.0)
    base = cost(10.0) - 10 * slope
    unit = cost(10.0)
    tables = [
        table(f"t{i}", rows=r, dim=128, pooling_factors=[(u * unit - base) / slope])
        for i, (u, r) in enumerate(zip(units, rows, strict=True))
    ]
    return tables, unit


def brute_force_optimum(req, most: int | None = None) -> float:
    """Try every option and every placement of every table; the best max-rank cost (inf if
    nothing fits, or if there are more than ``most`` combinations to try)."""
    problem, _ = problem_of(req)
    per_table = [list(placements(problem, t)) for t in range(len(problem.tables))]
    if most is not None and math.prod(map(len, per_table)) > most:
        return float("inf")
    best = float("inf")
    for combination in itertools.product(*per_table):
        loads = loads_of(problem, list(combination))
        if loads.fits(problem):
            best = min(best, loads.objective)
    return best


def brute_force_finds_a_plan(req, most: int = 20_000) -> bool | None:
    """Whether some option and placement of every table fits every rank, trying the
    options as enumerated (not fitted, not deduplicated) and every placement the pins allow
    (requests without colocate or separate groups); None when there are more than ``most``
    combinations to try."""
    problem = Problem(
        req,
        enumerate_options(req),
        usable_capacity(req.topology, req.constraints),
        DeviceClasses.of(req.topology),
    )
    per_table = [list(placements(problem, t)) for t in range(len(problem.tables))]
    if math.prod(map(len, per_table)) > most:
        return None
    combinations = itertools.product(*per_table)
    return any(loads_of(problem, list(choices)).fits(problem) for choices in combinations)


def placements(problem: Problem, t: int):
    allowed = set(problem.allowed[t])
    for choice in every_placement(problem, t):
        if allowed.issuperset(choice.ranks):
            yield choice


def every_placement(problem: Problem, t: int):
    world, topology = problem.world_size, problem.topology
    for index, option in enumerate(problem.tables[t].options):
        k = len(option.shards)
        if option.placement is Placement.FIXED:
            yield Choice(index, tuple(range(world)))
        elif option.sharding_type is ShardingType.TABLE_ROW_WISE:
            for host in range(topology.num_hosts):
                yield Choice(index, tuple(topology.host_ranks(host)))
        elif option.sharding_type is ShardingType.TABLE_COLUMN_WISE:
            for host in range(topology.num_hosts):
                for ranks in itertools.product(topology.host_ranks(host), repeat=k):
                    yield Choice(index, ranks)
        else:
            for ranks in itertools.product(range(world), repeat=k):
                yield Choice(index, ranks)


# A table drawn for property tests: any shape, pooling and optimizer the enumerator handles.
table_strategy = st.builds(
    lambda i, rows, dim, factor, optimizer: table(
        f"t{i}", rows=rows, dim=dim, pooling_factors=[factor], optimizer=optimizer
    ),
    st.integers(0, 10**6),
    st.integers(1, 2_000_000),
    st.sampled_from([4, 8, 16, 32, 64, 128, 256]),
    st.sampled_from([0.5, 1.0, 3.0, 20.0]),
    st.sampled_from(["sgd", "rowwise_adagrad", "adam"]),
)
