"""Sequence embeddings (``EmbeddingCollection``) sharded against the unsharded module on real
gloo process groups of 2, 3 and 4 spawned processes (scenarios in
tests/runtime/sequence_cases.py), and one plan sharding a model's pooled and sequence
collections together."""

from __future__ import annotations

import pytest

from tests.runtime import sequence_cases as cases
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
