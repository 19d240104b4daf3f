"""Lower bounds (LP relaxation, packing, option mix): never above the true optimum, and tight where they should be."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner_service.plan.types import (
    ShardingType,
)
from planner_service.solve.bounds.lp import LinearRelaxation
from planner_service.solve.bounds.option_mix import option_mix_bound
from planner_service.solve.bounds.packing import packing_bound
from planner_service.solve.bounds.simple import simple_bounds
from planner_service.solve.problem import loads_of
from planner_service.validate.validator import validate_plan
from tests.solve.oracles import (
    GIB,
    brute_force_optimum,
    costing,
    plan_from,
    problem_of,
    table_strategy,
)
from tests.support.builders import request, table


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
    problem, groups = problem_of(req)
    by_name = {entry.table.name: entry for entry in problem.tables}
    whole = problem.costs(by_name["t0"].options[0]).work
    row_shards = problem.costs(by_name["r"].options[0]).fixed_cost
    optimum = brute_force_optimum(req)
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
    optimum = brute_force_optimum(req)
    problem, groups = problem_of(req)
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
    problem, groups = problem_of(req)
    optimum = brute_force_optimum(req)
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
    problem, groups = problem_of(req)
    optimum = brute_force_optimum(req)
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


def test_packing_keeps_apart_tables_that_cannot_share_a_rank(monkeypatch):
    """Tables of 1, 1, 1.5 and 0.5 units on two ranks pair best as {1, 1} and {1.5, 0.5},
    but the two 1-unit tables each fill most of a rank's HBM. Items carry their memory in
    the relaxation, so its bound is the true optimum (2.5), not 2, and its plan fits."""
    tables, _ = costing([1, 1, 1.5, 0.5], [10**7, 10**7, 100, 100])
    only_tw = {
        t["name"]: {"sharding_types": ["table_wise"], "compute_kernels": ["fused"]} for t in tables
    }
    req = request(
        tables,
        world_size=2,
        topology={"hbm_bytes": 10 * GIB},
        constraints={"tables": only_tw},
    )
    problem, groups = problem_of(req)
    unit = problem.costs(problem.tables[0].options[0]).work
    big = int(problem.costs(problem.tables[0].options[0]).hbm[0])
    assert big < problem.hbm_cap[0] < 2 * big
    optimum = brute_force_optimum(req)
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
    tables = draw(st.lists(table_strategy, min_size=1, max_size=3, unique_by=lambda t: t["name"]))
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
    optimum = brute_force_optimum(req, most=20_000)
    assume(math.isfinite(optimum))
    problem, groups = problem_of(req)
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
        assert validate_plan(req, plan_from(problem, packing.plan, req)) == []


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
    optimum = brute_force_optimum(req, most=20_000)
    assume(math.isfinite(optimum))
    problem, groups = problem_of(req)
    packing = packing_bound(problem, groups, 2 * optimum, time_limit_s=1, seed=0)
    assume(packing is not None)
    assert packing.bound is None or packing.bound.value <= optimum * (1 + 1e-12)
    if packing.plan is not None:
        loads = loads_of(problem, packing.plan)
        assert loads.fits(problem)
        assert loads.objective >= optimum * (1 - 1e-12)
        assert validate_plan(req, plan_from(problem, packing.plan, req)) == []


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
    optimum = brute_force_optimum(req)
    problem, groups = problem_of(req)
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
