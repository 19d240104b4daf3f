"""Checkpoints across plans: saved under one plan with torch.distributed.checkpoint, loaded
under another world size and other sharding types (tests/runtime/checkpoint_cases.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner_service.plan.codec import plan_bytes
from planner_service.plan.types import DataType, OptimizerType, ShardingType
from runtime.checkpoint import CheckpointError, CheckpointManifest, TableEntry
from tests.runtime import checkpoint_cases as cases
from tests.support import builders
from tests.support.distributed import run_ranks

# Slow lane: its subject is processes (started, killed, signalled) or multi-process runs.
pytestmark = pytest.mark.slow

# (old plan, old world size, new plan, new world size): the pairs issue 24 names, and two
# mixed plans that change the world size both ways.
# The mixed pairs run in every `make test`; the rest are marked slow (`make test-fast`
# leaves them out).
SLOW = pytest.mark.slow
PAIRS = [
    pytest.param("table_wise", 2, "row_wise", 3, marks=SLOW),
    pytest.param("column_wise", 4, "table_wise", 2, marks=SLOW),
    pytest.param("data_parallel", 2, "row_wise", 2, marks=SLOW),
    pytest.param("table_wise", 2, "column_wise", 3, marks=SLOW),
    ("mixed", 4, "mixed", 2),
    ("mixed", 2, "mixed", 3),
]


@pytest.mark.parametrize(("old", "old_world", "new", "new_world"), PAIRS)
def test_checkpoint_carries_state_to_another_plan(
    tmp_path: Path, old: str, old_world: int, new: str, new_world: int
) -> None:
    run_ranks(cases.old_side, old_world, old, str(tmp_path), False)
    run_ranks(cases.new_side, new_world, new, str(tmp_path), False)


@SLOW
def test_sequence_checkpoint_carries_state_to_another_plan(tmp_path: Path) -> None:
    run_ranks(cases.old_side, 2, "mixed", str(tmp_path), True)
    run_ranks(cases.new_side, 3, "mixed", str(tmp_path), True)


def test_model_checkpoint_carries_collections_and_dense_state(tmp_path: Path) -> None:
    run_ranks(cases.model_round_trip, 2, str(tmp_path), True)
    run_ranks(cases.model_round_trip, 3, str(tmp_path), False)


def test_checkpoint_refuses_what_does_not_fit(tmp_path: Path) -> None:
    run_ranks(cases.refusals, 2, str(tmp_path))


def test_manifest_is_sorted_json_with_enum_values_and_reads_back(tmp_path: Path) -> None:
    """``shardplan.json`` as the checkpoints of issue 24 wrote it: enums as their values,
    keys sorted, two-space indent."""
    entry = TableEntry(
        name="t",
        rows=10,
        dim=8,
        data_type=DataType.FP16,
        sharding_type=ShardingType.ROW_WISE,
    )
    manifest = CheckpointManifest(
        plan_id="abc",
        world_size=2,
        optimizer=OptimizerType.ADAM,
        optimizer_step=3,
        tables={"embedding_bags.t.weight": entry},
        dense=["dense.weight"],
    )
    table = {"data_type": "fp16", "dim": 8, "name": "t", "rows": 10, "sharding_type": "row_wise"}
    document = {
        "dense": ["dense.weight"],
        "format": "shardplan-checkpoint",
        "optimizer": "adam",
        "optimizer_step": 3,
        "plan_id": "abc",
        "tables": {"embedding_bags.t.weight": table},
        "version": 1,
        "world_size": 2,
    }
    assert manifest.to_text() == json.dumps(document, indent=2, sort_keys=True) + "\n"
    (tmp_path / "shardplan.json").write_text(manifest.to_text())
    assert CheckpointManifest.read(tmp_path) == manifest
    table["rows"] = "ten"
    (tmp_path / "shardplan.json").write_text(json.dumps(document))
    with pytest.raises(CheckpointError, match=r"embedding_bags\.t\.weight`?\.rows"):
        CheckpointManifest.read(tmp_path)


# (old plan, new plan, world size): resharding in place keeps the process group.
IN_PLACE = [
    pytest.param("table_wise", "row_wise", 3, False, marks=SLOW),
    pytest.param("column_wise", "table_wise", 4, False, marks=SLOW),
    pytest.param("data_parallel", "row_wise", 2, False, marks=SLOW),
    pytest.param("table_wise", "column_wise", 3, False, marks=SLOW),
    ("mixed", "row_wise", 4, False),
    ("mixed", "table_wise", 3, True),
]


@pytest.mark.parametrize(("old", "new", "world", "sequence"), IN_PLACE)
def test_reshard_in_place_moves_exactly_the_transfers(
    old: str, new: str, world: int, sequence: bool
) -> None:
    run_ranks(cases.in_place, world, old, new, sequence)


def test_reshard_a_model_in_place() -> None:
    run_ranks(cases.model_in_place, 2)


def test_reshard_moves_what_shardplan_migrate_prints(tmp_path: Path, run_cli) -> None:
    req = builders.request(
        [
            builders.table("a", rows=120, dim=16),
            builders.table("b", rows=10, dim=8),
            builders.table("c", rows=33, dim=12),
        ],
        world_size=3,
    )
    old = builders.plan(
        req,
        {
            "a": builders.table_wise(req, "a", 0),
            "b": builders.column_wise(req, "b", [4, 4], [1, 2]),
            "c": builders.data_parallel(req, "c"),
        },
    )
    new = builders.plan(
        req,
        {
            "a": builders.row_wise(req, "a"),
            "b": builders.table_wise(req, "b", 0),
            "c": builders.row_wise(req, "c"),
        },
    )
    paths = {}
    for name, content in [("old", plan_bytes(old)), ("new", plan_bytes(new))]:
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_bytes(content)
    paths["request"] = tmp_path / "request.json"
    paths["request"].write_text(req.model_dump_json())
    printed = run_cli(
        "migrate", paths["old"], paths["new"], "--optimizer", "rowwise_adagrad", "--format", "json"
    )
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout)["moved_bytes"] > 0
    paths["printed"] = tmp_path / "migrate.json"
    paths["printed"].write_text(printed.stdout)
    args = [str(paths[k]) for k in ("old", "new", "request", "printed")]
    run_ranks(cases.as_migrate_prints, 3, *args)
