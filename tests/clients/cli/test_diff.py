"""``shardplan diff``: what changes between two plans, the bytes that move, and the exit
codes a script can rely on (0 same, 1 different, 2 unreadable or tampered)."""

from __future__ import annotations

import json

import pytest

from planner_service.plan.codec import plan_bytes
from planner_service.plan.diff import diff_document, diff_plans
from planner_service.plan.types import ShardingType
from tests.support import builders
from tests.support.builders import request, table

ROWS, DIM = 1000, 256
ELEMENTS = ROWS * DIM  # of table "a"


@pytest.fixture
def req():
    return request([table("a", rows=ROWS, dim=DIM), table("b")], world_size=4)


def _plan(req, a, b=None):
    return builders.plan(req, {"a": a, "b": b or builders.table_wise(req, "b", 3)})


def test_a_shard_that_changes_rank_moves_all_its_bytes_once(req):
    old = _plan(req, builders.table_wise(req, "a", 0))
    new = _plan(req, builders.table_wise(req, "a", 2))
    diff = diff_plans(old, new)
    (change,) = diff.tables
    assert (change.name, change.status, change.changes) == ("a", "changed", ("ranks", "shards"))
    assert change.moved_elements == ELEMENTS and change.moved_bytes == 4 * ELEMENTS
    assert [(r.rank, r.bytes_in, r.bytes_out) for r in diff.ranks if r.changed] == [
        (0, 0, 4 * ELEMENTS),
        (2, 4 * ELEMENTS, 0),
    ]
    assert diff.unchanged_tables == 1 and not diff.identical


def test_what_a_rank_already_holds_does_not_move(req):
    """Column-wise halves on ranks 1 and 0 become row-wise over all 4 ranks: ranks 0 and 1
    keep the quarter of the table they held in both layouts; the rest arrives."""
    old = _plan(req, builders.column_wise(req, "a", [128, 128], [1, 0]))
    new = _plan(req, builders.row_wise(req, "a"))
    (change,) = diff_plans(old, new).tables
    assert change.changes == ("sharding_type", "ranks", "shards")
    kept = 2 * (ROWS // 4) * 128  # rank 0: rows 0-249 of columns 128-255; rank 1: the mirror
    assert change.moved_elements == ELEMENTS - kept


def test_replicating_a_table_moves_one_copy_per_new_rank(req):
    old = _plan(req, builders.table_wise(req, "a", 1))
    new = _plan(req, builders.data_parallel(req, "a"))
    diff = diff_plans(old, new)
    assert diff.moved_elements == 3 * ELEMENTS
    assert {r.rank: r.bytes_in for r in diff.ranks} == {
        0: 4 * ELEMENTS,
        1: 0,
        2: 4 * ELEMENTS,
        3: 4 * ELEMENTS,
    }


def test_element_sizes_come_from_the_request_when_given():
    req = request([table("a", rows=ROWS, dim=DIM, data_type="fp16"), table("b")], world_size=4)
    old = _plan(req, builders.table_wise(req, "a", 0))
    new = _plan(req, builders.table_wise(req, "a", 1))
    assert diff_plans(old, new).moved_bytes == 4 * ELEMENTS  # assumed fp32
    exact = diff_plans(old, new, req)
    assert exact.moved_bytes == 2 * ELEMENTS and exact.element_bytes_from_request


def test_added_and_removed_tables_are_listed_in_natural_order_and_move_nothing():
    names = ["t1", "t2", "t10"]
    old_req = request([table(n) for n in names], world_size=2)
    new_req = request([table(n) for n in ["t1", "t3", "t20"]], world_size=2)
    old = builders.plan(old_req, {n: builders.table_wise(old_req, n, 0) for n in names})
    new = builders.plan(
        new_req, {n: builders.table_wise(new_req, n, 0) for n in ["t1", "t3", "t20"]}
    )
    diff = diff_plans(old, new)
    assert [(t.name, t.status) for t in diff.tables] == [
        ("t2", "removed"),
        ("t3", "added"),
        ("t10", "removed"),
        ("t20", "added"),
    ]
    assert diff.moved_bytes == 0 and diff.unchanged_tables == 1


def test_the_json_document_has_its_documented_fields(req):
    old = _plan(req, builders.table_wise(req, "a", 0))
    new = _plan(req, builders.column_wise(req, "a", [128, 128], [0, 1]))
    document = diff_document(diff_plans(old, new)).model_dump(mode="json")
    assert list(document) == [
        "version",
        "identical",
        "old",
        "new",
        "element_bytes",
        "moved_bytes",
        "moved_elements",
        "unchanged_tables",
        "tables",
        "ranks",
        "totals",
    ]
    assert document["version"] == 2 and document["element_bytes"] == "assumed_fp32"
    (entry,) = document["tables"]
    assert entry["old"]["sharding_type"] == "table_wise"
    assert entry["new"] == {
        "sharding_type": "column_wise",
        "compute_kernel": "fused",
        "ranks": [0, 1],
        "shards": 2,
        "cache_load_factor": None,
    }
    assert entry["moved_bytes"] == document["moved_bytes"] == 4 * ROWS * 128  # rank 1's half
    assert [r["rank"] for r in document["ranks"]] == [0, 1]
    hbm = document["totals"]["hbm_bytes"]
    assert hbm["delta"] == hbm["new"] - hbm["old"]
    # byte counts stay integers in the JSON (no "1024.0"), times stay floats
    assert {type(hbm[key]) for key in hbm} == {int}
    assert {type(value) for value in document["totals"]["critical_path_ms"].values()} == {float}
    assert {type(value) for value in document["ranks"][0]["delta"].values()} == {int, float}
    assert set(document["totals"]) == {
        "hbm_bytes",
        "ddr_bytes",
        "max_rank_perf_ms",
        "critical_path_ms",
    }
    json.dumps(document, allow_nan=False)  # plain JSON


# --------------------------------------------------------------------------- the command


@pytest.fixture
def plan_files(req, tmp_path):
    old = _plan(req, builders.table_wise(req, "a", 0))
    new = _plan(req, builders.row_wise(req, "a"))
    paths = []
    for name, plan in [("old.json", old), ("new.json", new)]:
        path = tmp_path / name
        path.write_bytes(plan_bytes(plan))
        paths.append(path)
    return paths


def test_identical_plans_exit_0(run_cli, plan_files):
    old, _ = plan_files
    result = run_cli("diff", old, old)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("plans are identical")


def test_different_plans_exit_1_with_the_table_and_rank_changes(run_cli, plan_files):
    result = run_cli("diff", *plan_files)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "plans differ"
    assert "tables: 1 changed, 0 added, 0 removed, 1 unchanged" in lines
    row = next(line for line in lines if line.startswith("a "))
    cells = [cell.strip() for cell in row.split("|")]
    moved = f"{3 / 4 * 4 * ELEMENTS / 2**10:.2f} KiB"  # not "0.00" GiB
    assert cells == [
        "a",
        "changed",
        "table_wise -> row_wise",
        "fused",
        "0 -> 0-3",
        "1 -> 4",
        moved,
    ]
    assert any(line.startswith("max rank perf ms ") for line in lines)
    assert result.stderr == ""


def test_markdown_is_a_pull_request_comment(run_cli, plan_files):
    result = run_cli("diff", *plan_files, "--format", "markdown", "--top", "1")
    assert result.returncode == 1
    text = result.stdout
    assert text.startswith("**plans differ**\n\n- old ")
    assert "| table | status | sharding type | kernel | ranks | shards | moved |" in text
    assert "| a | changed | table_wise -> row_wise |" in text
    assert "more rank(s) changed (--top N shows N)" in text


def test_json_format_is_the_document(run_cli, plan_files, req):
    result = run_cli("diff", *plan_files, "--format", "json")
    assert result.returncode == 1
    document = json.loads(result.stdout)
    assert document["identical"] is False
    assert document["tables"][0]["new"]["sharding_type"] == ShardingType.ROW_WISE.value
    assert document["moved_elements"] == 3 * ELEMENTS // 4


def test_a_tampered_plan_is_refused_with_exit_2(run_cli, plan_files):
    old, new = plan_files
    document = json.loads(new.read_text())
    builders.move_shard(document["tables"]["a"], 0, 3)
    new.write_text(json.dumps(document))
    result = run_cli("diff", old, new)
    assert result.returncode == 2
    assert result.stderr.startswith(f"{new}: plan_id = '")
    assert "does not match the plan's content (sha256 " in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "(document): not valid JSON"),
        ('{"schema_version": "1.1"}', "plan_id: required field is missing"),
    ],
)
def test_an_unreadable_plan_is_refused_with_exit_2(run_cli, plan_files, content, expected):
    old, new = plan_files
    new.write_text(content)
    result = run_cli("diff", old, new)
    assert result.returncode == 2
    assert expected in result.stderr and "Traceback" not in result.stderr


def test_both_from_stdin_and_a_negative_top_are_usage_errors(run_cli, plan_files):
    both = run_cli("diff", "-", "-")
    assert both.returncode == 2
    assert "only one of old and new can be - (stdin)" in both.stderr
    negative = run_cli("diff", *plan_files, "--top", "-1")
    assert negative.returncode == 2
    assert "argument --top: must be a whole number, 0 or more, not '-1'" in negative.stderr
