"""Incremental re-planning: moved bytes (``plan.transfers``), the re-planning solve
(``solve/incremental.py``), its options and their errors, and the service resolving
``options.previous_plan_id`` from its store."""

from __future__ import annotations

import json

import httpx
import pytest

from planner_service.plan.canonical import canonical_bytes
from planner_service.plan.codec import parse_request, plan_bytes, request_hash
from planner_service.plan.diff import diff_plans
from planner_service.plan.errors import InputError
from planner_service.plan.transfers import Element, plan_moves
from planner_service.plan.types import (
    InfeasibilityCode,
    OptimizerType,
    ShardingPlan,
    SolverStatus,
)
from planner_service.solve.deadline import Deadline
from planner_service.solve.incremental import Moves, kept_choices, revert_towards_previous
from planner_service.solve.pipeline import solve
from planner_service.solve.prepare import prepare, warm_start
from planner_service.solve.problem import loads_of
from planner_service.validate.validator import validate_plan
from tests.conftest import BACKENDS
from tests.service.test_api import running_service
from tests.support import builders
from tests.support.builders import request, table

# --------------------------------------------------------------------------- moved bytes


def _moves(old_req, old_tables, new_req, new_tables):
    old = builders.plan(old_req, old_tables)
    new = builders.plan(new_req, new_tables)
    return diff_plans(old, new, new_req), plan_moves(old, new.tables, new_req)


def test_a_row_wise_resplit_moves_only_the_rows_whose_rank_changes():
    old_req = request([table("t", rows=100, dim=16)])
    new_req = request([table("t", rows=120, dim=16)])  # the table grew: blocks of 30, not 25
    diff, moves = _moves(
        old_req,
        {"t": builders.row_wise(old_req, "t")},
        new_req,
        {"t": builders.row_wise(new_req, "t")},
    )
    # rank 0 gets rows 25-29 from rank 1, rank 1 rows 50-59 from rank 2, rank 2 rows
    # 75-89 from rank 3; rank 3's rows 100-119 are new (no rank held them): not moved.
    row = 16 * 4
    assert moves.received == {0: 5 * row, 1: 10 * row, 2: 15 * row}
    assert moves.sent == {1: 5 * row, 2: 10 * row, 3: 15 * row}
    assert diff.moved_bytes == moves.moved_bytes == 30 * row
    assert {r.rank: r.bytes_in for r in diff.ranks} == {0: 5 * row, 1: 10 * row, 2: 15 * row, 3: 0}
    assert {r.rank: r.bytes_sent for r in diff.ranks} == {
        0: 0,
        1: 5 * row,
        2: 10 * row,
        3: 15 * row,
    }


def test_a_table_wise_move_sends_the_whole_table_once():
    req = request([table("a", rows=1000, dim=32), table("b", rows=10, dim=8)])
    old = {"a": builders.table_wise(req, "a", 0), "b": builders.table_wise(req, "b", 1)}
    new = {"a": builders.table_wise(req, "a", 3), "b": builders.table_wise(req, "b", 1)}
    diff, moves = _moves(req, old, req, new)
    assert moves.sent == {0: 1000 * 32 * 4} and moves.received == {3: 1000 * 32 * 4}
    assert moves.tables["b"].moved_bytes == 0 and moves.tables_moved == 1
    assert diff.moved_bytes == 1000 * 32 * 4


def test_column_wise_swaps_count_weights_and_optimizer_state():
    req = request([table("c", rows=50, dim=16, optimizer="rowwise_adagrad")])
    old = {"c": builders.column_wise(req, "c", [8, 8], [0, 1])}
    new = {"c": builders.column_wise(req, "c", [8, 8], [1, 0])}
    diff, moves = _moves(req, old, req, new)
    half = 50 * 8 * 4 + 50 * 4  # fp32 weights of 8 columns, one fp32 state per row
    assert moves.sent == {0: half, 1: half} and moves.received == {0: half, 1: half}
    assert diff.moved_bytes == 2 * half
    # without the request: 4-byte weights, no optimizer state
    assert (
        diff_plans(builders.plan(req, old), builders.plan(req, new)).moved_bytes == 2 * 50 * 8 * 4
    )


def test_replicas_send_from_rank_mod_replicas_and_keep_what_they_hold():
    req = request([table("d", rows=10, dim=4)], world_size=4)
    replicated = {"d": builders.data_parallel(req, "d")}
    diff, moves = _moves(req, replicated, req, {"d": builders.table_wise(req, "d", 2)})
    assert diff.moved_bytes == 0  # rank 2 held a replica
    bigger = request([table("d", rows=10, dim=4)], world_size=8)
    _, moves = _moves(req, replicated, bigger, {"d": builders.data_parallel(bigger, "d")})
    whole = 10 * 4 * 4
    assert moves.received == {4: whole, 5: whole, 6: whole, 7: whole}
    assert moves.sent == {0: whole, 1: whole, 2: whole, 3: whole}  # replica rank % 4


def test_element_bytes_of_each_optimizer():
    assert Element(2, OptimizerType.SGD).region_bytes(3, 4) == 24
    assert Element(4, OptimizerType.ROWWISE_ADAGRAD).region_bytes(3, 4) == 48 + 12
    assert Element(4, OptimizerType.ADAGRAD).region_bytes(3, 4) == 48 + 48
    assert Element(4, OptimizerType.ADAM).region_bytes(3, 4) == 48 + 96


# --------------------------------------------------------------------------- solving


def _workload(n: int, world_size: int = 4, **options):
    tables = [
        table(f"t{i}", rows=20_000 + 7_919 * i, dim=16 * (1 + i % 4), pooling_factors=[1.0 + i % 5])
        for i in range(n)
    ]
    return request(tables, world_size=world_size, options={"time_limit_s": 2, **options})


def _replan(old: ShardingPlan, n: int, world_size: int = 4, **options):
    previous = json.loads(canonical_bytes(old))
    req = _workload(n, world_size, previous_plan=previous, **options)
    return req, solve(req, deadline=Deadline.never())


@pytest.fixture(scope="module")
def base_plan():
    outcome = solve(_workload(20), deadline=Deadline.never())
    assert outcome.plan is not None
    return outcome.plan


def _assert_reports_the_diff(old, req, plan):
    diff = diff_plans(old, plan, req)
    migration = plan.migration
    assert migration is not None and migration.previous_plan_id == old.plan_id
    assert migration.moved_bytes == diff.moved_bytes
    assert {m.rank: m.received_bytes for m in migration.ranks} == {
        r.rank: r.bytes_in for r in diff.ranks if r.bytes_in or r.bytes_sent
    }
    assert {m.rank: m.sent_bytes for m in migration.ranks} == {
        r.rank: r.bytes_sent for r in diff.ranks if r.bytes_in or r.bytes_sent
    }
    assert migration.tables_moved == sum(1 for t in diff.tables if t.moved_bytes)


def test_an_incremental_plan_reports_what_the_diff_recomputes(base_plan):
    req, outcome = _replan(base_plan, 21)
    plan = outcome.plan
    assert plan is not None and validate_plan(req, plan) == []
    assert plan.request_hash == request_hash(req) and plan.schema_version == "2.0"
    # "migration" sorts before "plan_id": the sealed bytes are still the canonical ones
    assert plan_bytes(plan) == canonical_bytes(plan)
    _assert_reports_the_diff(base_plan, req, plan)


def test_a_cap_of_zero_keeps_every_table_where_it_was(base_plan):
    req, outcome = _replan(base_plan, 21, max_moved_bytes=0)
    plan = outcome.plan
    assert plan is not None and validate_plan(req, plan) == []
    assert plan.migration is not None and plan.migration.moved_bytes == 0
    assert plan.migration.max_moved_bytes == 0
    assert all(plan.tables[name] == sharding for name, sharding in base_plan.tables.items())
    assert plan.solver.status in (SolverStatus.OPTIMAL, SolverStatus.FEASIBLE)
    _assert_reports_the_diff(base_plan, req, plan)


def test_a_cap_holds_and_moves_less_than_replanning_from_scratch(base_plan):
    scratch = solve(_workload(21), deadline=Deadline.never()).plan
    assert scratch is not None and scratch.migration is None
    from_scratch = diff_plans(base_plan, scratch, _workload(21)).moved_bytes
    cap = from_scratch // 4
    req, outcome = _replan(base_plan, 21, max_moved_bytes=cap)
    plan = outcome.plan
    assert plan is not None and validate_plan(req, plan) == []
    assert plan.migration is not None and plan.migration.moved_bytes <= cap < from_scratch
    _assert_reports_the_diff(base_plan, req, plan)
    # the bound is one of the problem without the cap: the capped plan is never faster
    assert plan.solver.objective >= scratch.solver.lower_bound


def test_a_move_cost_trades_speed_for_moves(base_plan):
    _, free = _replan(base_plan, 21, move_cost_ms_per_gib=0.0)
    _, dear = _replan(base_plan, 21, move_cost_ms_per_gib=1e6)
    assert free.plan is not None and dear.plan is not None
    assert dear.plan.migration is not None and dear.plan.migration.moved_bytes == 0
    assert free.plan.solver.objective <= dear.plan.solver.objective


def test_a_cap_no_plan_meets_is_explained():
    old_req = _workload(8, world_size=4)
    old = solve(old_req, deadline=Deadline.never()).plan
    assert old is not None
    on_rank_3 = [name for name, s in old.tables.items() if 3 in s.ranks]
    assert on_rank_3  # the new cluster has no rank 3: these tables must move
    req, outcome = _replan(old, 8, world_size=2, max_moved_bytes=0)
    assert outcome.plan is None and outcome.infeasibility is not None
    (reason,) = outcome.infeasibility.reasons
    assert reason.code is InfeasibilityCode.MOVE_BUDGET and reason.available_bytes == 0
    assert reason.needed_bytes is not None and reason.needed_bytes > 0
    assert "no plan found that moves at most 0 bytes" in reason.message
    assert f"{reason.needed_bytes:,} bytes" in reason.message


def test_reverting_towards_the_previous_plan_moves_less_and_never_slows_it(base_plan):
    req = _replan(base_plan, 21)[0]
    prepared = prepare(req)
    problem = prepared.problem
    assert problem is not None
    moves = Moves(problem, base_plan, req.options)
    scratch = warm_start(prepared)  # a plan made without regard to moves
    assert scratch is not None
    assert moves.total(scratch) > 0
    kept = kept_choices(problem, moves)
    assert sum(k is not None for k in kept) == 20  # every old table, none of the new one
    reverted = revert_towards_previous(problem, moves, scratch, kept)
    assert moves.total(reverted) <= moves.total(scratch)
    assert loads_of(problem, reverted).objective <= loads_of(problem, scratch).objective
    cap = moves.total(scratch) // 3
    capped = Moves(problem, base_plan, req.options.model_copy(update={"max_moved_bytes": cap}))
    assert capped.total(revert_towards_previous(problem, capped, scratch, kept)) <= cap


def test_the_cli_needs_a_previous_plan_for_the_move_options(run_cli, tmp_path):
    path = tmp_path / "request.json"
    path.write_bytes(canonical_bytes(_workload(2)))
    done = run_cli("plan", path, "--max-moved-bytes", "1GiB")
    assert done.returncode == 2
    assert "--previous-plan" in done.stderr and "Traceback" not in done.stderr


def test_requests_without_the_options_hash_and_dump_as_before(base_plan):
    plain = _workload(3)
    assert "previous_plan" not in canonical_bytes(plain).decode()
    document = json.loads(canonical_bytes(plain))
    with_id = parse_request(
        json.dumps(
            {**document, "options": {**document["options"], "previous_plan_id": base_plan.plan_id}}
        )
    )
    inline = parse_request(
        json.dumps(
            {
                **document,
                "options": {
                    **document["options"],
                    "previous_plan": json.loads(canonical_bytes(base_plan)),
                },
            }
        )
    )
    assert request_hash(with_id) == request_hash(inline) != request_hash(plain)


# --------------------------------------------------------------------------- bad input


def _problems(document):
    with pytest.raises(InputError) as caught:
        parse_request(json.dumps(document))
    return {problem.path: problem.message for problem in caught.value.problems}


def _with_options(base_plan, **options):
    document = json.loads(canonical_bytes(_workload(2)))
    document["options"].update(options)
    return document


def test_a_cap_out_of_bounds_names_the_field(base_plan):
    problems = _problems(
        _with_options(base_plan, previous_plan_id=base_plan.plan_id, max_moved_bytes=2**60)
    )
    assert "options.max_moved_bytes" in problems
    assert (
        "8192TiB" in problems["options.max_moved_bytes"]
        or "9007199254740992" in problems["options.max_moved_bytes"]
    )
    problems = _problems(
        _with_options(base_plan, previous_plan_id=base_plan.plan_id, move_cost_ms_per_gib=-1)
    )
    assert "options.move_cost_ms_per_gib" in problems


def test_a_cap_without_a_previous_plan_is_refused(base_plan):
    problems = _problems(_with_options(base_plan, max_moved_bytes=10))
    assert "give previous_plan_id" in problems["options.max_moved_bytes"]


def test_an_edited_inline_plan_is_refused(base_plan):
    previous = json.loads(canonical_bytes(base_plan))
    name = next(iter(previous["tables"]))
    first = builders.shard_list(previous["tables"][name])[0]["rank"]
    builders.move_shard(previous["tables"][name], 0, (first + 1) % 4)
    problems = _problems(_with_options(base_plan, previous_plan=previous))
    message = problems["options.previous_plan.plan_id"]
    assert "does not match its plan_id" in message and base_plan.plan_id in message


def test_an_inline_plan_of_a_newer_schema_is_refused(base_plan):
    previous = json.loads(canonical_bytes(base_plan))
    previous["schema_version"] = "2.9"
    problems = _problems(_with_options(base_plan, previous_plan=previous))
    assert "upgrade shardplan" in problems["options.previous_plan.schema_version"]


def test_an_id_naming_another_plan_than_the_inline_one_is_refused(base_plan):
    previous = json.loads(canonical_bytes(base_plan))
    problems = _problems(
        _with_options(base_plan, previous_plan=previous, previous_plan_id="0" * 64)
    )
    assert "is not the plan_id of previous_plan" in problems["options.previous_plan_id"]


def test_an_id_alone_needs_the_service():
    document = json.loads(canonical_bytes(_workload(2)))
    document["options"]["previous_plan_id"] = "a" * 64
    with pytest.raises(InputError) as caught:
        solve(parse_request(json.dumps(document)))
    (problem,) = caught.value.problems
    assert problem.path == "options.previous_plan_id" and "options.previous_plan" in problem.message


# --------------------------------------------------------------------------- the service


@pytest.fixture(scope="module", params=BACKENDS)
def service(request, shardplan_exe, tmp_path_factory):
    yield from running_service(
        request, shardplan_exe, tmp_path_factory, SHARDPLAN_MAX_TIME_LIMIT_S="30"
    )


@pytest.mark.timeout(120)
def test_the_service_replans_from_a_stored_plan(service):
    first = json.loads(canonical_bytes(_workload(6)))
    with httpx.Client(base_url=service.base, timeout=60) as http:
        created = http.post("/v1/plans", json=first)
        assert created.status_code == 201, created.text
        old = ShardingPlan.model_validate_json(created.content)
        second = json.loads(canonical_bytes(_workload(7)))
        second["options"].update(previous_plan_id=old.plan_id, max_moved_bytes="1GiB")
        replanned = http.post("/v1/plans", json=second)
        assert replanned.status_code == 201, replanned.text
        plan = ShardingPlan.model_validate_json(replanned.content)
        req = parse_request(json.dumps(second))
        assert plan.request_hash == request_hash(req)
        assert plan.migration is not None and plan.migration.max_moved_bytes == 2**30
        diff = diff_plans(old, plan, req)
        assert plan.migration.moved_bytes == diff.moved_bytes <= 2**30
        again = http.post("/v1/plans", json=second)  # the same request: the stored plan
        assert again.status_code == 200 and again.headers["X-Shardplan-Cache"] == "hit"
        assert again.content == replanned.content
        second["options"]["previous_plan_id"] = "f" * 64
        unknown = http.post("/v1/plans", json=second)
        assert unknown.status_code == 422, unknown.text
        body = unknown.json()
        assert "options.previous_plan_id" in unknown.text and "f" * 64 in body["detail"]
        # asked for as a job, the same: refused at once, no job made
        queued = http.post("/v1/plans", json=second, headers={"Prefer": "respond-async"})
        assert queued.status_code == 422, queued.text
        assert "options.previous_plan_id" in queued.text
        # and a job re-planning from a stored plan ends with the plan the sync POST gave
        second["options"]["previous_plan_id"] = old.plan_id
        job = http.post("/v1/plans", json=second, headers={"Prefer": "respond-async"})
        assert job.status_code == 202, job.text
        assert job.json()["status"] == "done" and job.json()["plan_id"] == plan.plan_id
