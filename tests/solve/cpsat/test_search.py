"""The CP-SAT search: capacities, constraints, warm starts, gap limits and stopping at a proof."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner_service.plan.codec import parse_request
from planner_service.plan.types import (
    PlanRequest,
    SolverStatus,
    StopReason,
)
from planner_service.solve.cpsat import search as cpsat
from planner_service.solve.deadline import Deadline
from planner_service.solve.pipeline import solve
from planner_service.solve.problem import loads_of
from planner_service.validate.validator import validate_plan
from tests.solve.oracles import (
    GIB,
    costing,
    plan_from,
    problem_of,
    solved,
)
from tests.support.builders import request, table


def _cpsat_alone(req):
    """CP-SAT's answer with no warm start to follow, checked by the validator."""
    problem, groups = problem_of(req)
    result = cpsat.solve_cpsat(problem, groups, None, time_limit_s=2, seed=0)
    assert result.choices is not None and result.exact
    plan = plan_from(problem, result.choices, req)
    return loads_of(problem, result.choices), validate_plan(req, plan)


def test_cpsat_keeps_each_rank_within_its_ddr():
    """On cpu tables live in DDR. Two cheap tables that each fill most of a rank's DDR and
    one as dear as both: the cheap pair together would balance the ranks (2 units each), but
    does not fit, so the optimum is 3 units."""
    topology = {"world_size": 2, "compute_device": "cpu"}
    tables, unit = costing([1, 1, 2], [10**7, 10**7, 100], topology=topology)
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
    tables, unit = costing([1, 1, 0.5, 0.5], [10**7, 10**7, 100, 100])
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
    problem, groups = problem_of(req)
    result = cpsat.solve_cpsat(problem, groups, None, time_limit_s=2, seed=0)
    assert result.choices is not None and result.exact
    plan = plan_from(problem, result.choices, req)
    violations = [v for v in validate_plan(req, plan) if v.code.value != "solver_report"]
    assert violations == []


def test_restricted_model_improves_the_warm_start_without_claiming_a_bound(monkeypatch):
    """Past MAX_PLACEMENT_VARS the model is a neighbourhood of the warm start: its answer is
    valid and no worse, but its bound is not reported as a proof."""
    from planner_service.solve.construct import greedy_plan

    monkeypatch.setattr(cpsat, "MAX_PLACEMENT_VARS", 10)
    tables = [table(f"t{i}", rows=10**4 * (i + 1), dim=64 * (1 + i % 3)) for i in range(12)]
    req = request(tables, world_size=8, topology={"local_world_size": 4})
    problem, groups = problem_of(req)
    warm = greedy_plan(problem)
    result = cpsat.solve_cpsat(problem, groups, warm, time_limit_s=2, seed=0)
    assert result.exact is False and result.bound is None
    assert result.choices is not None
    assert loads_of(problem, result.choices).objective <= loads_of(problem, warm).objective
    plan = plan_from(problem, result.choices, req)
    assert [v for v in validate_plan(req, plan) if v.code.value != "solver_report"] == []


def _lpt_trap(**options) -> tuple[PlanRequest, float]:
    """Two ranks, whole tables costing 3, 3, 2, 2, 2 units: LPT stops at 7, and no single
    move helps; swapping a 3 with a 2 reaches the optimum 6. Returns the request and the
    cost of a "2" table (a "3" costs 1.5 of them)."""
    tables, two = costing([1.5, 1.5, 1, 1, 1], [100] * 5)
    only_tw = {
        t["name"]: {"sharding_types": ["table_wise"], "compute_kernels": ["fused"]} for t in tables
    }
    req = request(tables, world_size=2, constraints={"tables": only_tw}, options=options)
    return req, two


MOVES_OUT_OF_THE_TRAP = ("_swap_once", "_repartition_once", "recreate_once")


@pytest.mark.parametrize("kept", MOVES_OUT_OF_THE_TRAP)
def test_warm_start_moves_out_of_the_lpt_trap(monkeypatch, kept):
    """Swaps, two-rank repartitions and recreating a few ranks each get out of the trap
    alone; without all three the warm start stays in it."""
    import planner_service.solve.improve as local_search

    req, unit = _lpt_trap(time_limit_s=0.01)
    assert solve(req, deadline=Deadline.never()).plan.solver.objective == pytest.approx(
        3 * unit, rel=1e-4
    )  # {3,3} {2,2,2}

    for other in set(MOVES_OUT_OF_THE_TRAP) - {kept}:
        monkeypatch.setattr(local_search, other, lambda *args: None)
    monkeypatch.setattr(local_search, "TIGHT_HBM_SHARE", 0.0)  # recreate on any plan
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
    tables, unit = costing([3, 3, 2, 2, 2], [1000] * 5, "table_row_wise", topology)
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
    """Without swaps, repartitions and recreating the warm start is 3.5 units against a bound of 3
    (work / world size), a gap of 1/7: a 20% limit accepts it without searching; a 10%
    limit searches on to the optimum."""
    import planner_service.solve.improve as local_search

    for move in MOVES_OUT_OF_THE_TRAP:
        monkeypatch.setattr(local_search, move, lambda *args: None)
    req, unit = _lpt_trap(time_limit_s=5, gap_limit=0.2)
    outcome = solve(req)
    report = outcome.plan.solver
    assert report.objective == pytest.approx(3.5 * unit, rel=1e-4)
    assert report.status is SolverStatus.FEASIBLE and report.gap == pytest.approx(1 / 7, rel=1e-3)
    assert "cpsat_status" not in outcome.details

    req, unit = _lpt_trap(time_limit_s=5, gap_limit=0.1)
    report = solved(req).solver
    assert report.objective == pytest.approx(3 * unit, rel=1e-4)
    assert report.status is SolverStatus.OPTIMAL


def test_default_gap_limit_accepts_a_plan_proven_within_two_percent(monkeypatch):
    """The trap above on top of two 50-unit tables: the warm start (without swaps,
    repartitions and recreating) is 57 units, {50, 3, 2, 2} and {50, 3, 2}, against the bound and optimum
    56, a gap of 1/57. The default gap limit (2%) accepts it without searching; 0 searches
    on to the optimum."""
    import planner_service.solve.improve as local_search

    for move in MOVES_OUT_OF_THE_TRAP:
        monkeypatch.setattr(local_search, move, lambda *args: None)
    tables, unit = costing([50, 50, 3, 3, 2, 2, 2], [100] * 7)
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
    report = solved(exact).solver
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


def _tables_of(shapes: list[tuple[int, int, int, int]]) -> list[dict]:
    """Tables t0, t1, ... of (rows, dim, lookups per sample, how many tables) shapes."""
    return [
        table(f"t{i}", rows=rows, dim=dim, pooling_factors=[float(lookups)])
        for i, (rows, dim, lookups) in enumerate(
            (rows, dim, lookups) for rows, dim, lookups, n in shapes for _ in range(n)
        )
    ]


def _tiny_model_on_8_ranks(time_limit_s: float) -> PlanRequest:
    return request(
        _tables_of(TINY_SHAPES),
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
    and no later run starts: not the long last run after the probes, nor the portfolio's
    run after the lone worker's (which reaches it here).
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


# --------------------------------------------------------------------------- small problems

EXAMPLE_REQUEST = Path(__file__).resolve().parents[3] / "examples" / "request.json"


def _readme_example(hbm_bytes: int, **options) -> PlanRequest:
    """The README's request (examples/request.json) with ``hbm_bytes`` and ``options``."""
    document = json.loads(EXAMPLE_REQUEST.read_text())
    document["topology"]["hbm_bytes"] = hbm_bytes
    document["options"] = options
    return parse_request(json.dumps(document).encode())


def test_the_readme_example_in_64_mib_stops_on_its_proof_not_its_time_limit():
    """Two of its three tables must leave HBM. CP-SAT proved the optimum within
    milliseconds, but its core-guided worker raised the makespan's lower bound one unit at a
    time, without advancing deterministic time, so the interleaved batch it was in (and the
    solve) went on to the wall-clock limit: 10 s of a 10 s limit, and the plan said
    ``optimal`` stopped on ``time_limit``. With 30 s it must end by its proof, having done
    a few milliseconds of deterministic work."""
    req = _readme_example(64 * 2**20, time_limit_s=30)
    outcome = solve(req)
    report = outcome.plan.solver
    assert report.status is SolverStatus.OPTIMAL
    assert report.stop_reason is StopReason.OPTIMAL
    assert outcome.details["cpsat_deterministic_s"] < 0.05


# 20 tables (rows, dim, lookups, how many) on 4 ranks of 512 MiB at batch 4,096: weights of
# about 1.1 GiB must partly leave HBM (the proof bench's sweep request 0).
SWEEP_0_SHAPES = [
    (10, 16, 1, 3),
    (3_067_956, 128, 3, 1),
    (1_000_000, 16, 1, 4),
    (1000, 16, 1, 7),
    (1000, 8, 1, 1),
    (10, 8, 1, 1),
    (108, 128, 1, 1),
    (100_000, 32, 1, 1),
    (4_000_000, 32, 1, 1),
]


def test_a_small_memory_tight_request_stops_once_proven_within_the_gap_limit():
    """CP-SAT reached the 2% gap limit within milliseconds, but interleaved search stops
    only between batches, and a batch gives each full-problem worker up to one
    deterministic second: 1.3 deterministic seconds (4 to 5 s of wall time) before the
    proof was noticed. The search must stop at its proof, after little work."""
    req = request(
        _tables_of(SWEEP_0_SHAPES),
        world_size=4,
        batch_size=4096,
        topology={"hbm_bytes": 512 * 2**20},
        options={"cost_model": "torchrec-1.8", "time_limit_s": 30},
    )
    outcome = solve(req)
    report = outcome.plan.solver
    assert report.stop_reason in (StopReason.OPTIMAL, StopReason.GAP_LIMIT)
    assert report.gap <= req.options.gap_limit
    assert outcome.details["cpsat_deterministic_s"] < 0.1
