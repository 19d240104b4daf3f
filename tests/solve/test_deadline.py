"""``options.time_limit_s`` as a wall-clock limit: every stage stops at the deadline with its
best result so far, and the solver report says what stopped the search.

Time here is a virtual clock (``_Ticking``: every look at it advances it), so these tests
assert what the solver does when time runs out, never how many seconds it took; the
wall-clock figures on real workloads, idle and under load, are a benchmark
(``benchmarks/time_limit_bench.py``, recorded in docs/benchmarks.md)."""

from __future__ import annotations

import copy
import math

import pytest
from ortools.sat.python import cp_model

from planner_service.plan.types import (
    BoundSource,
    ExplainCheck,
    InfeasibilityCode,
    SolverStatus,
    StopReason,
)
from planner_service.solve import prepare as prepare_module
from planner_service.solve.bounds import packing as packing_module
from planner_service.solve.bounds.lp import LinearRelaxation
from planner_service.solve.bounds.option_mix import OPTION_MIX_S_PER_OPTION, option_mix_bound
from planner_service.solve.bounds.packing import PREPARE_S_PER_OPTION, packing_bound
from planner_service.solve.bounds.simple import LowerBound
from planner_service.solve.construct import SEARCH_SHARE, greedy_plan
from planner_service.solve.cpsat.model import (
    BUILD_S_PER_TERM,
    REST_OF_BUILD_FACTOR,
    PlacementModel,
    build_s,
)
from planner_service.solve.cpsat.search import solve_cpsat
from planner_service.solve.cpsat_runner import (
    MIN_WALL_SAFETY_S,
    WALL_SAFETY_FACTOR,
    deterministic_solver,
    solve_within,
)
from planner_service.solve.deadline import Deadline, OutOfTime, finish_slack_s
from planner_service.solve.explain import explain, explanation_time_s
from planner_service.solve.improve import improve
from planner_service.solve.pipeline import Background, solve
from planner_service.solve.prepare import prepare, warm_start
from planner_service.solve.problem import loads_of
from planner_service.validate.validator import validate_plan
from tests.support.builders import request, seal_plan, table


class _Ticking:
    """A clock that advances ``step`` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step
        self.reads = 0

    def __call__(self) -> float:
        self.now += self.step
        self.reads += 1
        return self.now


def _expired() -> Deadline:
    deadline = Deadline(0.0)
    assert deadline.expired()
    return Deadline(0.0)


def _request(num_tables: int = 40, world_size: int = 8, **options: object):
    tables = [table(f"t{i}", rows=20_000 * (i % 7 + 1), dim=64) for i in range(num_tables)]
    return request(
        tables,
        world_size=world_size,
        topology={"local_world_size": 4, "hbm_bytes": 2**30},
        options={"gap_limit": 0, **options},
    )


def _prepared(req):
    prepared = prepare(req, Deadline.never())
    assert prepared.problem is not None and prepared.groups is not None
    return prepared


# --------------------------------------------------------------------------- the clock


def test_deadline_counts_down_and_records_when_it_cut_something():
    clock = _Ticking(0.5)
    deadline = Deadline(2.0, clock=clock)  # ends at 0.5 + 2.0
    assert deadline.remaining_s() == 1.5 and not deadline.reached
    assert deadline.cap_s(10.0, share=0.5) == 0.5  # half of the 1.0 s left at the next read
    assert deadline.cap_s(0.1) == 0.1  # a budget under what is left stays
    assert not deadline.reached
    assert deadline.expired() and deadline.reached
    assert deadline.remaining_s() == 0.0 and deadline.cap_s(5.0) == 0.0


def test_a_stage_that_used_its_whole_wall_limit_was_cut_by_it():
    deadline = Deadline(100.0)
    deadline.note_stop(limit_s=2.0, wall_s=1.2)  # stopped by its own work budget
    assert not deadline.reached
    deadline.note_stop(limit_s=2.0, wall_s=2.0)
    assert deadline.reached


def test_never_caps_nothing():
    deadline = Deadline.never()
    assert not deadline.expired() and math.isinf(deadline.remaining_s())
    assert deadline.cap_s(3.0, share=0.1) == 3.0


def test_slack_is_five_percent_or_a_quarter_second():
    assert finish_slack_s(1.0) == 0.25
    assert finish_slack_s(10.0) == 0.5
    assert finish_slack_s(60.0) == 3.0


def test_a_deadline_ends_now_or_with_another_less_what_that_one_keeps():
    clock = _Ticking(0.0)
    other = Deadline(10.0, clock=clock)
    own = copy.copy(other)
    other.reserve(3.0)  # the other keeps time for what comes after it, after the copy
    own.end_with(other, before_s=1.0)
    assert own.remaining_s() == 6.0
    own.end_with(Deadline(20.0, clock=clock))  # never later than it was
    assert own.remaining_s() == 6.0
    own.end_now()
    assert own.expired() and own.reached and own.remaining_s() == 0.0


def test_a_bound_in_the_background_gives_its_result_or_its_error_to_who_waits():
    found = LowerBound(1.0, BoundSource.CONFIGURATION)
    assert Background(lambda: found, Deadline.never()).result() is found

    def broken() -> LowerBound | None:
        raise ValueError("a bug in the bound")

    with pytest.raises(ValueError, match="a bug in the bound"):
        Background(broken, Deadline.never()).result()

    def until_stopped(deadline: Deadline) -> LowerBound | None:
        while not deadline.expired():
            pass
        return None

    stage = Deadline.never()
    waiting = Background(lambda: until_stopped(stage), stage)
    waiting.abandon()
    assert waiting.result() is None and stage.reached


# --------------------------------------------------------------------------- every stage


def test_the_lp_is_skipped_when_no_time_is_left():
    deadline = _expired()
    prepared = prepare(_request(), deadline)
    assert prepared.problem is not None and prepared.relaxation is None
    assert [b.source for b in prepared.bounds or []] == ["work/world_size", "largest_shard"]
    assert deadline.reached


def test_the_lp_gets_what_is_left_as_its_time_limit():
    prepared = _prepared(_request())
    assert prepared.problem is not None and prepared.groups is not None
    linear = LinearRelaxation(prepared.problem, prepared.groups, Deadline(30.0))
    assert linear.solve() is not None  # a 30 s limit does not stop this LP
    assert not linear.deadline.reached


def test_building_the_lp_stops_at_the_deadline(monkeypatch):
    # 300 distinct shapes: the build looks at the clock every 256 groups. The LP's own
    # estimate would not start it in 0.02 s; here it is taken to cost nothing, to start.
    monkeypatch.setattr(prepare_module, "LP_S_PER_VARIABLE", 0.0)
    tables = [table(f"t{i}", rows=1_000 * (i + 1), dim=64) for i in range(300)]
    req = request(tables, world_size=8, topology={"local_world_size": 4, "hbm_bytes": 2**30})
    problem = _prepared(req).problem
    assert problem is not None
    # The clock reads 0.01 at the start (the deadline: 0.11), 0.02 before the LP, 0.03 and
    # 0.04 to give the LP its 30% of what is left (until 0.064), 0.05 to check its estimate,
    # 0.06 at group 0 and 0.07 at group 256: past the LP's share, so the LP is given up,
    # and the solve was cut.
    clock = _Ticking(0.01)
    deadline = Deadline(0.1, clock=clock)
    prepared = prepare(req, deadline)
    assert clock.reads == 7  # stopped at the look at group 256
    assert deadline.reached
    assert prepared.problem is not None and prepared.relaxation is None
    # The simple bounds, and the work bound with HBM priced in the LP's stead (2**30 bytes
    # a rank do not hold every table's fastest option).
    sources = ["work/world_size", "largest_shard", "work/world_size"]
    assert [b.source for b in prepared.bounds or []] == sources
    assert prepare(req, Deadline.never()).relaxation is not None


def test_the_first_pass_is_guided_and_its_plan_is_kept_when_time_runs_out():
    prepared = _prepared(_request())
    problem = prepared.problem
    assert problem is not None and prepared.relaxation is not None
    guide = [[0]] * len(problem.tables)  # every table's first option first
    # A clock that lets exactly one pass finish (40 tables: 3 reads a pass).
    first = greedy_plan(problem, 0.0, [guide], Deadline(0.035, clock=_Ticking(0.01)))
    assert first is not None
    assert all(choice.option == 0 for choice in first)
    # With time for every pass, the best of all passes wins, as listed (unguided first).
    assert greedy_plan(problem, 0.0, [guide]) == min(
        (greedy_plan(problem, 0.0, [guide]), greedy_plan(problem, 0.0, [])),
        key=lambda plan: (loads_of(problem, plan).objective, loads_of(problem, plan).peak_hbm),
    )


def test_greedy_stops_at_the_deadline_but_keeps_a_finished_pass():
    prepared = _prepared(_request())
    problem = prepared.problem
    assert problem is not None
    assert greedy_plan(problem, prepared.lower_bound.value, [], _expired()) is None
    # 40 tables: a pass reads the clock at tables 0, 16 and 32. With no target to meet
    # (bound 0), passes go on until the clock stops the second; the first is kept.
    clock = _Ticking(0.01)
    deadline = Deadline(0.045, clock=clock)
    plan = greedy_plan(problem, 0.0, [], deadline)
    assert plan is not None and deadline.reached
    assert plan == greedy_plan(problem, 0.0, [], Deadline(0.035, clock=_Ticking(0.01)))
    assert len(plan) == len(problem.tables)


def test_passes_after_the_first_plan_leave_the_local_search_its_share():
    prepared = _prepared(_request())
    problem = prepared.problem
    assert problem is not None
    clock = _Ticking(0.1)
    deadline = Deadline(3.0, clock=clock)  # ends at 3.1: the passes' share spans several looks
    first_at: list[float] = []

    def reserve(plan: object) -> float:
        first_at.append(clock.now)
        return 0.0

    plan = greedy_plan(problem, 0.0, [], deadline, reserve)
    assert plan is not None and deadline.reached
    [first] = first_at
    # The passes' share is taken at the next look at the clock; further passes stopped
    # within two looks of its end, and the rest of the time is left for the local search.
    shared_at = first + clock.step
    share_end = shared_at + (1 - SEARCH_SHARE) * (3.1 - shared_at)
    assert clock.now <= share_end + 2 * clock.step + 1e-9
    assert 3.1 - clock.now >= clock.step - 1e-9  # before the deadline, which old passes ran to
    # Passes cut short are dropped: the plan is the first pass's.
    assert plan == greedy_plan(problem, 0.0, [], Deadline(0.35, clock=_Ticking(0.1)))


def test_the_first_plan_may_use_the_grace_but_no_more():
    prepared = _prepared(_request())
    problem = prepared.problem
    assert problem is not None
    late = Deadline(0.0, grace_s=1.0)
    assert late.expired()
    assert greedy_plan(problem, 0.0, [], late) is not None
    assert greedy_plan(problem, 0.0, [], Deadline(0.0, grace_s=0.0)) is None


def test_local_search_stops_at_the_deadline_with_its_input():
    prepared = _prepared(_request())
    problem = prepared.problem
    assert problem is not None
    start = greedy_plan(problem, prepared.lower_bound.value, [])
    assert start is not None
    assert improve(problem, start, _expired()) == start
    assert (
        loads_of(problem, improve(problem, start)).objective <= loads_of(problem, start).objective
    )


def _warm_started():
    """The test request's problem, groups, warm start and its objective."""
    prepared = _prepared(_request())
    problem, groups = prepared.problem, prepared.groups
    assert problem is not None and groups is not None
    warm = warm_start(prepared)
    assert warm is not None
    return problem, groups, warm, loads_of(problem, warm).objective


def test_relaxation_and_search_run_nothing_without_time():
    problem, groups, warm, objective = _warm_started()
    packing = packing_bound(
        problem, groups, objective, time_limit_s=10, seed=0, hint=warm, deadline=_expired()
    )
    assert packing is not None and packing.bound is None and packing.plan is None
    assert packing.deterministic_time_s == 0.0
    result = solve_cpsat(problem, groups, warm, time_limit_s=10, seed=0, deadline=_expired())
    assert result.runs == 0 and result.choices is None and result.bound is None


def test_the_packing_relaxation_is_not_started_when_its_preparation_would_overrun(monkeypatch):
    """Relaxing and classing 88,596 options took 0.29 s, started with 0.09 s left of a
    10 s limit (5,384 distinct memory-tight shapes): 0.2 s late for a model then found too
    large."""
    relaxed = []
    real = packing_module.relaxed_options
    monkeypatch.setattr(packing_module, "relaxed_options", lambda *a: relaxed.append(1) or real(*a))
    problem, groups, warm, objective = _warm_started()
    needs = PREPARE_S_PER_OPTION * sum(len(g.options) for g in groups)

    def packing(seconds: float):
        deadline = Deadline(seconds, clock=lambda: 0.0)  # the clock stands still
        found = packing_bound(
            problem, groups, objective, time_limit_s=10, seed=0, hint=warm, deadline=deadline
        )
        return found, deadline.reached

    (short, reached) = packing(needs / 2)
    assert short is not None and (short.bound, short.plan, short.deterministic_time_s) == (
        None,
        None,
        0.0,
    )
    assert reached and not relaxed  # nothing prepared
    (enough, reached) = packing(needs * 10 + 1.0)
    assert enough is not None and enough.bound is not None and not reached
    assert relaxed == [1]


def test_the_placement_model_stops_building_at_its_first_look_past_the_deadline():
    """Every loop that builds the CP-SAT model (the groups' variables, the capacities, the
    makespan and peak HBM over the ranks) looks at the clock: whenever the deadline falls,
    the build ends at the next look, never a whole phase later (at 1,024 ranks a phase took
    10 s and ran a 60 s limit 30 s over)."""
    prepared = _prepared(_request())
    problem, groups = prepared.problem, prepared.groups
    assert problem is not None and groups is not None
    warm = warm_start(prepared)
    assert warm is not None
    # every look of a whole build: the deadline's start, one before the groups, one per
    # group, one after them, two to judge the rest, then one per rank in each of the three
    # phases over the ranks
    looks = len(groups) + 5 + 3 * problem.world_size
    outcomes = set()
    for seconds in range(1, looks + 40):
        clock = _Ticking(1.0)
        deadline = Deadline(float(seconds), clock=clock)
        end = 1.0 + seconds  # the constructor read the clock once
        try:
            built = PlacementModel(problem, groups, warm, 1.0, False, deadline)
            built.makespan(0, 10**9)
            built.peak_hbm()
            outcomes.add("built")
            assert clock.reads == looks, "a phase of the build did not look at the clock"
        except OutOfTime:
            assert deadline.reached
            outcomes.add("out of time")
        assert clock.now <= end + 1.0, f"{seconds} s: read the clock at {clock.now}"
    assert outcomes == {"built", "out of time"}


def test_a_model_that_cannot_be_built_by_the_deadline_is_not_finished():
    """After the groups' variables, the rest of the build takes about
    ``REST_OF_BUILD_FACTOR`` times as long: when that cannot end by the deadline, the build
    stops there, before its constraints over the ranks, and the search runs nothing."""
    prepared = _prepared(_request())
    problem, groups = prepared.problem, prepared.groups
    assert problem is not None and groups is not None
    # the clock: 1 at the deadline's start, 2 before the groups, one look per group, one
    # after them, one to time them, one to judge the rest
    n = len(groups)
    groups_s = n + 2
    seconds = 4.0 + n + REST_OF_BUILD_FACTOR * groups_s - 0.5  # a little short
    clock = _Ticking(1.0)
    with pytest.raises(OutOfTime):
        PlacementModel(problem, groups, None, 1.0, False, Deadline(seconds, clock=clock))
    assert clock.reads == n + 5
    clock = _Ticking(1.0)
    built = PlacementModel(problem, groups, None, 1.0, False, Deadline(seconds + 1e6, clock=clock))
    assert built.model.proto.constraints


def test_the_build_estimate_counts_the_models_load_terms():
    """``build_s`` counts, without building, the load terms the model will have: exactly
    for the whole model, at most as many for a neighbourhood of the warm start."""
    prepared = _prepared(_request(num_tables=40, world_size=32))
    problem, groups = prepared.problem, prepared.groups
    assert problem is not None and groups is not None
    warm = warm_start(prepared)
    assert warm is not None
    for restrict in (False, True):
        built = PlacementModel(problem, groups, warm, 1.0, restrict, Deadline.never())
        terms = sum(len(rank_terms) for rank_terms in built.perf_terms)
        counted = build_s(problem, groups, warm, restrict) / BUILD_S_PER_TERM
        if restrict:
            assert (
                terms <= round(counted) < build_s(problem, groups, warm, False) / BUILD_S_PER_TERM
            )
        else:
            assert round(counted) == terms


def test_a_model_expected_to_outlast_the_deadline_is_not_built():
    """The search does not start a model whose build the deadline cannot hold: it returns
    at once with nothing, and says the deadline cut it."""
    prepared = _prepared(_request())
    problem, groups = prepared.problem, prepared.groups
    assert problem is not None and groups is not None
    warm = warm_start(prepared)
    assert warm is not None
    expected = build_s(problem, groups, warm, False)
    deadline = Deadline(0.9 * expected, clock=_Ticking(0.0))
    result = solve_cpsat(problem, groups, warm, time_limit_s=10, seed=0, deadline=deadline)
    assert result.runs == 0 and result.choices is None and result.num_variables == 0
    assert deadline.reached
    deadline = Deadline(2 * expected + 60.0)
    result = solve_cpsat(problem, groups, warm, time_limit_s=1, seed=0, deadline=deadline)
    assert result.runs >= 1 and result.num_variables > 0


def test_cpsat_gets_what_is_left_of_the_deadline_as_its_wall_limit():
    model = cp_model.CpModel()
    x = model.new_int_var(0, 10, "x")
    model.maximize(x)
    solver = deterministic_solver(100.0, seed=0)
    deadline = Deadline(3.0)
    assert solve_within(solver, model, deadline, share=0.5) == cp_model.OPTIMAL
    assert 1.0 < solver.parameters.max_time_in_seconds <= 1.5
    assert solver.parameters.max_deterministic_time == 100.0
    assert not deadline.reached  # it proved the optimum long before its limit
    # Without a deadline, a run still stops at 20x its deterministic budget in wall time,
    # and a short run no sooner than MIN_WALL_SAFETY_S.
    solver = deterministic_solver(0.5, seed=0)
    solve_within(solver, model, Deadline.never())
    assert solver.parameters.max_time_in_seconds == 0.5 * WALL_SAFETY_FACTOR
    solver = deterministic_solver(0.02, seed=0)
    solve_within(solver, model, Deadline.never())
    assert solver.parameters.max_time_in_seconds == MIN_WALL_SAFETY_S


def _too_big_for_two_ranks():
    tables = [table(f"t{i}", rows=4_000_000, dim=128) for i in range(12)]
    return request(tables, world_size=2, topology={"hbm_bytes": 2**30, "ddr_bytes": 2**30})


def test_the_fix_search_stops_at_the_deadline_and_says_what_it_did_not_try():
    req = _too_big_for_two_ranks()
    searched = explain(req, [], SolverStatus.INFEASIBLE)
    assert searched.fixes.min_world_size is not None and searched.not_checked is None
    cut = explain(req, [], SolverStatus.INFEASIBLE, _expired())
    assert cut.fixes.min_world_size is None
    assert cut.fixes.min_world_size_searched_up_to == 2  # nothing beyond the request itself
    assert cut.reasons == searched.reasons  # the reasons need no search
    assert cut.not_checked == [ExplainCheck.LARGER_WORLD_SIZES]
    text = cut.render()
    assert "world sizes above 2 were not tried within time_limit_s" in text
    assert "fits either" not in text  # nothing was ruled out beyond the request


def test_a_probe_of_the_fix_search_stops_at_the_deadline_itself():
    req = _too_big_for_two_ranks()
    clock = _Ticking(0.001)
    deadline = Deadline(0.05, clock=clock)  # 50 reads; the whole search takes about 100
    cut = explain(req, [], SolverStatus.INFEASIBLE, deadline)
    assert cut.not_checked == [ExplainCheck.LARGER_WORLD_SIZES]
    assert cut.fixes.min_world_size is None  # 14 when the search ends
    searched = cut.fixes.min_world_size_searched_up_to
    assert searched is not None and 2 < searched < 14  # what it ruled out before the cut
    # Optional work gets no grace and no finishing slack: stopped within a few reads.
    assert clock.now < 0.05 + 0.005, clock.now


def test_memory_totals_stop_past_the_slack_and_say_so():
    tables = [table(f"t{i}", rows=10**7, dim=64) for i in range(600)]
    req = request(tables, world_size=2, topology={"hbm_bytes": 4 * 2**30})
    full = explain(req, [], SolverStatus.INFEASIBLE, Deadline(0.0, clock=_Ticking(0.0)))
    assert [r.code for r in full.reasons] == [InfeasibilityCode.TOTAL_MEMORY]
    # Each look at the clock a second later: past the slack at the 512th table.
    cut = explain(req, [], SolverStatus.NO_SOLUTION_IN_TIME, Deadline(0.0, clock=_Ticking(1.0)))
    assert cut.not_checked == [ExplainCheck.MEMORY_TOTALS, ExplainCheck.LARGER_WORLD_SIZES]
    assert [r.code for r in cut.reasons] == [InfeasibilityCode.TIMED_OUT]
    assert "memory totals over all ranks were not checked within time_limit_s" in cut.render()


def test_the_caching_fix_cut_short_says_it_was_not_tried():
    constraints = {
        "tables": {"users": {"compute_kernels": ["fused"], "sharding_types": ["table_wise"]}}
    }
    req = request(
        [table("users", rows=3 * 10**7, dim=64)],
        world_size=2,
        topology={"hbm_bytes": 4 * 2**30},
        constraints=constraints,
    )
    found = explain(req, [], SolverStatus.INFEASIBLE)
    assert found.fixes.tables_fit_with_uvm_caching == ["users"] and found.not_checked is None
    assert "not_checked" not in found.model_dump_json()  # absent when all was checked
    cut = explain(req, [], SolverStatus.INFEASIBLE, _expired())
    assert ExplainCheck.UVM_CACHING in (cut.not_checked or [])
    assert cut.fixes.tables_fit_with_uvm_caching == []
    assert "allowing fused_uvm_caching was not tried within time_limit_s" in cut.render()


def test_a_request_without_a_plan_keeps_time_to_explain_it():
    # 60 tables, nothing left for the search: the explanation still has its reserve.
    req = _request(num_tables=60, world_size=16)
    clock = _Ticking(0.0)
    deadline = Deadline(explanation_time_s(60), clock=clock)
    kept = copy.copy(deadline)
    outcome = solve(req, deadline=deadline)
    assert outcome.infeasibility is not None
    assert deadline.remaining_s() == 0.0  # the search stopped at once
    assert kept.remaining_s() > 0.0  # what the explanation had


# --------------------------------------------------------------------------- stop reasons


def test_a_plan_proven_optimal_says_optimal():
    req = request([table("a", rows=1000, dim=64)], world_size=2)
    plan = solve(req, deadline=Deadline.never()).plan
    assert plan is not None and plan.solver.stop_reason is StopReason.OPTIMAL


def test_a_plan_proven_within_the_gap_limit_says_gap_limit():
    # Five equal tables on two ranks: the work bound is 2.5 tables, the best plan 3. (Of
    # three, each is over half of any makespan under 2 tables, so they would need three
    # ranks: the bound of shards beside their rank's HBM proves the plan's 2.)
    tables = [table(f"t{i}", rows=1000, dim=64) for i in range(5)]
    req = request(
        tables,
        world_size=2,
        constraints={"tables": {f"t{i}": {"sharding_types": ["table_wise"]} for i in range(5)}},
        options={"gap_limit": 0.5, "time_limit_s": 1},
    )
    plan = solve(req, deadline=Deadline.never()).plan
    assert plan is not None
    assert plan.solver.gap > 1e-4 and plan.solver.stop_reason is StopReason.GAP_LIMIT


def test_a_plan_whose_search_spent_its_budget_says_work_budget():
    req = _request(time_limit_s=0.2)
    plan = solve(req, deadline=Deadline.never()).plan
    assert plan is not None and validate_plan(req, plan) == []
    if plan.solver.gap > max(1e-4, req.options.gap_limit):
        assert plan.solver.stop_reason is StopReason.WORK_BUDGET
    else:  # solved before its budget ran out on this request
        assert plan.solver.stop_reason is StopReason.OPTIMAL


def _criteo_like(num_tables: int = 60):
    """Tables of very different sizes and pooling factors on two hosts of 8: a request whose
    search runs its whole budget (the issue's reproducer took 29 s for a 10 s limit)."""
    tables = [
        table(
            f"t{i}",
            rows=[40_000_000, 10_000_000, 3_000_000, 500_000, 40_000, 3_000][i % 6] // (1 + i // 6),
            dim=128,
            pooling_factors=[float(1 + (7 * i) % 100)],
            optimizer="rowwise_adagrad",
        )
        for i in range(num_tables)
    ]
    return request(
        tables,
        world_size=16,
        topology={"local_world_size": 8, "hbm_bytes": 80 * 2**30},
        batch_size=4096,
        options={"time_limit_s": 10, "gap_limit": 0},
    )


def test_a_search_cut_by_the_clock_says_time_limit_and_is_still_valid():
    req = _criteo_like()
    outcome = solve(req, deadline=Deadline(0.2, clock=_Ticking(0.002)))
    assert outcome.plan is not None, outcome.infeasibility
    assert outcome.plan.solver.stop_reason is StopReason.TIME_LIMIT
    assert validate_plan(req, outcome.plan) == []


def test_no_plan_before_the_deadline_is_no_solution_in_time_not_infeasible():
    req = _request(num_tables=60, world_size=16)
    outcome = solve(req, deadline=_expired())
    assert outcome.plan is None and outcome.infeasibility is not None
    assert outcome.infeasibility.status is SolverStatus.NO_SOLUTION_IN_TIME


def test_a_report_without_stop_reason_keeps_its_canonical_form():
    """Plans of schema 1.0 predate stop_reason: their canonical bytes (and so their ids)
    must not change because the field now exists."""
    from planner_service.plan.canonical import canonical_bytes, plan_id_of
    from tests.support.builders import table_wise

    req = request([table("a")], world_size=2)
    from planner_service.plan.types import RankStats, SolverReport

    report = SolverReport(status=SolverStatus.FEASIBLE, objective=1.0, lower_bound=0.5, gap=0.5)
    plan = seal_plan(
        request=req,
        planner_version="shardplan-0.1.0",  # any version: the form is what is tested,
        tables={"a": table_wise(req, "a", 0)},
        rank_stats=[RankStats(rank=r, hbm_bytes=0, ddr_bytes=0) for r in range(2)],
        solver=report,
    )
    assert b"stop_reason" not in canonical_bytes(plan)
    assert plan_id_of(plan.model_dump(mode="json")) == plan.plan_id
    stopped = report.model_copy(update={"stop_reason": StopReason.WORK_BUDGET})
    assert stopped.model_dump(mode="json")["stop_reason"] == "work_budget"


def test_work_that_cannot_finish_in_time_is_not_started():
    clock = _Ticking(0.0)
    deadline = Deadline(1.0, clock=clock)
    assert deadline.allows(0.5) and not deadline.reached
    assert not deadline.allows(1.5) and deadline.reached


def test_an_option_mix_expected_to_outlast_the_deadline_is_not_built():
    """Its build does not look at the clock, so a build the deadline cannot hold (by the
    options' count) is not started: nothing, and the deadline says it cut it."""
    prepared = _prepared(_request())
    problem, groups = prepared.problem, prepared.groups
    warm = warm_start(prepared)
    upper = loads_of(problem, warm).objective
    expected = OPTION_MIX_S_PER_OPTION * sum(len(g.options) for g in groups)
    deadline = Deadline(0.9 * expected, clock=_Ticking(0.0))
    assert (
        option_mix_bound(problem, groups, upper, time_limit_s=1, seed=0, deadline=deadline) is None
    )
    assert deadline.reached
    deadline = Deadline(2 * expected + 60.0)
    bound = option_mix_bound(problem, groups, upper, time_limit_s=1, seed=0, deadline=deadline)
    assert bound is not None and bound.value > 0


def test_the_warm_starts_local_search_leaves_the_bounds_their_time():
    """The local search stops ``bounds_s`` before the deadline (on a clock that only the
    test moves: at the reserve, it has already stopped), and says it was cut."""
    prepared = _prepared(_request())
    clock = _Ticking(0.0)
    deadline = Deadline(5.0, clock=clock)
    clock.now = 4.5  # half a second left, and the bounds keep 1 s of it
    cut = warm_start(prepared, deadline, bounds_s=1.0)
    assert cut is not None and deadline.reached
    # The same state with no reserve: the search runs (with time left), so it can improve.
    full = warm_start(prepared, Deadline(5.0, clock=_Ticking(0.0)))
    problem = prepared.problem
    assert loads_of(problem, full).objective <= loads_of(problem, cut).objective
