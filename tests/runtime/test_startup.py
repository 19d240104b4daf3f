"""``runtime.load_plan`` on two spawned processes joined by gloo, against a real
``shardplan serve`` on loopback: by id, by alias and from a file, rank 0 fetching or every
rank; and the failures, each an error on every rank within its deadline (the service not
listening, a file whose content is not its address, ranks holding different plans, a peer
that never calls load_plan)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from clients.http import PlannerClient
from planner_service.plan.codec import plan_bytes
from planner_service.plan.compact import expand_plan
from planner_service.solve.pipeline import solve
from runtime import PlanLoadError, load_plan
from tests.support.builders import request, table
from tests.support.distributed import run_ranks
from tests.support.servers import free_port, started_service

# Slow lane: its subject is processes (started, killed, signalled) or multi-process runs.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TOKEN = "trainer-token-0123456789"
DEADLINE_S = 6.0


@pytest.fixture(scope="module")
def stored(shardplan_exe, tmp_path_factory):
    """A service holding two plans, alias ``job`` on the first, and both as files:
    (base URL, [plan bytes], [file paths])."""
    directory = tmp_path_factory.mktemp("startup-service")
    server = started_service(shardplan_exe, directory, {"SHARDPLAN_API_TOKENS": f"t:{TOKEN}"})
    try:
        plans, files = [], []
        with PlannerClient(server.base, token=TOKEN) as client:
            for i, name in enumerate(["a", "b"]):
                req = request(
                    [table(f"{name}1", rows=1000), table(f"{name}2", dim=32)], world_size=2
                )
                plan = client.create_plan(json.loads(req.model_dump_json()))
                plans.append(plan_bytes(plan))
                files.append(str(directory / f"plan{i}.json"))
                Path(files[-1]).write_bytes(plans[-1])
            client.set_alias("job", json.loads(plans[0])["plan_id"])
        yield server.base, plans, files
    finally:
        server.stop()


# ----------------------------------------------------------------- what each rank runs


def loads(rank: int, world: int, sources: list[str], server: str, every: bool, want: bytes) -> None:
    for source in sources:
        plan = load_plan(source, server=server, every_rank=every, deadline_s=DEADLINE_S)
        assert plan_bytes(plan) == want, (rank, source)


def loads_both_forms(rank: int, world: int, compact_file: str, expanded_file: str) -> None:
    """A 2.0 plan (runs) and its 1.x expansion load to the same shards on every rank, and
    the rank's own shards are the expansion's shards on that rank."""
    compact = load_plan(compact_file, deadline_s=DEADLINE_S)
    expanded = load_plan(expanded_file, deadline_s=DEADLINE_S)
    assert (compact.schema_version, expanded.schema_version) == ("2.0", "1.1")
    for name, sharding in compact.tables.items():
        listed = expanded.tables[name].shards
        assert sharding.shards == listed, (rank, name)
        mine = [(i, shard) for i, shard in enumerate(listed) if shard.rank == rank]
        assert sharding.shards_on(rank) == mine, (rank, name)


def fails(rank: int, world: int, sources: list[str], server: str, every: bool, says: list) -> None:
    """Rank r loads ``sources[r]`` and must get PlanLoadError containing every ``says``."""
    try:
        load_plan(sources[rank], server=server, every_rank=every, deadline_s=DEADLINE_S)
    except PlanLoadError as error:
        for part in says:
            assert part in str(error), f"rank {rank}: {part!r} not in {error}"
    else:
        raise AssertionError(f"rank {rank} loaded a plan")


def late_peer(rank: int, world: int, source: str) -> None:
    """Rank 1 arrives after rank 0's deadline has passed; rank 0 must name it."""
    if rank == 1:
        time.sleep(3 * 2.0)
    try:
        load_plan(source, deadline_s=2.0)
    except PlanLoadError as error:
        if rank == 0:
            assert "ranks [1] never called load_plan" in str(error), str(error)
            assert error.ranks == [1]
    else:
        raise AssertionError(f"rank {rank} loaded a plan without its peer")


# ----------------------------------------------------------------- tests


@pytest.mark.parametrize("every", [False, True], ids=["rank0-broadcasts", "every-rank"])
def test_every_rank_gets_the_stored_plan_by_id_alias_and_file(stored, every):
    base, plans, files = stored
    plan_id = json.loads(plans[0])["plan_id"]
    run_ranks(loads, 2, [plan_id, "alias:job", files[0]], base, every, plans[0], timeout_s=120)


def test_a_plan_of_runs_loads_to_the_shards_of_its_expansion(tmp_path):
    req = request(
        [table("wide", rows=1000, dim=64), table("long", rows=10_001), table("one")],
        world_size=2,
        constraints={
            "tables": {
                "wide": {"sharding_types": ["column_wise"]},
                "long": {"sharding_types": ["row_wise"]},
            }
        },
    )
    plan = solve(req).plan
    assert plan is not None
    files = [tmp_path / "runs.json", tmp_path / "listed.json"]
    files[0].write_bytes(plan_bytes(plan))
    files[1].write_bytes(plan_bytes(expand_plan(plan)))
    run_ranks(loads_both_forms, 2, str(files[0]), str(files[1]), timeout_s=120)


def test_service_not_listening_fails_every_rank_with_rank_0s_reason(stored):
    _, plans, _ = stored
    nowhere = f"http://127.0.0.1:{free_port()}"
    says = ["rank 0 could not load plan 'alias:job'", "no answer after 4 attempt(s)"]
    run_ranks(fails, 2, ["alias:job"] * 2, nowhere, False, says, timeout_s=120)


def test_a_file_whose_content_is_not_its_address_fails_every_rank(stored, tmp_path):
    _, plans, _ = stored
    document = json.loads(plans[0])
    document["planner_version"] = "tampered"
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(document))
    says = ["rank 0", "but its content hashes to"]
    run_ranks(fails, 2, [str(path)] * 2, "", False, says, timeout_s=120)
    run_ranks(fails, 2, [str(path)] * 2, "", True, ["ranks [0, 1]", *says], timeout_s=120)


def test_ranks_holding_different_plans_are_named(stored):
    _, plans, files = stored
    ids = [json.loads(p)["plan_id"] for p in plans]
    says = ["ranks [1] differ", f"ranks [0] hold plan {ids[0]}", f"ranks [1] hold plan {ids[1]}"]
    run_ranks(fails, 2, files, "", True, says, timeout_s=120)


def test_a_peer_that_never_arrives_is_named_within_the_deadline(stored):
    _, _, files = stored
    run_ranks(late_peer, 2, files[0], timeout_s=120)


def test_one_process_without_a_group_loads_and_refuses(stored, tmp_path, monkeypatch):
    monkeypatch.delenv("SHARDPLAN_SERVER", raising=False)
    _, plans, files = stored
    assert plan_bytes(load_plan(files[0], deadline_s=DEADLINE_S)) == plans[0]
    with pytest.raises(PlanLoadError, match="cannot read the plan file"):
        load_plan(str(tmp_path / "absent.json"), deadline_s=DEADLINE_S)
    with pytest.raises(PlanLoadError, match=r"SHARDPLAN_SERVER"):
        load_plan("alias:job", deadline_s=DEADLINE_S)


def test_an_uncaught_plan_load_error_ends_the_worker_non_zero(tmp_path):
    import subprocess
    import sys

    script = f"from runtime import load_plan; load_plan({str(tmp_path / 'absent.json')!r})"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "PlanLoadError: cannot load plan" in done.stderr
    assert "absent.json': cannot read the plan file: No such file" in done.stderr, done.stderr
