"""The solver: valid plans, true optima on tiny instances, bounds, constraints, determinism."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner_service.costs.enumerate import enumerate_options, fit_options
from planner_service.costs.options import DeviceClasses, Placement
from planner_service.plan.capacity import usable_capacity
from planner_service.plan.types import (
    InfeasibilityCode,
    PlanRequest,
    ShardingType,
    SolverStatus,
)
from planner_service.solve.bounds.lp import LinearRelaxation, RelaxationInfeasible
from planner_service.solve.bounds.option_mix import option_mix_bound
from planner_service.solve.bounds.packing import packing_bound
from planner_service.solve.bounds.simple import simple_bounds
from planner_service.solve.cpsat import search as cpsat
from planner_service.solve.deadline import Deadline
from planner_service.solve.pipeline import solve
from planner_service.solve.problem import Choice, Problem, loads_of, without_equivalents
from planner_service.validate.validator import validate_plan
from tests.builders import request, table

GIB = 2**30


def _solved(req):
    outcome = solve(req)
    assert outcome.plan is not None, outcome.infeasibility
    assert validate_plan(req, outcome.plan) == []
    return outcome.plan


# --------------------------------------------------------------------------- properties

_table = st.builds(
    lambda i, rows, dim, factor, optimizer: table(
        f"t{i}", rows=rows, dim=dim, pooling_factors=[factor], optimizer=optimizer
    ),
    st.integers(0, 10**6),
    st.integers(1, 2_000_000),
    st.sampled_from([4, 8, 16, 32, 64, 128, 256]),
    st.sampled_from([0.5, 1.0, 3.0, 20.0]),
    st.sampled_from(["sgd", "rowwise_adagrad", "adam"]),
)


@st.composite
def _requests(draw):
    hosts, local = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    tables = draw(st.lists(_table, min_size=1, max_size=6, unique_by=lambda t: t["name"]))
    constraints = {}
    for t in tables:
        if draw(st.booleans()):
            constraints[t["name"]] = {
                "sharding_types": draw(
                    st.lists(
                        st.sampled_from(
                            [
                                "table_wise",
                                "column_wise",
                                "row_wise",
                                "data_parallel",
                                "table_row_wise",
                                "table_column_wise",
                            ]
                        ),
                        min_size=1,
                        max_size=3,
                        unique=True,
                    )
                ),
            }
    return request(
        tables,
        world_size=hosts * local,
        topology={"local_world_size": local, "hbm_bytes": draw(st.sampled_from([GIB, 8 * GIB]))},
        constraints={"tables": constraints},
        options={
            "time_limit_s": 0.5,
            "cost_model": draw(st.sampled_from(["shardplan", "torchrec-1.8"])),
        },
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_requests())
def test_every_plan_is_valid_and_above_its_bound(req):
    outcome = solve(req)
    if outcome.plan is None:  # small HBM can make a random request impossible: is it?
        assert outcome.infeasibility is not None
        assert outcome.infeasibility.reasons
        assert _brute_force_finds_a_plan(req) in (False, None), outcome.infeasibility.render()
        return
    plan = outcome.plan
    assert validate_plan(req, plan) == []
    report = plan.solver
    assert report.objective >= report.lower_bound
    assert report.status in (SolverStatus.OPTIMAL, SolverStatus.FEASIBLE)
    assert report.objective == pytest.approx(max(s.perf.total for s in plan.rank_stats), rel=1e-12)
    assert report.critical_path >= 0


# --------------------------------------------------------------------------- brute force


def _brute_force_optimum(req, most: int | None = None) -> float:
    """Try every option and every placement of every table; the best max-rank cost (inf if
    nothing fits, or if there are more than ``most`` combinations to try)."""
    problem, _ = _problem(req)
    per_table = [list(_placements(problem, t)) for t in range(len(problem.tables))]
    if most is not None and math.prod(map(len, per_table)) > most:
        return float("inf")
    best = float("inf")
    for combination in itertools.product(*per_table):
        loads = loads_of(problem, list(combination))
        if loads.fits(problem):
            best = min(best, loads.objective)
    return best


def _brute_force_finds_a_plan(req, most: int = 20_000) -> bool | None:
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
    per_table = [list(_placements(problem, t)) for t in range(len(problem.tables))]
    if math.prod(map(len, per_table)) > most:
        return None
    combinations = itertools.product(*per_table)
    return any(loads_of(problem, list(choices)).fits(problem) for choices in combinations)


def _placements(problem: Problem, t: int):
    allowed = set(problem.allowed[t])
    for choice in _every_placement(problem, t):
        if allowed.issuperset(choice.ranks):
            yield choice


def _every_placement(problem: Problem, t: int):
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


@pytest.mark.parametrize(
    ("tables", "world", "local", "hbm"),
    [
        (
            [
                table("a", rows=1000, dim=256),
                table("b", rows=50, dim=64),
                table("c", rows=10**6, dim=16, pooling_factors=[30.0]),
            ],
            2,
            2,
            8 * GIB,
        ),
        (
            [
                table("a", rows=10**5, dim=128),
                table("b", rows=10**5, dim=128),
                table("c", rows=10**5, dim=128),
                table("d", rows=20, dim=8),
            ],
            3,
            3,
            8 * GIB,
        ),
        (
            [
                table("a", rows=3 * 10**6, dim=64, pooling_factors=[5.0]),
                table("b", rows=2 * 10**6, dim=128),
            ],
            2,
            1,
            2 * GIB,
        ),  # memory pushes to UVM
        (
            [
                table("a", rows=8 * 10**6, dim=64),
                table("b", rows=4 * 10**6, dim=64, pooling_factors=[10.0]),
            ],
            2,
            2,
            3 * GIB,
        ),
    ],
)
def test_solver_finds_the_true_optimum_on_tiny_instances(tables, world, local, hbm):
    req = request(
        tables,
        world_size=world,
        topology={"local_world_size": local, "hbm_bytes": hbm},
        options={"time_limit_s": 5, "gap_limit": 0},
    )
    optimum = _brute_force_optimum(req)
    plan = _solved(req)
    assert plan.solver.objective == pytest.approx(optimum, rel=1e-4)
    assert plan.solver.objective >= optimum * (1 - 1e-12)
    assert plan.solver.status is SolverStatus.OPTIMAL


# --------------------------------------------------------------------------- packing bound


def test_packing_bound_sees_whole_tables_that_the_lp_spreads():
    """Three equal table-wise tables and a row-wise one on two ranks: some rank holds two
    whole tables on top of its row-wise shard. The work and LP bounds spread 1.5 tables per
    rank; the packing bound proves 2."""
    tables = [table(f"t{i}", rows=10**5, dim=128) for i in range(3)]
    kinds = {t["name"]: {"sharding_types": ["table_wise"]} for t in tables}
    tables.append(table("r", rows=10**6, dim=64))
    kinds["r"] = {"sharding_types": ["row_wise"]}
    req = request(
        tables,
        world_size=2,
        constraints={"tables": {n: {**k, "compute_kernels": ["fused"]} for n, k in kinds.items()}},
    )
    problem, groups = _problem(req)
    by_name = {entry.table.name: entry for entry in problem.tables}
    whole = problem.costs(by_name["t0"].options[0]).work
    row_shards = problem.costs(by_name["r"].options[0]).fixed_cost
    optimum = _brute_force_optimum(req)
    assert optimum == pytest.approx(2 * whole + row_shards.max(), rel=1e-12)
    spread = simple_bounds(problem) + [LinearRelaxation(problem, groups).solve().bound]
    assert max(b.value for b in spread) < 0.9 * optimum

    packing = packing_bound(problem, groups, optimum, time_limit_s=1, seed=0)
    assert packing is not None and packing.bound is not None
    assert packing.bound.source == "packing"
    assert packing.bound.value <= optimum
    assert packing.bound.value == pytest.approx(2 * whole + row_shards.min(), rel=1e-6)


def test_packing_bound_on_mixed_ranks_stays_below_the_optimum():
    """Rank 1 is slow: the row-wise shard there costs more, and the whole table goes to rank
    0. Charging every rank the dearest row-wise shard would overshoot the optimum."""
    req = request(
        [table("r", rows=10**6, dim=64), table("t", rows=10**5, dim=128)],
        world_size=2,
        topology={"rank_overrides": [{"rank": 1, "hbm_bw_bytes_per_s": 897 * GIB / 8}]},
        constraints={
            "tables": {
                "r": {"sharding_types": ["row_wise"], "compute_kernels": ["fused"]},
                "t": {"sharding_types": ["table_wise"], "compute_kernels": ["fused"]},
            }
        },
    )
    optimum = _brute_force_optimum(req)
    problem, groups = _problem(req)
    packing = packing_bound(problem, groups, 2 * optimum, time_limit_s=1, seed=0)
    assert packing is not None and packing.bound is not None
    assert packing.bound.value <= optimum


def test_option_mix_bound_sees_that_a_table_is_whole_or_everywhere():
    """A hot table either sits whole on one rank (cheaper in total) or row-wise on both
    (dearer in total, lighter per rank), beside three small tables on two ranks. The LP
    takes a fraction of each and stays 3.5% short; the option-mix relaxation takes one or
    the other, and proves the optimum: the hot table whole, the small ones on the other
    rank."""
    tables = [table("hot", rows=10**6, dim=128, pooling_factors=[8.0])]
    tables += [table(f"s{i}", rows=10**5, dim=128) for i in range(3)]
    constraints = {t["name"]: {"sharding_types": ["table_wise"]} for t in tables}
    constraints["hot"] = {"sharding_types": ["table_wise", "row_wise"]}
    for kinds in constraints.values():
        kinds["compute_kernels"] = ["fused"]
    req = request(tables, world_size=2, constraints={"tables": constraints})
    problem, groups = _problem(req)
    optimum = _brute_force_optimum(req)
    hot = next(entry for entry in problem.tables if entry.table.name == "hot")
    assert optimum == pytest.approx(problem.costs(hot.options[0]).work, rel=1e-12)
    assert LinearRelaxation(problem, groups).solve().bound.value < 0.97 * optimum

    bound = option_mix_bound(problem, groups, 2 * optimum, time_limit_s=1, seed=0)
    assert bound is not None and bound.source == "option_mix"
    assert bound.value <= optimum
    assert bound.value == pytest.approx(optimum, rel=1e-6)


def test_option_mix_bound_counts_the_memory_of_options_on_every_rank():
    """Three row-wise tables on two ranks whose HBM holds one table's shares: two must go
    to UVM. Row-wise shards are no items, so only the total-memory rows keep the option mix
    from putting all three in HBM; with them it proves the optimum."""
    tables = [table(f"t{i}", rows=10**6, dim=128, pooling_factors=[4.0]) for i in range(3)]
    only_rw = {
        t["name"]: {"sharding_types": ["row_wise"], "compute_kernels": ["fused", "fused_uvm"]}
        for t in tables
    }
    req = request(
        tables,
        world_size=2,
        topology={"hbm_bytes": 400 * 2**20},
        constraints={"tables": only_rw},
    )
    problem, groups = _problem(req)
    optimum = _brute_force_optimum(req)
    fused = [
        problem.costs(o).work
        for o in problem.tables[0].options
        if o.compute_kernel.value == "fused"
    ]
    assert optimum > 1.5 * (3 * fused[0] / 2)  # all in HBM would cost far less

    bound = option_mix_bound(problem, groups, 2 * optimum, time_limit_s=1, seed=0)
    assert bound is not None and bound.source == "option_mix"
    assert bound.value <= optimum
    assert bound.value == pytest.approx(optimum, rel=1e-6)


def _costing(
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


def test_packing_keeps_apart_tables_that_cannot_share_a_rank(monkeypatch):
    """Tables of 1, 1, 1.5 and 0.5 units on two ranks pair best as {1, 1} and {1.5, 0.5},
    but the two 1-unit tables each fill most of a rank's HBM. Items carry their memory in
    the relaxation, so its bound is the true optimum (2.5), not 2, and its plan fits."""
    tables, _ = _costing([1, 1, 1.5, 0.5], [10**7, 10**7, 100, 100])
    only_tw = {
        t["name"]: {"sharding_types": ["table_wise"], "compute_kernels": ["fused"]} for t in tables
    }
    req = request(
        tables,
        world_size=2,
        topology={"hbm_bytes": 10 * GIB},
        constraints={"tables": only_tw},
    )
    problem, groups = _problem(req)
    unit = problem.costs(problem.tables[0].options[0]).work
    big = int(problem.costs(problem.tables[0].options[0]).hbm[0])
    assert big < problem.hbm_cap[0] < 2 * big
    optimum = _brute_force_optimum(req)
    assert optimum == pytest.approx(2.5 * unit, rel=1e-6)

    packing = packing_bound(problem, groups, 3 * unit, time_limit_s=1, seed=0)
    assert packing is not None and packing.bound is not None and packing.plan is not None
    assert packing.bound.value == pytest.approx(optimum, rel=1e-6)
    assert packing.bound.value <= optimum
    loads = loads_of(problem, packing.plan)
    assert loads.fits(problem) and loads.objective == pytest.approx(optimum, rel=1e-12)

    from planner_service.solve.bounds.relaxed import MemoryWeights

    # Blind to memory, every item weighing nothing, the relaxation pairs the big two.
    monkeypatch.setattr(MemoryWeights, "weight", staticmethod(lambda size, capacity: 0))
    blind = packing_bound(problem, groups, 3 * unit, time_limit_s=1, seed=0)
    assert blind is not None and blind.bound is not None
    assert blind.bound.value == pytest.approx(2 * unit, rel=1e-6)
    assert blind.plan is None  # {1, 1} on one rank overflows its HBM


@given(
    st.integers(1, 10**12).flatmap(
        lambda capacity: st.tuples(
            st.just(capacity), st.lists(st.integers(0, capacity), min_size=1, max_size=12)
        )
    )
)
def test_items_that_fit_a_rank_weigh_at_most_its_memory_units(case):
    """The relaxation's memory weights never exclude a rank's real contents, and two items
    over half a rank always exceed it."""
    from planner_service.solve.bounds.relaxed import MEMORY_UNITS, MemoryWeights

    capacity, sizes = case
    weights = [MemoryWeights.weight(size, capacity) for size in sizes]
    if sum(sizes) <= capacity:
        assert sum(weights) <= MEMORY_UNITS
    over_half = [w for size, w in zip(sizes, weights, strict=True) if 2 * size > capacity]
    if len(over_half) >= 2:
        assert sum(over_half) > MEMORY_UNITS


@st.composite
def _tiny_requests(draw):
    hosts, local = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    tables = draw(st.lists(_table, min_size=1, max_size=3, unique_by=lambda t: t["name"]))
    kinds = ["table_wise", "row_wise", "data_parallel", "table_row_wise", "column_wise"]
    constraints = {
        t["name"]: {
            "sharding_types": draw(st.lists(st.sampled_from(kinds), min_size=1, unique=True))
        }
        for t in tables
    }
    topology = {"local_world_size": local, "hbm_bytes": draw(st.sampled_from([GIB, 8 * GIB]))}
    if draw(st.booleans()):
        topology["rank_overrides"] = [{"rank": 0, "hbm_bw_bytes_per_s": 200 * GIB}]
    return request(
        tables,
        world_size=hosts * local,
        topology=topology,
        constraints={"tables": constraints},
        options={"cost_model": draw(st.sampled_from(["shardplan", "torchrec-1.8"]))},
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_tiny_requests())
def test_relaxations_never_exceed_the_true_optimum(req):
    """The LP, the option-mix and the packing relaxations; the last two given an upper
    bound well above the optimum, so their cap cannot hide an overshoot."""
    optimum = _brute_force_optimum(req, most=20_000)
    assume(math.isfinite(optimum))
    problem, groups = _problem(req)
    assert LinearRelaxation(problem, groups).solve().bound.value <= optimum * (1 + 1e-9)
    mix = option_mix_bound(problem, groups, 2 * optimum, time_limit_s=1, seed=0)
    assert mix is None or mix.value <= optimum * (1 + 1e-12)
    packing = packing_bound(problem, groups, 2 * optimum, time_limit_s=1, seed=0)
    if packing is None:
        return
    assert packing.bound is None or packing.bound.value <= optimum * (1 + 1e-12)
    if packing.plan is not None:  # the relaxation's solution, mapped back onto ranks
        loads = loads_of(problem, packing.plan)
        assert loads.fits(problem)
        assert loads.objective >= optimum * (1 - 1e-12)
        assert validate_plan(req, _plan_from(problem, packing.plan, req)) == []


@st.composite
def _one_shape_requests(draw):
    """Tables of one dim and pooling factor with different row counts: their options cost
    the same but on every rank (data-parallel grows with rows), so the packing relaxation
    takes them as one class; on 1 or 2 hosts."""
    hosts, local = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    dim, factor = draw(st.sampled_from([4, 64])), draw(st.sampled_from([1.0, 20.0]))
    rows = draw(st.lists(st.integers(1, 3_000_000), min_size=2, max_size=4))
    kinds = draw(
        st.lists(
            st.sampled_from(["table_wise", "data_parallel", "table_row_wise", "row_wise"]),
            min_size=1,
            unique=True,
        )
    )
    return request(
        [table(f"t{i}", rows=n, dim=dim, pooling_factors=[factor]) for i, n in enumerate(rows)],
        world_size=hosts * local,
        topology={"local_world_size": local, "hbm_bytes": draw(st.sampled_from([GIB, 8 * GIB]))},
        constraints={"tables": {f"t{i}": {"sharding_types": kinds} for i in range(len(rows))}},
        options={"cost_model": draw(st.sampled_from(["shardplan", "torchrec-1.8"]))},
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_one_shape_requests())
def test_packing_classes_never_exceed_the_true_optimum(req):
    """Tables alike but for what they cost on every rank share a class in the packing
    relaxation (its every-rank load the least any k of them leave there): its bound stays
    at or below the brute-force optimum, and its plan is a valid plan."""
    optimum = _brute_force_optimum(req, most=20_000)
    assume(math.isfinite(optimum))
    problem, groups = _problem(req)
    packing = packing_bound(problem, groups, 2 * optimum, time_limit_s=1, seed=0)
    assume(packing is not None)
    assert packing.bound is None or packing.bound.value <= optimum * (1 + 1e-12)
    if packing.plan is not None:
        loads = loads_of(problem, packing.plan)
        assert loads.fits(problem)
        assert loads.objective >= optimum * (1 - 1e-12)
        assert validate_plan(req, _plan_from(problem, packing.plan, req)) == []


def test_packing_class_leaves_the_costliest_tables_off_every_rank():
    """Three tables of one shape on 2 ranks, data-parallel or table-wise: two go
    table-wise, one per rank, and the relaxation (one class) leaves on every rank the one
    whose data-parallel copy costs least; it proves that plan optimal."""
    req = request(
        [
            table("small", rows=10, dim=64),
            table("mid", rows=5_000, dim=64),
            table("big", rows=3_000_000, dim=64),
        ],
        world_size=2,
        topology={"local_world_size": 2, "hbm_bytes": 8 * GIB},
        constraints={
            "tables": {
                name: {"sharding_types": ["table_wise", "data_parallel"]}
                for name in ("small", "mid", "big")
            }
        },
    )
    optimum = _brute_force_optimum(req)
    problem, groups = _problem(req)
    packing = packing_bound(problem, groups, 2 * optimum, time_limit_s=1, seed=0)
    assert packing is not None and packing.bound is not None and packing.plan is not None
    assert packing.bound.value == pytest.approx(optimum, rel=1e-5)
    kinds = {
        entry.table.name: entry.options[choice.option].sharding_type
        for entry, choice in zip(problem.tables, packing.plan, strict=True)
    }
    assert loads_of(problem, packing.plan).objective == pytest.approx(optimum, rel=1e-9)
    assert kinds == {
        "small": ShardingType.DATA_PARALLEL,
        "mid": ShardingType.TABLE_WISE,
        "big": ShardingType.TABLE_WISE,
    }


# --------------------------------------------------------------------------- constraints


def test_colocate_separate_and_pins_are_honoured():
    req = request(
        [table("a"), table("b"), table("c"), table("d"), table("e", rows=10**6, dim=64)],
        world_size=4,
        constraints={
            "tables": {
                "e": {"ranks": [3]},
                "c": {"sharding_types": ["table_wise"]},
                "d": {"sharding_types": ["table_wise"]},
            },
            "colocate": [["a", "b"]],
            "separate": [["c", "d", "e"]],
        },
        options={"time_limit_s": 2},
    )
    plan = _solved(req)
    ranks = {name: set(s.ranks) for name, s in plan.tables.items()}
    assert ranks["a"] == ranks["b"]
    assert ranks["e"] == {3}
    assert not (ranks["c"] & ranks["d"]) and not (ranks["c"] & ranks["e"])
    assert not (ranks["d"] & ranks["e"])


def test_slow_ranks_get_less_work():
    tables = [table(f"t{i}", rows=10**5, dim=128) for i in range(12)]
    req = request(
        tables,
        world_size=2,
        topology={"rank_overrides": [{"rank": 1, "hbm_bw_bytes_per_s": 897 * GIB / 4}]},
        constraints={"tables": {f"t{i}": {"sharding_types": ["table_wise"]} for i in range(12)}},
        options={"time_limit_s": 2},
    )
    plan = _solved(req)
    per_rank = [sum(1 for s in plan.tables.values() if s.ranks == [r]) for r in range(2)]
    assert per_rank[0] > per_rank[1]


def test_tiny_time_limit_answers_with_the_warm_start():
    tables = [table(f"t{i}", rows=1000 * (i + 1), dim=64) for i in range(30)]
    req = request(tables, world_size=8, options={"time_limit_s": 0.001})
    # Below MIN_CPSAT_TIME_S the search is not started, whatever the clock says: the
    # deadline itself (a race with the machine's load here) is tested on a virtual clock
    # in test_deadline.py.
    outcome = solve(req, deadline=Deadline.never())
    assert "cpsat_status" not in outcome.details
    assert "packing_objective" not in outcome.details
    assert outcome.plan is not None and validate_plan(req, outcome.plan) == []


# --------------------------------------------------------------------------- infeasible


def test_table_too_big_for_any_rank_is_named():
    req = request(
        [table("huge", rows=2 * 10**9, dim=256), table("ok")],
        world_size=2,
        topology={"hbm_bytes": 8 * GIB, "ddr_bytes": 16 * GIB},
    )
    outcome = solve(req)
    assert outcome.plan is None
    reasons = outcome.infeasibility.reasons
    assert outcome.infeasibility.status is SolverStatus.INFEASIBLE
    assert [r.tables for r in reasons if r.code is InfeasibilityCode.TABLE_DOES_NOT_FIT] == [
        ["huge"]
    ]
    text = outcome.infeasibility.render()
    assert "table 'huge' fits no rank under any allowed option" in text


def test_total_memory_shortfall_and_the_world_size_fix():
    # Each 2.4 GiB table fits a rank alone, but 8 of them do not fit 2 x (4 GiB HBM + 2 GiB DDR).
    tables = [table(f"t{i}", rows=10**7, dim=64) for i in range(8)]
    req = request(tables, world_size=2, topology={"hbm_bytes": 4 * GIB, "ddr_bytes": 2 * GIB})
    outcome = solve(req)
    assert outcome.plan is None
    infeasibility = outcome.infeasibility
    total = [r for r in infeasibility.reasons if r.code is InfeasibilityCode.TOTAL_MEMORY]
    assert total and total[0].needed_bytes > total[0].available_bytes
    assert sorted(total[0].tables) == sorted(t["name"] for t in tables)
    fix = infeasibility.fixes.min_world_size
    assert fix is not None and fix > 2
    bigger = request(tables, world_size=fix, topology={"hbm_bytes": 4 * GIB, "ddr_bytes": 2 * GIB})
    assert solve(bigger).plan is not None
    smaller = request(
        tables, world_size=fix - 1, topology={"hbm_bytes": 4 * GIB, "ddr_bytes": 2 * GIB}
    )
    assert solve(smaller).plan is None


def test_pinned_ranks_overloaded_are_named():
    tables = [table(f"t{i}", rows=10**7, dim=64) for i in range(4)]
    req = request(
        tables,
        world_size=4,
        topology={"hbm_bytes": 4 * GIB, "ddr_bytes": GIB},
        constraints={"tables": {t["name"]: {"ranks": [0]} for t in tables}},
    )
    outcome = solve(req)
    assert outcome.plan is None
    pinned = [
        r
        for r in outcome.infeasibility.reasons
        if r.code is InfeasibilityCode.PINNED_RANKS_OVERLOADED
    ]
    assert pinned and pinned[0].ranks == [0]
    assert "pinned ranks [0]" in pinned[0].message


def test_constraint_that_empties_options_and_the_caching_fix():
    req = request(
        [table("big", rows=3 * 10**7, dim=64), table("s", pooling="none")],
        world_size=2,
        topology={"hbm_bytes": 4 * GIB},
        constraints={
            "tables": {
                "big": {"compute_kernels": ["fused"], "sharding_types": ["table_wise"]},
                "s": {"sharding_types": ["table_row_wise"]},
            }
        },
    )
    outcome = solve(req)
    assert outcome.plan is None
    codes = {r.code: r.tables for r in outcome.infeasibility.reasons}
    assert codes[InfeasibilityCode.NO_ALLOWED_OPTION] == ["s"]
    assert codes[InfeasibilityCode.TABLE_DOES_NOT_FIT] == ["big"]
    assert outcome.infeasibility.fixes.tables_fit_with_uvm_caching == ["big"]


@pytest.mark.parametrize("exponent", [51, 52, 53])
def test_huge_capacities_plan_as_ample_ones_do(exponent):
    """Capacities of 2**51 bytes and more once made the LP's memory coefficients (bytes
    over the largest rank) so small that GLOP's presolve called the request infeasible."""
    tables = [table("t", rows=1000, dim=64)]
    ample = _solved(request(tables, world_size=2, topology={"hbm_bytes": 2**40}))
    huge = request(
        tables, world_size=2, topology={"hbm_bytes": 2**exponent, "ddr_bytes": 2**exponent}
    )
    assert _solved(huge).solver.objective == ample.solver.objective


def test_capacities_summed_over_many_ranks_do_not_overflow():
    """2,048 ranks of 2**53 bytes hold 1.5e19 bytes in all, past int64: the warm start's
    free-memory reserve wrapped negative and no plan was found, and the option-mix
    relaxation, its memory negative, "proved" any upper bound optimal."""
    tables = [table("a", rows=1000, dim=64), table("b", rows=5000, dim=32)]

    def on_2048_ranks_of(capacity: int) -> PlanRequest:
        topology = {"local_world_size": 8, "hbm_bytes": capacity, "ddr_bytes": capacity}
        return request(tables, world_size=2048, topology=topology, options={"time_limit_s": 1})

    huge, ample = _solved(on_2048_ranks_of(2**53)), _solved(on_2048_ranks_of(2**40))
    assert huge.solver.objective == ample.solver.objective
    problem, groups = _problem(on_2048_ranks_of(2**53))
    mix = option_mix_bound(problem, groups, 2 * huge.solver.objective, time_limit_s=1, seed=0)
    assert mix is None or mix.value <= huge.solver.objective


@pytest.mark.parametrize(("world", "rows"), [(1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (2, 3)])
def test_tiny_row_wise_tables_get_their_optimal_plan(world, rows):
    """A 16-byte DDR share against 128 GiB of DDR is a coefficient of 1e-10, which GLOP's
    presolve mistook for a contradiction: the request was "proven" infeasible."""
    req = request(
        [table("t", rows=rows, dim=4)],
        world_size=world,
        constraints={"tables": {"t": {"sharding_types": ["row_wise"]}}},
        options={"gap_limit": 0},
    )
    optimum = _brute_force_optimum(req)
    assert math.isfinite(optimum)
    assert _solved(req).solver.objective == pytest.approx(optimum, rel=1e-9)


_capacity = st.sampled_from([2**16, 2**18, 2**20, 2**22, 2**24, 2**30, 2**40, 2**53])


@st.composite
def _small_tables(draw):
    """Tables of a few rows and columns on up to two hosts of two ranks, with capacities
    from 64 KiB to 2**53 bytes: memory coefficients spanning many orders of magnitude, and
    requests from roomy to impossible."""
    hosts, local = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    names = draw(st.lists(st.sampled_from("abcd"), min_size=1, max_size=3, unique=True))
    kinds = ["table_wise", "row_wise", "data_parallel", "table_row_wise", "column_wise"]
    tables, constraints = [], {}
    for name in names:
        rows, dim = draw(st.integers(1, 64)), draw(st.sampled_from([4, 8, 16, 256]))
        tables.append(
            table(name, rows=rows, dim=dim, optimizer=draw(st.sampled_from(["sgd", "adam"])))
        )
        constraints[name] = {
            "sharding_types": draw(st.lists(st.sampled_from(kinds), min_size=1, unique=True))
        }
    topology = {
        "local_world_size": local,
        "hbm_bytes": draw(_capacity),
        "ddr_bytes": draw(_capacity),
    }
    return request(
        tables,
        world_size=hosts * local,
        topology=topology,
        constraints={"tables": constraints},
        batch_size=draw(st.sampled_from([8, 512])),
        options={"time_limit_s": 1.0},
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_small_tables())
def test_the_lp_is_feasible_whenever_a_plan_exists(req):
    """Brute force decides whether a plan exists; when one does, the LP (a relaxation) has
    a solution too, and its bound is at most the optimum."""
    optimum = _brute_force_optimum(req, most=20_000)
    assume(math.isfinite(optimum))
    problem, groups = _problem(req)
    relaxation = LinearRelaxation(problem, groups).solve()
    assert relaxation is not None
    assert relaxation.bound.value <= optimum * (1 + 1e-9)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_small_tables())
def test_no_plan_only_when_brute_force_finds_none(req):
    """On instances small enough to try every placement, the solver finds a plan exactly
    when one exists, and when none does it says so as proven (infeasible), not timed out."""
    exists = _brute_force_finds_a_plan(req)
    assume(exists is not None)
    outcome = solve(req)
    if exists:
        assert outcome.plan is not None, outcome.infeasibility.render()
        assert validate_plan(req, outcome.plan) == []
    else:
        assert outcome.plan is None
        assert outcome.infeasibility.status is SolverStatus.INFEASIBLE


def _lp_fails(monkeypatch):
    """Make the LP report infeasibility for every request, as GLOP once did wrongly."""

    def infeasible(self, memory_fraction=1.0):
        raise RelaxationInfeasible

    monkeypatch.setattr(LinearRelaxation, "solve", infeasible)


def test_an_lp_that_says_infeasible_is_no_proof_the_search_goes_on(monkeypatch):
    _lp_fails(monkeypatch)
    req = request([table("a", rows=10**5, dim=128), table("b")], world_size=2)
    outcome = solve(req)
    assert outcome.plan is not None and validate_plan(req, outcome.plan) == []
    assert outcome.details["lp_relaxation"] == "infeasible"


def test_without_the_lp_infeasibility_is_proven_by_exact_arithmetic(monkeypatch):
    """Three whole tables of 0.53 of a rank's usable HBM on two ranks: CP-SAT's integer
    model proves there is no plan; eight 2.4 GiB tables on 12 GiB: the byte totals do."""
    _lp_fails(monkeypatch)
    tables = [table(f"t{i}", rows=15 * 10**6, dim=128) for i in range(3)]
    whole = {
        t["name"]: {"sharding_types": ["table_wise"], "compute_kernels": ["fused"]} for t in tables
    }
    packing = request(
        tables, world_size=2, topology={"hbm_bytes": 16 * GIB}, constraints={"tables": whole}
    )
    outcome = solve(packing)
    assert outcome.plan is None and outcome.infeasibility.status is SolverStatus.INFEASIBLE
    assert outcome.details["cpsat_status"] == "INFEASIBLE"

    totals = request(
        [table(f"t{i}", rows=10**7, dim=64) for i in range(8)],
        world_size=2,
        topology={"hbm_bytes": 4 * GIB, "ddr_bytes": 2 * GIB},
    )
    outcome = solve(totals)
    assert outcome.plan is None and outcome.infeasibility.status is SolverStatus.INFEASIBLE
    codes = [reason.code for reason in outcome.infeasibility.reasons]
    assert InfeasibilityCode.TOTAL_MEMORY in codes


# --------------------------------------------------------------------------- determinism


def test_same_request_same_bytes_in_two_processes(run_cli, tmp_path):
    tables = [
        table(f"t{i}", rows=10 ** (3 + i % 4), dim=32 * (1 + i % 3), pooling_factors=[1.0 + i % 5])
        for i in range(40)
    ]
    path = tmp_path / "request.json"
    path.write_text(
        json.dumps(
            {
                "topology": {"world_size": 8, "local_world_size": 4},
                "tables": tables,
                "options": {"time_limit_s": 10},
            }
        )
    )
    first, second = run_cli("plan", path), run_cli("plan", path)
    assert first.returncode == 0, first.stderr
    stops = [json.loads(run.stdout)["solver"]["stop_reason"] for run in (first, second)]
    # Determinism is promised where the wall clock did not cut the search, which with this
    # time limit (a 2 s deterministic budget in 10 s of wall time) takes a very loaded machine.
    if "time_limit" not in stops:
        assert first.stdout == second.stdout
    assert json.loads(first.stdout)["solver"]["status"] in ("optimal", "feasible")


# --------------------------------------------------------------------------- CP-SAT paths


def _problem(req):
    from planner_service.solve.problem import group_tables

    fitted = fit_options(req, enumerate_options(req))
    tables = without_equivalents(fitted.tables, req.topology)
    problem = Problem(req, tables, fitted.capacities, DeviceClasses.of(req.topology))
    return problem, group_tables(problem)


def _plan_from(problem, choices, req):
    """The plan of ``choices``, with 0 as its (trivial) lower bound."""
    from planner_service.plan.types import BoundSource
    from planner_service.solve.bounds.simple import LowerBound
    from planner_service.solve.emit import build_plan

    loads = loads_of(problem, choices)
    return build_plan(problem, choices, loads, LowerBound(0.0, BoundSource.WORK))


def _cpsat_alone(req):
    """CP-SAT's answer with no warm start to follow, checked by the validator."""
    problem, groups = _problem(req)
    result = cpsat.solve_cpsat(problem, groups, None, time_limit_s=2, seed=0)
    assert result.choices is not None and result.exact
    plan = _plan_from(problem, result.choices, req)
    return loads_of(problem, result.choices), validate_plan(req, plan)


def test_cpsat_keeps_each_rank_within_its_ddr():
    """On cpu tables live in DDR. Two cheap tables that each fill most of a rank's DDR and
    one as dear as both: the cheap pair together would balance the ranks (2 units each), but
    does not fit, so the optimum is 3 units."""
    topology = {"world_size": 2, "compute_device": "cpu"}
    tables, unit = _costing([1, 1, 2], [10**7, 10**7, 100], topology=topology)
    whole = {t["name"]: {"sharding_types": ["table_wise"]} for t in tables}
    req = request(
        tables,
        world_size=2,
        topology={"compute_device": "cpu", "ddr_bytes": 8 * GIB},
        constraints={"tables": whole},
    )
    loads, violations = _cpsat_alone(req)
    assert [v for v in violations if v.code.value != "solver_report"] == []
    assert loads.objective == pytest.approx(3 * unit, rel=1e-6)


def test_cpsat_holds_each_rank_to_its_own_hbm():
    """Rank 1 has 2 GiB of HBM, room for the small tables only. Spread by cost alone, a
    big table would go there (1.5 units a rank); held to each rank's HBM, both big ones sit
    on rank 0 (2 units)."""
    tables, unit = _costing([1, 1, 0.5, 0.5], [10**7, 10**7, 100, 100])
    whole = {
        t["name"]: {"sharding_types": ["table_wise"], "compute_kernels": ["fused"]} for t in tables
    }
    req = request(
        tables,
        world_size=2,
        topology={"hbm_bytes": 16 * GIB, "rank_overrides": [{"rank": 1, "hbm_bytes": 2 * GIB}]},
        constraints={"tables": whole},
    )
    loads, violations = _cpsat_alone(req)
    assert [v for v in violations if v.code.value != "solver_report"] == []
    assert loads.objective == pytest.approx(2 * unit, rel=1e-6)


def test_cpsat_alone_honours_colocate_separate_and_pins():
    """CP-SAT with no warm start must find a plan that satisfies the link constraints."""
    req = request(
        [table("a", dim=256), table("b"), table("c"), table("d"), table("e")],
        world_size=4,
        topology={"local_world_size": 2},
        constraints={
            "tables": {"e": {"ranks": [2, 3]}},
            "colocate": [["a", "b"]],
            "separate": [["c", "d", "e"]],
        },
    )
    problem, groups = _problem(req)
    result = cpsat.solve_cpsat(problem, groups, None, time_limit_s=2, seed=0)
    assert result.choices is not None and result.exact
    plan = _plan_from(problem, result.choices, req)
    violations = [v for v in validate_plan(req, plan) if v.code.value != "solver_report"]
    assert violations == []


def test_restricted_model_improves_the_warm_start_without_claiming_a_bound(monkeypatch):
    """Past MAX_PLACEMENT_VARS the model is a neighbourhood of the warm start: its answer is
    valid and no worse, but its bound is not reported as a proof."""
    from planner_service.solve.construct import greedy_plan

    monkeypatch.setattr(cpsat, "MAX_PLACEMENT_VARS", 10)
    tables = [table(f"t{i}", rows=10**4 * (i + 1), dim=64 * (1 + i % 3)) for i in range(12)]
    req = request(tables, world_size=8, topology={"local_world_size": 4})
    problem, groups = _problem(req)
    warm = greedy_plan(problem)
    result = cpsat.solve_cpsat(problem, groups, warm, time_limit_s=2, seed=0)
    assert result.exact is False and result.bound is None
    assert result.choices is not None
    assert loads_of(problem, result.choices).objective <= loads_of(problem, warm).objective
    plan = _plan_from(problem, result.choices, req)
    assert [v for v in validate_plan(req, plan) if v.code.value != "solver_report"] == []


def _lpt_trap(**options) -> tuple[PlanRequest, float]:
    """Two ranks, whole tables costing 3, 3, 2, 2, 2 units: LPT stops at 7, and no single
    move helps; swapping a 3 with a 2 reaches the optimum 6. Returns the request and the
    cost of a "2" table (a "3" costs 1.5 of them)."""
    tables, two = _costing([1.5, 1.5, 1, 1, 1], [100] * 5)
    only_tw = {
        t["name"]: {"sharding_types": ["table_wise"], "compute_kernels": ["fused"]} for t in tables
    }
    req = request(tables, world_size=2, constraints={"tables": only_tw}, options=options)
    return req, two


@pytest.mark.parametrize("kept", ["_swap_once", "_repartition_once"])
def test_warm_start_moves_out_of_the_lpt_trap(monkeypatch, kept):
    """Swaps and two-rank repartitions each get out of the trap alone; without both the
    warm start stays in it."""
    import planner_service.solve.improve as local_search

    req, unit = _lpt_trap(time_limit_s=0.01)
    assert solve(req, deadline=Deadline.never()).plan.solver.objective == pytest.approx(
        3 * unit, rel=1e-4
    )  # {3,3} {2,2,2}

    other = {"_swap_once", "_repartition_once"} - {kept}
    monkeypatch.setattr(local_search, other.pop(), lambda *args: None)
    assert solve(req, deadline=Deadline.never()).plan.solver.objective == pytest.approx(
        3 * unit, rel=1e-4
    )

    monkeypatch.setattr(local_search, kept, lambda *args: None)
    without = solve(req, deadline=Deadline.never()).plan.solver.objective
    assert without == pytest.approx(3.5 * unit, rel=1e-4)  # LPT: {3, 2, 2} and {3, 2}


def test_warm_start_repartitions_table_row_wise_tables_between_hosts(monkeypatch):
    """Two hosts of two ranks and table-row-wise tables whose shards cost 3, 3, 2, 2, 2
    units: largest first, each on the host least loaded after it, they end as {3, 2, 2}
    and {3, 2} (7 units), where moving or swapping one table never helps; re-splitting the
    two hosts' tables reaches {3, 3} and {2, 2, 2} (6)."""
    import planner_service.solve.improve as local_search

    topology = {"world_size": 4, "local_world_size": 2}
    tables, unit = _costing([3, 3, 2, 2, 2], [1000] * 5, "table_row_wise", topology)
    only_trw = {
        t["name"]: {"sharding_types": ["table_row_wise"], "compute_kernels": ["fused"]}
        for t in tables
    }
    req = request(
        tables, topology=topology, constraints={"tables": only_trw}, options={"time_limit_s": 0.01}
    )
    plan = solve(req, deadline=Deadline.never()).plan
    assert plan.solver.objective == pytest.approx(6 * unit, rel=1e-4)
    hosts = {name: s.ranks[0] // 2 for name, s in plan.tables.items()}
    assert hosts["t0"] == hosts["t1"] != hosts["t2"] == hosts["t3"] == hosts["t4"]

    monkeypatch.setattr(local_search, "_repartition_hosts", lambda *args: None)
    assert solve(req, deadline=Deadline.never()).plan.solver.objective == pytest.approx(
        7 * unit, rel=1e-4
    )


def test_gap_limit_stops_at_a_plan_proven_within_it(monkeypatch):
    """Without swaps and repartitions the warm start is 3.5 units against a bound of 3
    (work / world size), a gap of 1/7: a 20% limit accepts it without searching; a 10%
    limit searches on to the optimum."""
    import planner_service.solve.improve as local_search

    monkeypatch.setattr(local_search, "_swap_once", lambda *args: None)
    monkeypatch.setattr(local_search, "_repartition_once", lambda *args: None)
    req, unit = _lpt_trap(time_limit_s=5, gap_limit=0.2)
    outcome = solve(req)
    report = outcome.plan.solver
    assert report.objective == pytest.approx(3.5 * unit, rel=1e-4)
    assert report.status is SolverStatus.FEASIBLE and report.gap == pytest.approx(1 / 7, rel=1e-3)
    assert "cpsat_status" not in outcome.details

    req, unit = _lpt_trap(time_limit_s=5, gap_limit=0.1)
    report = _solved(req).solver
    assert report.objective == pytest.approx(3 * unit, rel=1e-4)
    assert report.status is SolverStatus.OPTIMAL


def test_default_gap_limit_accepts_a_plan_proven_within_two_percent(monkeypatch):
    """The trap above on top of two 50-unit tables: the warm start (without swaps and
    repartitions) is 57 units, {50, 3, 2, 2} and {50, 3, 2}, against the bound and optimum
    56, a gap of 1/57. The default gap limit (2%) accepts it without searching; 0 searches
    on to the optimum."""
    import planner_service.solve.improve as local_search

    monkeypatch.setattr(local_search, "_swap_once", lambda *args: None)
    monkeypatch.setattr(local_search, "_repartition_once", lambda *args: None)
    tables, unit = _costing([50, 50, 3, 3, 2, 2, 2], [100] * 7)
    only_tw = {
        t["name"]: {"sharding_types": ["table_wise"], "compute_kernels": ["fused"]} for t in tables
    }
    req = request(tables, world_size=2, constraints={"tables": only_tw})
    assert req.options.gap_limit == 0.02
    outcome = solve(req)
    report = outcome.plan.solver
    assert report.objective == pytest.approx(57 * unit, rel=1e-4)
    assert report.status is SolverStatus.FEASIBLE and report.gap == pytest.approx(1 / 57, rel=1e-3)
    assert "cpsat_status" not in outcome.details and "packing_objective" not in outcome.details

    exact = req.model_copy(update={"options": req.options.model_copy(update={"gap_limit": 0})})
    report = _solved(exact).solver
    assert report.objective == pytest.approx(56 * unit, rel=1e-4)
    assert report.status is SolverStatus.OPTIMAL


# The NVIDIA synthetic "tiny" model's 55 tables (../shared/data/, rows, dim, lookups per
# sample, how many tables): on 8 ranks its optimum is set by how whole tables pack, which
# only the packing bound proves.
TINY_SHAPES = [
    (1_000_000, 16, 1, 19),
    (10, 8, 1, 16),
    (1000, 8, 1, 10),
    (10_000, 8, 1, 4),
    (100_000, 16, 1, 2),
    (10_000, 8, 11, 1),
    (1_000_000, 16, 11, 1),
    (25_000_000, 16, 11, 1),
    (25_000_000, 16, 1, 1),
]


def _tiny_model_on_8_ranks(time_limit_s: float) -> PlanRequest:
    tables = [
        table(f"t{i}", rows=rows, dim=dim, pooling_factors=[float(lookups)])
        for i, (rows, dim, lookups) in enumerate(
            (rows, dim, lookups) for rows, dim, lookups, n in TINY_SHAPES for _ in range(n)
        )
    ]
    return request(
        tables,
        world_size=8,
        topology={"hbm_bytes": 80 * GIB},
        options={"cost_model": "torchrec-1.8", "time_limit_s": time_limit_s, "gap_limit": 0},
    )


def test_the_packing_relaxation_solves_the_tiny_model_outright():
    """The relaxation, started from the warm start, reaches its optimum; mapped back onto
    ranks that is a plan of the same cost, so the bound proves it and CP-SAT never runs."""
    outcome = solve(_tiny_model_on_8_ranks(60))
    report = outcome.plan.solver
    assert report.status is SolverStatus.OPTIMAL and report.lower_bound_source == "packing"
    assert outcome.details["warm_start_objective"] > report.objective
    assert outcome.details["packing_objective"] == report.objective
    assert "cpsat_runs" not in outcome.details


def test_search_stops_once_a_bound_proves_the_plan_optimal(monkeypatch):
    """With the relaxation's plan withheld, CP-SAT must find the optimum, and alone it
    cannot prove it: without the packing bound it spends its whole budget and ends merely
    FEASIBLE. With the bound as the makespan's floor, the run that reaches it ends OPTIMAL,
    and no later run starts: not the long last run after the probes, nor a second run.
    (What the solver did, not how long it took: deterministic time overshoots its limit
    by a batch, and the wall-clock safety net cuts runs short on a loaded machine.)"""
    import planner_service.solve.bounds.packing as packing

    monkeypatch.setattr(packing._RelaxedModel, "decode", lambda self, solver: None)
    req = _tiny_model_on_8_ranks(60)
    outcome = solve(req)
    report = outcome.plan.solver
    assert report.status is SolverStatus.OPTIMAL and report.lower_bound_source == "packing"
    assert outcome.details["warm_start_objective"] > report.objective  # CP-SAT improved it
    assert outcome.details["cpsat_status"] == "OPTIMAL"
    assert outcome.details["cpsat_runs"] <= len(cpsat.PROBE_SHARES)

    monkeypatch.setattr(cpsat, "PROBE_SHARES", ())
    outcome = solve(req)
    assert outcome.plan.solver.status is SolverStatus.OPTIMAL
    assert outcome.details["cpsat_status"] == "OPTIMAL"
    assert outcome.details["cpsat_runs"] == 1


# --------------------------------------------------------------------------- at scale


def _loaded_state(problem, seed):
    """A state with random loads and memory already on every rank."""
    import numpy as np

    from planner_service.solve.placement import State

    rng = np.random.default_rng(seed)
    state = State(
        rng.random(problem.world_size),
        (rng.random(problem.world_size) * problem.hbm_cap * 0.9).astype(np.int64),
        np.zeros(problem.world_size, np.int64),
    )
    state.max_perf = float(state.perf.max())
    state.free_hbm, state.free_bytes = problem.hbm_total, problem.hbm_total + problem.ddr_total
    return state


@pytest.mark.parametrize("seed", range(6))
def test_column_shards_on_every_host_at_once_place_as_host_by_host(seed):
    from planner_service.solve import placement

    req = request(
        [table("t", rows=400_000, dim=128)],
        world_size=16,
        topology={"local_world_size": 4, "hbm_bytes": 2**28},
        constraints={"tables": {"t": {"sharding_types": ["table_column_wise"]}}},
    )
    problem, _ = _problem(req)
    state = _loaded_state(problem, seed)
    every = placement.Where(set(range(16)), np.arange(16), None)
    for index, option in enumerate(problem.tables[0].options):
        costs = problem.costs(option)
        best = None  # host by host, as for restricted ranks
        for host in range(problem.num_hosts):
            ranks = placement._place_free(
                problem, state, costs, np.arange(host * 4, host * 4 + 4), None
            )
            score = ranks and placement._score(problem, state, costs, ranks, index, 0.5)
            if score and (
                best is None or placement._between_hosts(score) < placement._between_hosts(best[0])
            ):
                best = (score, ranks)
        found = placement.try_option(problem, state, every, index, option, 0.5)
        if best is None:
            assert found is None
            continue
        assert found is not None and found.choice.ranks == best[1]
        assert found.score == pytest.approx(best[0])


@pytest.mark.parametrize("seed", range(4))
def test_options_on_every_rank_score_as_any_placement(seed):
    from planner_service.solve import placement

    req = request([table("t", rows=3_000_000, dim=64)], world_size=8)
    problem, _ = _problem(req)
    state = _loaded_state(problem, seed)
    every = placement.Where(set(range(8)), np.arange(8), None)
    fixed = [
        (i, o) for i, o in enumerate(problem.tables[0].options) if o.placement is Placement.FIXED
    ]
    assert fixed
    for index, option in fixed:
        found = placement.try_option(problem, state, every, index, option, 0.1)
        score = placement._score(
            problem, state, problem.costs(option), problem.every_rank, index, 0.1
        )
        assert (found.score if found else None) == score


def test_an_option_lists_its_shards_as_runs_of_equal_ones():
    req = request([table("t", rows=1_000_003, dim=64)], world_size=6)
    (entry,) = enumerate_options(req)
    for option in entry.options:
        expanded = [shard for shard, count in option.runs for _ in range(count)]
        assert list(option.shards) == expanded
        assert len(option.runs) <= 3


def test_distinct_rank_rows_are_found_as_numpy_finds_them():
    from planner_service.solve.bounds.lp import _distinct_rows

    rng = np.random.default_rng(0)
    matrix = rng.integers(0, 3, size=(200, 5)).astype(float)
    _, first = np.unique(matrix, axis=0, return_index=True)
    assert _distinct_rows(matrix).tolist() == sorted(first.tolist())
    column = rng.integers(0, 2, size=200).astype(float)
    _, first = np.unique(np.column_stack([column, matrix]), axis=0, return_index=True)
    assert _distinct_rows(matrix, column).tolist() == sorted(first.tolist())


def test_an_lp_with_fewer_rank_rows_is_looser_and_still_a_bound(monkeypatch):
    from planner_service.solve.bounds import lp

    tables = [
        table(f"t{i}", rows=200_003 * (i + 1), dim=32, pooling_factors=[4.0]) for i in range(6)
    ]
    req = request(tables, world_size=7, topology={"hbm_bytes": 2**30})
    problem, groups = _problem(req)
    full = lp.LinearRelaxation(problem, groups).solve()
    monkeypatch.setattr(lp, "MAX_RANK_ROW_COEFFICIENTS", 1)  # one row per tier
    capped = lp.LinearRelaxation(problem, groups).solve()
    assert full is not None and capped is not None
    assert capped.bound.value <= full.bound.value * (1 + 1e-9)
    assert full.bound.value <= _brute_force_optimum(req, most=200_000) * (1 + 1e-9)


def test_rank_io_sums_every_shards_buffers_on_its_rank():

    tables = [table(f"t{i}", rows=50_000 * (i + 1), dim=32 * (i % 3 + 1)) for i in range(8)]
    req = request(tables, world_size=6, topology={"local_world_size": 3, "hbm_bytes": 2**27})
    problem, _ = _problem(req)
    outcome = solve(req)
    assert outcome.plan is not None
    expected = [[0, 0] for _ in range(6)]
    for entry in problem.tables:
        sharding = outcome.plan.tables[entry.table.name]
        (option,) = [
            o
            for o in entry.options
            if o.sharding_type == sharding.sharding_type
            and o.compute_kernel == sharding.compute_kernel
            and [list(s.sizes) for s in o.shards] == [list(s.sizes) for s in sharding.shards]
        ]
        for shard, placed in zip(option.shards, sharding.shards, strict=True):
            expected[placed.rank][0] += shard.storage.input_bytes
            expected[placed.rank][1] += shard.storage.output_bytes
    assert [list(io) for io in outcome.rank_io_bytes] == expected
    assert any(i for i, _ in expected)


def test_the_option_mix_bound_is_the_same_with_its_every_rank_load_held_in_a_variable(
    monkeypatch,
):
    from planner_service.solve.bounds import option_mix

    tables = [
        table(f"t{i}", rows=300_000 * (i + 1), dim=64, pooling_factors=[float(i + 1)])
        for i in range(6)
    ]
    req = request(tables, world_size=4, topology={"local_world_size": 2, "hbm_bytes": 2**30})
    problem, groups = _problem(req)
    upper = _solved(req).solver.objective

    def bound():
        found = option_mix.option_mix_bound(problem, groups, upper, time_limit_s=5, seed=0)
        assert found is not None
        return found.value

    inline = bound()
    monkeypatch.setattr(option_mix, "COPIED_TERMS", 0)
    assert bound() == pytest.approx(inline, rel=1e-9)
