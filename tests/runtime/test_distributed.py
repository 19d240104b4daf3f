"""The sharded runtime against the unsharded module, on real gloo process groups of 2, 3 and
4 spawned processes (scenarios in tests/runtime/cases.py: every sharding type alone and a
mixed plan with several column shards of one table on one rank, fewer rows than ranks,
empty bags, ids on row-block boundaries, weighted features and mean pooling)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.runtime import cases as runtime_cases
from tests.support.distributed import run_ranks
from tests.support.servers import Service

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad", "adam"])
def test_outputs_and_three_training_steps_match_the_unsharded_module(world_size, optimizer):
    run_ranks(runtime_cases.equivalence, world_size, optimizer, None)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_state_dict_offsets_full_load_and_gather_round_trip(world_size):
    run_ranks(runtime_cases.state_round_trip, world_size)


def test_tables_named_like_module_attributes_shard_train_and_round_trip():
    run_ranks(runtime_cases.attribute_names, 2)


def test_table_row_wise_reduces_inside_the_host_then_crosses_hosts():
    run_ranks(runtime_cases.exchange_layout, 4)


@pytest.mark.parametrize("world_size", [4, 6])
def test_table_row_wise_on_one_some_all_or_no_hosts_matches_the_unsharded_module(world_size):
    run_ranks(runtime_cases.table_row_wise_on_hosts, world_size)


def test_subgroup_creation_that_cannot_complete_fails_naming_the_ranks():
    run_ranks(runtime_cases.subgroup_deadline, 4)


def test_plan_for_another_world_size_is_refused_on_every_rank():
    run_ranks(runtime_cases.plan_mismatch, 2)


def test_a_failing_rank_fails_the_run_with_its_message():
    with pytest.raises(Exception, match=r"PlanMismatchError.*world_size 3"):
        run_ranks(runtime_cases.plan_mismatch_expecting_success, 2)


def test_ranks_fetch_a_solved_plan_from_the_service_and_match(shardplan_exe, tmp_path):
    request = {
        "topology": {"world_size": 2, "compute_device": "cpu", "hbm_bytes": 2**30},
        "tables": [
            {"name": f"t{i}", "num_embeddings": 50 + 40 * i, "embedding_dim": 8 * (i + 1)}
            for i in range(5)
        ],
        "options": {"time_limit_s": 1},
    }
    body = json.dumps(request)
    server = Service(shardplan_exe, tmp_path / "server.log", db=str(tmp_path / "p.db")).start()
    try:
        created = httpx.post(f"{server.base}/v1/plans", content=body, timeout=60)
        assert created.status_code == 201, created.text
        alias = httpx.put(
            f"{server.base}/v1/aliases/model",
            json={"plan_id": created.json()["plan_id"]},
            timeout=30,
        )
        assert alias.status_code == 201, alias.text
        run_ranks(runtime_cases.fetch_and_check, 2, f"{server.base}/v1/aliases/model", body)
    finally:
        server.stop()
