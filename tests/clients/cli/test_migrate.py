"""``shardplan migrate``: the bytes that move between which ranks to go from one plan to
another (the regions of ``plan.transfers.plan_transfers``), for every resharding pair of issue
24, with the same totals as ``shardplan diff``, and its errors (exit 2, no traceback)."""

from __future__ import annotations

import json

import pytest

from clients.cli.migrate import OPTIMIZERS
from planner_service.plan.codec import plan_bytes
from planner_service.plan.types import OptimizerType
from tests.support import builders
from tests.support.builders import request, table

ROWS, DIM = 120, 16
ROW = DIM * 4  # bytes of one fp32 row


def _reqs(old_world: int, new_world: int, **fields):
    tables = [table("a", rows=ROWS, dim=DIM, **fields), table("b", rows=10, dim=8)]
    return request(tables, world_size=old_world), request(tables, world_size=new_world)


def _write(tmp_path, old, new, new_req=None):
    paths = []
    for name, plan in [("old.json", old), ("new.json", new)]:
        path = tmp_path / name
        path.write_bytes(plan_bytes(plan))
        paths.append(path)
    if new_req is not None:
        path = tmp_path / "request.json"
        path.write_text(new_req.model_dump_json())
        paths.append(path)
    return paths


def _files(tmp_path, old_world, new_world, old_a, new_a, **fields):
    """Plans in which only table ``a`` changes, from ``old_a(request)`` to
    ``new_a(request)`` (``b`` stays on rank 0), and the new plan's request."""
    old_req, new_req = _reqs(old_world, new_world, **fields)
    old = builders.plan(old_req, {"a": old_a(old_req), "b": builders.table_wise(old_req, "b", 0)})
    new = builders.plan(new_req, {"a": new_a(new_req), "b": builders.table_wise(new_req, "b", 0)})
    return _write(tmp_path, old, new, new_req)


def table_wise(rank):
    return lambda req: builders.table_wise(req, "a", rank)


def column_wise(widths, ranks):
    return lambda req: builders.column_wise(req, "a", widths, ranks)


def row_wise(req):
    return builders.row_wise(req, "a")


def data_parallel(req):
    return builders.data_parallel(req, "a")


def _json(run_cli, *args):
    result = run_cli("migrate", *args, "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _regions(document):
    """Every region as (src, dst, table, rows, cols, bytes), pairs as the document orders
    them."""
    return [
        (pair["src"], pair["dst"], entry["table"], *region.values())
        for pair in document["pairs"]
        for entry in pair["tables"]
        for region in entry["regions"]
    ]


def _ranks(document):
    return {r["rank"]: (r["sent_bytes"], r["received_bytes"]) for r in document["ranks"]}


def test_table_wise_to_row_wise_in_text(run_cli, tmp_path):
    old, new, _ = _files(tmp_path, 4, 4, table_wise(2), row_wise)
    result = run_cli("migrate", old, new)
    assert result.returncode == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[2].startswith("bytes: weights at 4 bytes (fp32), no optimizer state (sgd); ")
    assert lines[3] == (
        f"moved: {90 * ROW / 1024:.2f} KiB ({90 * ROW} bytes), 3 region(s) of 1 table(s) "
        "between 3 pair(s) of ranks"
    )
    assert "world size changes" not in result.stdout
    rows = [[cell.strip() for cell in line.split("|")] for line in lines if "|" in line]
    assert [(cells[0], cells[2], cells[3]) for cells in rows if " -> " in cells[0]] == [
        ("from -> to", "bytes", "tables"),
        ("2 -> 0", str(30 * ROW), "a"),
        ("2 -> 1", str(30 * ROW), "a"),
        ("2 -> 3", str(30 * ROW), "a"),
    ]
    ranks = [cells for cells in rows if cells[0].isdigit()]
    assert [cells[0] for cells in ranks] == ["0", "1", "2", "3"]
    assert ranks[2][3:] == [str(90 * ROW), "0"]  # rank 2 sends 3 blocks, keeps rows 60-89
    assert ranks[0][3:] == ["0", str(30 * ROW)]


def test_column_wise_to_table_wise_moves_the_other_ranks_columns(run_cli, tmp_path):
    paths = _files(tmp_path, 2, 2, column_wise([4, 12], [0, 1]), table_wise(0))
    document = _json(run_cli, *paths[:2])
    assert _regions(document) == [(1, 0, "a", [0, ROWS], [4, DIM], ROWS * 12 * 4)]
    assert _ranks(document) == {0: (0, ROWS * 12 * 4), 1: (ROWS * 12 * 4, 0)}


def test_data_parallel_on_2_ranks_to_row_wise_on_4(run_cli, tmp_path):
    old, new, _ = _files(tmp_path, 2, 4, data_parallel, row_wise)
    text = run_cli("migrate", old, new)
    assert text.returncode == 0
    assert "world size changes: 2 -> 4 ranks" in text.stdout.splitlines()
    document = _json(run_cli, old, new)
    assert (document["old"]["world_size"], document["new"]["world_size"]) == (2, 4)
    assert _regions(document) == [
        (0, 2, "a", [60, 90], [0, DIM], 30 * ROW),  # from replica 2 mod 2
        (1, 3, "a", [90, 120], [0, DIM], 30 * ROW),  # from replica 3 mod 2
    ]


def test_row_wise_over_2_ranks_to_3(run_cli, tmp_path):
    paths = _files(tmp_path, 2, 3, row_wise, row_wise)
    document = _json(run_cli, *paths[:2])
    assert _regions(document) == [
        (1, 2, "a", [80, 120], [0, DIM], 40 * ROW),  # the most bytes first
        (0, 1, "a", [40, 60], [0, DIM], 20 * ROW),
    ]
    assert _ranks(document) == {0: (20 * ROW, 0), 1: (40 * ROW, 20 * ROW), 2: (0, 40 * ROW)}


def test_row_wise_over_4_ranks_to_2(run_cli, tmp_path):
    old, new, _ = _files(tmp_path, 4, 2, row_wise, row_wise)
    assert "world size changes: 4 -> 2 ranks" in run_cli("migrate", old, new).stdout
    document = _json(run_cli, old, new)
    assert _regions(document) == [
        (1, 0, "a", [30, 60], [0, DIM], 30 * ROW),
        (2, 1, "a", [60, 90], [0, DIM], 30 * ROW),
        (3, 1, "a", [90, 120], [0, DIM], 30 * ROW),
    ]
    assert len(document["ranks"]) == 4  # every rank of either plan
    assert _ranks(document)[3] == (30 * ROW, 0)


def test_identical_plans_move_nothing_and_exit_0(run_cli, tmp_path):
    old, _, _ = _files(tmp_path, 4, 4, row_wise, row_wise)
    result = run_cli("migrate", old, old)
    assert result.returncode == 0
    assert result.stdout.splitlines()[-1] == (
        "nothing moves: every rank already holds what the new plan places on it"
    )
    document = _json(run_cli, old, old)
    assert document["moved_bytes"] == 0 and document["pairs"] == []
    assert document["tables_moved"] == []


PAIRS = [
    # (sharding type of "a" in the old plan, its world size, in the new plan, its world size)
    ("table_wise", 4, "row_wise", 4),
    ("column_wise", 4, "table_wise", 4),
    ("data_parallel", 2, "row_wise", 4),
    ("row_wise", 2, "row_wise", 3),
    ("row_wise", 4, "row_wise", 2),
    ("column_wise", 4, "row_wise", 2),
]


@pytest.mark.parametrize(("before", "old_world", "after", "new_world"), PAIRS)
def test_the_totals_are_what_diff_counts(run_cli, tmp_path, before, old_world, after, new_world):
    """The same plans through ``shardplan diff --request`` and ``shardplan migrate
    --request``: the same moved bytes, and every rank the same bytes sent and received."""
    tables = [
        table("a", rows=1000, dim=64, optimizer="rowwise_adagrad"),
        table("c", rows=300, dim=32, data_type="fp16", optimizer="adam"),
    ]
    old_req = request(tables, world_size=old_world)
    new_req = request(tables, world_size=new_world)
    layouts = {
        "table_wise": table_wise(1),
        "row_wise": row_wise,
        "column_wise": column_wise([16, 48], [1, 0]),
        "data_parallel": data_parallel,
    }
    old = builders.plan(
        old_req, {"a": layouts[before](old_req), "c": builders.data_parallel(old_req, "c")}
    )
    new = builders.plan(
        new_req, {"a": layouts[after](new_req), "c": builders.row_wise(new_req, "c")}
    )
    paths = _write(tmp_path, old, new, new_req)
    document = _json(run_cli, *paths[:2], "--request", paths[2])
    diff = run_cli("diff", *paths[:2], "--request", paths[2], "--format", "json")
    assert diff.returncode == 1, diff.stderr
    expected = json.loads(diff.stdout)
    assert document["moved_bytes"] == expected["moved_bytes"] > 0
    assert document["moved_elements"] == expected["moved_elements"]
    assert document["element_bytes"] == "request" and document["optimizer"] == "request"
    by_rank = {r["rank"]: (r["bytes_sent"], r["bytes_in"]) for r in expected["ranks"]}
    assert {rank: moved for rank, moved in _ranks(document).items() if any(moved)} == {
        rank: moved for rank, moved in by_rank.items() if any(moved)
    }
    assert sum(pair["bytes"] for pair in document["pairs"]) == document["moved_bytes"]


@pytest.mark.parametrize(
    ("optimizer", "state_per_region"),
    [
        ("sgd", 0),
        ("rowwise_adagrad", 4 * ROWS),  # one fp32 per row of each region, column shards too
        ("adagrad", 4 * ROWS * 8),  # one per element
        ("adam", 8 * ROWS * 8),  # two per element
    ],
)
def test_optimizer_state_moves_with_every_region(run_cli, tmp_path, optimizer, state_per_region):
    """Two column halves of 8 columns swap ranks: two regions of ROWS x 8."""
    # the request says adam: --optimizer overrides it
    swapped = column_wise([8, 8], [0, 1]), column_wise([8, 8], [1, 0])
    paths = _files(tmp_path, 2, 2, *swapped, optimizer="adam")
    for extra in ([], ["--request", paths[2]]):  # fp32 either way
        document = _json(run_cli, *paths[:2], "--optimizer", optimizer, *extra)
        assert document["optimizer"] == optimizer
        assert [region[-1] for region in _regions(document)] == [
            ROWS * 8 * 4 + state_per_region
        ] * 2


def test_the_request_gives_data_types_and_optimizers(run_cli, tmp_path):
    paths = _files(
        tmp_path, 2, 2, table_wise(0), table_wise(1), data_type="fp16", optimizer="rowwise_adagrad"
    )
    assert _json(run_cli, *paths[:2])["moved_bytes"] == ROWS * DIM * 4  # assumed fp32, sgd
    exact = _json(run_cli, *paths[:2], "--request", paths[2])
    assert exact["moved_bytes"] == ROWS * DIM * 2 + ROWS * 4
    text = run_cli("migrate", *paths[:2], "--request", paths[2]).stdout
    assert "weights at the tables' data types (--request), their optimizers' state" in text


def test_the_json_document_has_its_documented_fields(run_cli, tmp_path):
    old_req = request([table("a", rows=ROWS, dim=DIM), table("gone")], world_size=2)
    new_req = request([table("a", rows=ROWS, dim=DIM), table("fresh")], world_size=2)
    old = builders.plan(
        old_req,
        {
            "a": builders.table_wise(old_req, "a", 0),
            "gone": builders.table_wise(old_req, "gone", 0),
        },
    )
    new = builders.plan(
        new_req,
        {"a": builders.row_wise(new_req, "a"), "fresh": builders.table_wise(new_req, "fresh", 1)},
    )
    paths = _write(tmp_path, old, new)
    document = _json(run_cli, *paths)
    assert list(document) == [
        "version",
        "old",
        "new",
        "element_bytes",
        "optimizer",
        "moved_bytes",
        "moved_elements",
        "tables_moved",
        "tables_added",
        "tables_removed",
        "pairs",
        "ranks",
    ]
    assert document["version"] == 1
    assert document["old"] == {"plan_id": old.plan_id, "world_size": 2, "tables": 2}
    assert (document["element_bytes"], document["optimizer"]) == ("assumed_fp32", "sgd")
    assert (document["moved_bytes"], document["moved_elements"]) == (60 * ROW, 60 * DIM)
    assert document["tables_moved"] == ["a"]
    assert (document["tables_added"], document["tables_removed"]) == (["fresh"], ["gone"])
    assert document["pairs"] == [
        {
            "src": 0,
            "dst": 1,
            "bytes": 60 * ROW,
            "tables": [
                {
                    "table": "a",
                    "bytes": 60 * ROW,
                    "regions": [{"rows": [60, 120], "cols": [0, DIM], "bytes": 60 * ROW}],
                }
            ],
        }
    ]
    assert document["ranks"] == [
        {"rank": 0, "sent_bytes": 60 * ROW, "received_bytes": 0},
        {"rank": 1, "sent_bytes": 0, "received_bytes": 60 * ROW},
    ]
    text = run_cli("migrate", *paths).stdout
    assert "tables: 1 added (made new, not moved), 1 removed (dropped)" in text


def test_many_pairs_show_the_top_n(run_cli, tmp_path):
    old, new, _ = _files(tmp_path, 4, 4, table_wise(0), data_parallel)
    result = run_cli("migrate", old, new, "--top", "1")
    assert result.returncode == 0
    assert "2 more pair(s) (--top N shows N)" in result.stdout
    assert "0 -> 1 " in result.stdout and "0 -> 2 " not in result.stdout


def test_the_optimizer_choices_are_the_request_formats():
    assert list(OPTIMIZERS) == [optimizer.value for optimizer in OptimizerType]


# --------------------------------------------------------------------------- errors


@pytest.fixture
def plan_files(tmp_path):
    return _files(tmp_path, 2, 2, table_wise(0), row_wise)


def _refused(result, *expected):
    assert result.returncode == 2
    assert result.stdout == "" and "Traceback" not in result.stderr
    for text in expected:
        assert text in result.stderr


def test_a_missing_file_is_refused(run_cli, plan_files, tmp_path):
    missing = tmp_path / "missing.json"
    _refused(
        run_cli("migrate", missing, plan_files[1]),
        f"{missing}: (document): cannot read file: No such file",
    )


def test_a_tampered_plan_is_refused(run_cli, plan_files):
    old, new, _ = plan_files
    document = json.loads(new.read_text())
    builders.move_shard(document["tables"]["a"], 0, 1)
    new.write_text(json.dumps(document))
    _refused(run_cli("migrate", old, new), f"{new}: plan_id = '", "does not match the plan's")


def test_an_unknown_optimizer_is_refused_naming_the_accepted_ones(run_cli, plan_files):
    _refused(
        run_cli("migrate", *plan_files[:2], "--optimizer", "lamb"),
        "argument --optimizer: invalid choice: 'lamb' (choose from 'sgd', 'rowwise_adagrad', "
        "'adagrad', 'adam')",
    )


def test_a_request_the_new_plan_was_not_made_from_is_refused(run_cli, plan_files, tmp_path):
    other = tmp_path / "other.json"
    other.write_text(request([table("a", rows=ROWS, dim=DIM)], world_size=2).model_dump_json())
    _refused(
        run_cli("migrate", *plan_files[:2], "--request", other),
        "--request: request_hash = '",
        "is not the request the new plan was made from",
    )
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    _refused(run_cli("migrate", *plan_files[:2], "--request", broken), f"{broken}: ")


def test_both_from_stdin_and_a_negative_top_are_usage_errors(run_cli, plan_files):
    _refused(run_cli("migrate", "-", "-"), "only one of old and new can be - (stdin)")
    _refused(
        run_cli("migrate", *plan_files[:2], "--top", "-1"),
        "argument --top: must be a whole number, 0 or more, not '-1'",
    )
