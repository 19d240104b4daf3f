"""The sharded runtime against the unsharded module, on real gloo process groups of 2, 3 and
4 spawned processes (scenarios in tests/runtime_cases.py: every sharding type alone and a
mixed plan with several column shards of one table on one rank, fewer rows than ranks,
empty bags, ids on row-block boundaries, weighted features and mean pooling)."""

from __future__ import annotations

import pytest

from tests import runtime_cases
from tests.distributed import run_ranks


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_outputs_and_three_training_steps_match_the_unsharded_module(world_size, optimizer):
    run_ranks(runtime_cases.equivalence, world_size, optimizer, None)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_state_dict_offsets_full_load_and_gather_round_trip(world_size):
    run_ranks(runtime_cases.state_round_trip, world_size)


def test_plan_for_another_world_size_is_refused_on_every_rank():
    run_ranks(runtime_cases.plan_mismatch, 2)


def test_a_failing_rank_fails_the_run_with_its_message():
    with pytest.raises(Exception, match="a plan for the wrong world size was accepted|world_size"):
        run_ranks(runtime_cases.plan_mismatch_expecting_success, 2)
