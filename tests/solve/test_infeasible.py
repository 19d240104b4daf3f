"""When no plan exists: proven, explained by name and number, with the smallest fix."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner_service.plan.types import (
    InfeasibilityCode,
    PlanRequest,
    SolverStatus,
)
from planner_service.solve.bounds.lp import LinearRelaxation, RelaxationInfeasible
from planner_service.solve.bounds.option_mix import option_mix_bound
from planner_service.solve.pipeline import solve
from planner_service.validate.validator import validate_plan
from tests.solve.oracles import (
    GIB,
    brute_force_finds_a_plan,
    brute_force_optimum,
    problem_of,
    solved,
)
from tests.support.builders import request, table


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
        [table("big", rows=3 * 10**7, dim=64), table("s")],
        world_size=2,
        topology={"hbm_bytes": 4 * GIB},
        constraints={
            "tables": {
                "big": {"compute_kernels": ["fused"], "sharding_types": ["table_wise"]},
                "s": {"sharding_types": ["data_parallel"], "compute_kernels": ["fused"]},
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
    ample = solved(request(tables, world_size=2, topology={"hbm_bytes": 2**40}))
    huge = request(
        tables, world_size=2, topology={"hbm_bytes": 2**exponent, "ddr_bytes": 2**exponent}
    )
    assert solved(huge).solver.objective == ample.solver.objective


def test_capacities_summed_over_many_ranks_do_not_overflow():
    """2,048 ranks of 2**53 bytes hold 1.5e19 bytes in all, past int64: the warm start's
    free-memory reserve wrapped negative and no plan was found, and the option-mix
    relaxation, its memory negative, "proved" any upper bound optimal."""
    tables = [table("a", rows=1000, dim=64), table("b", rows=5000, dim=32)]

    def on_2048_ranks_of(capacity: int) -> PlanRequest:
        topology = {"local_world_size": 8, "hbm_bytes": capacity, "ddr_bytes": capacity}
        return request(tables, world_size=2048, topology=topology, options={"time_limit_s": 1})

    huge, ample = solved(on_2048_ranks_of(2**53)), solved(on_2048_ranks_of(2**40))
    assert huge.solver.objective == ample.solver.objective
    problem, groups = problem_of(on_2048_ranks_of(2**53))
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
    optimum = brute_force_optimum(req)
    assert math.isfinite(optimum)
    assert solved(req).solver.objective == pytest.approx(optimum, rel=1e-9)


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
    optimum = brute_force_optimum(req, most=20_000)
    assume(math.isfinite(optimum))
    problem, groups = problem_of(req)
    relaxation = LinearRelaxation(problem, groups).solve()
    assert relaxation is not None
    assert relaxation.bound.value <= optimum * (1 + 1e-9)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_small_tables())
def test_no_plan_only_when_brute_force_finds_none(req):
    """On instances small enough to try every placement, the solver finds a plan exactly
    when one exists, and when none does it says so as proven (infeasible), not timed out."""
    exists = brute_force_finds_a_plan(req)
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
