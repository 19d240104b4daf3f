"""Sequence embeddings (``EmbeddingCollection``) sharded against the unsharded module on real
gloo process groups of 2, 3 and 4 spawned processes (scenarios in
tests/runtime/sequence_cases.py), and one plan sharding a model's pooled and sequence
collections together."""

from __future__ import annotations

import pytest

from planner_service.plan.codec import plan_bytes
from planner_service.plan.types import ShardingPlan
from planner_service.solve.deadline import Deadline
from planner_service.solve.pipeline import solve
from planner_service.validate.validator import validate_plan
from tests.runtime import sequence_cases as cases
from tests.support.builders import request, table
from tests.support.distributed import run_ranks

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad", "adam"])
def test_sequence_rows_and_three_training_steps_match_the_unsharded_module(world_size, optimizer):
    run_ranks(cases.equivalence, world_size, optimizer)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_column_shards_in_random_order_come_back_in_column_order(world_size):
    run_ranks(cases.column_orders, world_size, 4)


@pytest.mark.parametrize("world_size", [2, 3])
def test_sequence_state_dict_load_and_gather_round_trip(world_size):
    run_ranks(cases.state_round_trip, world_size)


@pytest.mark.parametrize("world_size", [2, 3])
def test_one_plan_shards_a_models_pooled_and_sequence_collections(world_size):
    run_ranks(cases.two_collections, world_size)


def test_a_rank_with_an_empty_batch_takes_part_and_gets_empty_outputs():
    run_ranks(cases.empty_batch, 3)


def planned_host_local(world: int, local: int) -> ShardingPlan:
    """The planner's plan for ``sequence_cases.PLANNED_TABLES`` (sequence tables, each
    allowed one host-local sharding type), checked by the validator."""
    req = request(
        [
            table(name, rows=rows, dim=dim, pooling="none", optimizer="rowwise_adagrad")
            for name, (rows, dim) in cases.PLANNED_TABLES.items()
        ],
        world_size=world,
        topology={"local_world_size": local},
        constraints={
            "tables": {
                name: {"sharding_types": [kind.value], "min_partition": 4}
                for name, kind in cases.PLANNED_TYPES.items()
            }
        },
    )
    plan = solve(req, deadline=Deadline.never()).plan
    assert plan is not None and validate_plan(req, plan) == []
    return plan


@pytest.mark.parametrize(("world_size", "local"), [(2, 2), (4, 2)])
def test_a_planned_table_row_and_column_wise_sequence_plan_matches_the_unsharded_module(
    world_size, local
):
    plan = planned_host_local(world_size, local)
    kinds = {name: sharding.sharding_type for name, sharding in plan.tables.items()}
    assert kinds == cases.PLANNED_TYPES
    run_ranks(cases.planned, world_size, plan_bytes(plan))
