"""Plan schema 2.0: tables as runs (plan.runs, types.CompactSharding, plan.compact): the
one spelling of rank and width runs, the round trips between shard lists and runs, the
content address of the new form, and the limits a document of runs is held to."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from planner_service.plan.canonical import canonical_bytes, plan_id_of, sha256_hex
from planner_service.plan.codec import parse_plan, plan_bytes
from planner_service.plan.compact import (
    NotCompactError,
    compact_plan,
    compact_sharding,
    expand_plan,
    expand_sharding,
)
from planner_service.plan.errors import InputError
from planner_service.plan.runs import (
    expand_rank_runs,
    rank_count,
    rank_positions,
    rank_runs,
    rank_runs_problem,
    width_runs,
)
from planner_service.plan.shards import column_wise_shards
from planner_service.plan.types import (
    MAX_WORLD_SIZE,
    CompactSharding,
    ComputeKernel,
    ParameterSharding,
    ShardingType,
)
from planner_service.solve.pipeline import solve
from tests.support import builders
from tests.support.builders import request, table
from tests.support.layouts import layouts

# --------------------------------------------------------------------------- runs


def test_rank_runs_have_one_spelling():
    assert rank_runs([0, 1, 2, 3, 7, 5, 6]) == [(0, 3), 7, 5, 6]
    assert rank_runs(range(4096)) == [(0, 4095)]
    assert rank_runs([4, 3, 2]) == [4, 3, 2]  # descending: single ranks
    assert expand_rank_runs([(0, 3), 7, 5, 6]) == [0, 1, 2, 3, 7, 5, 6]
    assert rank_count([(0, 131_071), 5]) == 131_073
    assert rank_positions([(0, 3), 2, (10, 12)], 2) == [2, 4]
    assert width_runs([32, 32, 32, 16, 32]) == [(32, 3), (16, 1), (32, 1)]


@pytest.mark.parametrize(
    ("runs", "problem"),
    [
        ([(0, 1)], "fewer than 3 ranks"),
        ([(3, 3)], "fewer than 3 ranks"),
        ([(5, 2)], "ends before it starts"),
        ([0, 1, 2], "write [[0, 2]]"),
        ([(0, 3), 4], "write [[0, 4]]"),
        ([(0, 3), (4, 9)], "write [[0, 9]]"),
    ],
)
def test_rank_runs_in_another_spelling_are_named(runs, problem):
    found = rank_runs_problem(runs)
    assert found is not None and problem in found


@settings(max_examples=300)
@given(st.lists(st.integers(0, 40), max_size=60))
def test_rank_runs_round_trip_and_are_their_own_spelling(ranks):
    runs = rank_runs(ranks)
    assert expand_rank_runs(runs) == ranks
    assert rank_count(runs) == len(ranks)
    assert rank_runs_problem(runs) is None
    for rank in set(ranks):
        assert rank_positions(runs, rank) == [i for i, r in enumerate(ranks) if r == rank]


# --------------------------------------------------------------------------- tables


@settings(max_examples=300)
@given(layouts())
def test_expand_of_compact_is_the_layout(sharding):
    compact = compact_sharding(sharding)
    assert expand_sharding(compact) == sharding
    assert compact.num_shards == len(sharding.shards)
    assert CompactSharding.model_validate_json(compact.model_dump_json()) == compact
    for rank in set(sharding.ranks):
        expected = [(i, s) for i, s in enumerate(sharding.shards) if s.rank == rank]
        assert compact.shards_on(rank) == expected


def test_a_row_split_over_4096_ranks_is_a_few_dozen_bytes():
    data = {
        "sharding_type": "row_wise",
        "compute_kernel": "fused",
        "shape": [10_000_000, 128],
        "ranks": [[0, 4095]],
        "rows_per_shard": 2442,
    }
    compact = CompactSharding.model_validate(data)
    assert len(canonical_bytes(compact)) < 140
    assert compact.num_shards == 4096 and "shards" not in compact.__dict__  # not expanded
    ((index, last),) = compact.shards_on(4095)
    assert index == 4095 and last.offsets == (4095 * 2442, 0)
    assert last.sizes == (10_000_000 - 4095 * 2442, 128) == (10, 128)  # the remainder
    ((_, block),) = compact.shards_on(17)
    assert block.offsets == (17 * 2442, 0) and block.sizes == (2442, 128)


def _runs(**fields: object) -> dict[str, object]:
    base = {"sharding_type": "row_wise", "compute_kernel": "fused", "shape": [100, 16]}
    return {**base, **fields}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_runs(ranks=[[0, 3]]), "rows_per_shard is required for sharding_type row_wise"),
        (_runs(ranks=[[0, 3]], rows_per_shard=24), "cover 96 of the table's 100 rows"),
        (_runs(ranks=[0, 1], rows_per_shard=50, column_widths=[[16, 2]]), "column_widths is not"),
        (_runs(ranks=[[0, 1]], rows_per_shard=50), "fewer than 3 ranks"),
        (_runs(ranks=[0, 1, 2, 3], rows_per_shard=25), "write [[0, 3]]"),
        (_runs(ranks=[[0, MAX_WORLD_SIZE - 1], 0], rows_per_shard=1), "at most 131072"),
        (_runs(sharding_type="table_wise", ranks=[0, 1]), "table_wise has one shard"),
        (
            _runs(sharding_type="column_wise", ranks=[0, 1], column_widths=[[8, 1], [8, 1]]),
            "write them as one run",
        ),
        (
            _runs(sharding_type="column_wise", ranks=[0, 1], column_widths=[[8, 1], [4, 1]]),
            "add up to 12 columns, not the table's 16",
        ),
        (
            _runs(sharding_type="column_wise", ranks=[0], column_widths=[[8, 2]]),
            "make 2 column shards but ranks names 1",
        ),
    ],
)
def test_runs_that_do_not_make_a_table_are_refused(data, message):
    with pytest.raises(ValidationError) as caught:
        CompactSharding.model_validate(data)
    assert message in str(caught.value)


def test_a_huge_rank_run_is_refused_without_listing_it():
    data = _runs(sharding_type="data_parallel", compute_kernel="dense", ranks=[[0, 2**40]])
    with pytest.raises(ValidationError, match="less than 131072"):
        CompactSharding.model_validate(data)


def test_column_shards_out_of_column_order_cannot_be_runs():
    shards = column_wise_shards(10, [8, 8], [0, 1])[::-1]
    sharding = ParameterSharding(
        sharding_type=ShardingType.COLUMN_WISE,
        compute_kernel=ComputeKernel.FUSED,
        ranks=[1, 0],
        shards=shards,
    )
    with pytest.raises(NotCompactError, match="left to right"):
        compact_sharding(sharding)


# --------------------------------------------------------------------------- plans


def _solved():
    req = request(
        [table("a", rows=5_000_000), table("b"), table("c", dim=64)],
        world_size=8,
        constraints={"tables": {"c": {"sharding_types": ["column_wise"]}}},
    )
    outcome = solve(req)
    assert outcome.plan is not None
    return req, outcome.plan


def test_the_planner_writes_runs_and_addresses_them():
    _, plan = _solved()
    data = json.loads(plan_bytes(plan))
    assert data["schema_version"] == "2.0"
    assert all("shards" not in t and "shape" in t for t in data["tables"].values())
    body = {k: v for k, v in data.items() if k != "plan_id"}
    assert plan.plan_id == sha256_hex(canonical_bytes(body)) == plan_id_of(data)


def test_plans_round_trip_between_the_two_forms():
    _, plan = _solved()
    old = expand_plan(plan)
    assert old.schema_version == "1.1" and old.plan_id != plan.plan_id
    assert all(isinstance(t, ParameterSharding) for t in old.tables.values())
    assert {n: t.shards for n, t in old.tables.items()} == {
        n: t.shards for n, t in plan.tables.items()
    }
    assert compact_plan(old) == plan  # the same bytes, so the same plan_id
    assert parse_plan(plan_bytes(old)) == old


def test_a_plan_mixing_the_forms_is_refused():
    req = request([table("a"), table("b")], world_size=2)
    plan = builders.plan(
        req, {"a": builders.table_wise(req, "a", 0), "b": builders.row_wise(req, "b")}
    )
    data = json.loads(plan_bytes(plan))
    data["tables"]["a"] = json.loads(expand_sharding(plan.tables["a"]).model_dump_json())
    with pytest.raises(InputError) as caught:
        parse_plan(json.dumps(data))
    (problem,) = caught.value.problems
    assert problem.path == "tables.a"
    assert (
        "plan schema '2.0' writes each table's shards as a split rule and ranks" in problem.message
    )


def test_an_error_inside_a_table_of_runs_names_its_field():
    req = request([table("a")], world_size=2)
    plan = builders.plan(req, {"a": builders.row_wise(req, "a")})
    data = json.loads(plan_bytes(plan))
    data["tables"]["a"]["rows_per_shard"] = "50"
    with pytest.raises(InputError) as caught:
        parse_plan(json.dumps(data))
    assert [p.path for p in caught.value.problems] == ["tables.a.rows_per_shard"]


def test_rank_stats_are_columns_in_2_0_and_rows_in_1x():
    req = request([table("a"), table("b")], world_size=3)
    plan = builders.plan(
        req, {"a": builders.table_wise(req, "a", 0), "b": builders.row_wise(req, "b")}
    )
    data = json.loads(plan_bytes(plan))
    assert data["rank_stats"]["rank"] == [0, 1, 2]
    assert data["rank_stats"]["hbm_bytes"] == [s.hbm_bytes for s in plan.rank_stats]
    assert set(data["rank_stats"]["perf"]) == {
        "fwd_compute",
        "fwd_comms",
        "bwd_compute",
        "bwd_comms",
        "prefetch",
        "input_dist",
        "total",
    }
    assert isinstance(json.loads(plan_bytes(expand_plan(plan)))["rank_stats"], list)
    rows = json.loads(plan_bytes(expand_plan(plan)))["rank_stats"]
    with pytest.raises(InputError, match="writes rank_stats as columns"):
        parse_plan(json.dumps({**data, "rank_stats": rows}))
    short = {**data["rank_stats"], "hbm_bytes": data["rank_stats"]["hbm_bytes"][:2]}
    with pytest.raises(InputError, match="lists of one length"):
        parse_plan(json.dumps({**data, "rank_stats": short}))
