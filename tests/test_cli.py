"""The ``shardplan`` command line, run as the installed console script."""

from __future__ import annotations

import json

import pytest

from planner_service.codec import plan_bytes
from planner_service.types import ShardingPlan
from tests import builders
from tests.builders import request, table


@pytest.fixture
def files(tmp_path):
    req = request([table("a", dim=256), table("b")], world_size=2)
    plan = builders.plan(
        req,
        {"a": builders.column_wise(req, "a", [128, 128], [1, 0]), "b": builders.row_wise(req, "b")},
    )
    request_path = tmp_path / "request.json"
    plan_path = tmp_path / "plan.json"
    request_path.write_text(req.model_dump_json())
    plan_path.write_bytes(plan_bytes(plan))
    return request_path, plan_path, plan


def test_validate_valid_plan(run_cli, files):
    request_path, plan_path, plan = files
    result = run_cli("validate", request_path, plan_path)
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.strip() == f"valid: plan {plan.plan_id[:12]} places 2 table(s) on 2 rank(s)"
    )


def test_validate_invalid_plan_one_line_per_violation(run_cli, files, tmp_path):
    request_path, plan_path, _ = files
    document = json.loads(plan_path.read_text())
    document["tables"]["a"]["shards"][1]["rank"] = 5
    document["rank_stats"][0]["hbm_bytes"] = 10**15
    plan_path.write_text(json.dumps(document))
    result = run_cli("validate", request_path, plan_path)
    assert result.returncode == 1
    lines = result.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "plan_id_mismatch",
        "rank_out_of_range",
        "ranks_mismatch",
        "rank_stats",
    ]
    assert "table 'a': shard 1 is on rank 5, but ranks are 0..1" in lines[1]
    assert "rank 0 reports hbm_bytes 1,000,000,000,000,000 (the shards use" in lines[3]
    assert "invalid: 4 violation(s)" in result.stderr


def test_validate_refuses_a_plan_made_for_another_batch_size(run_cli, files, tmp_path):
    """A plan solved for batch_size 512 was "valid" for a request with batch_size 4096."""
    request_path, plan_path, plan = files
    document = json.loads(request_path.read_text())
    document["batch_size"] = 4096
    bigger = tmp_path / "bigger.json"
    bigger.write_text(json.dumps(document))
    result = run_cli("validate", bigger, plan_path)
    assert result.returncode == 1
    first = result.stdout.splitlines()[0]
    assert first.startswith("request_hash_mismatch: ") and plan.request_hash in first


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "request.json: (document): not valid JSON: Expecting property name"),
        (
            '{"topology": {"world_size": 2}, "tables": [{"name": "a", "num_embeddings": -3, "embedding_dim": 4}]}',
            "tables[0].num_embeddings = -3: Input should be greater than or equal to 1",
        ),
        (
            '{"topology": {"world_size": 2}, "tables": [{"name": "a", "num_embeddings": 3, "embedding_dim": 0}]}',
            "tables[0].embedding_dim = 0",
        ),
        (
            '{"topology": {"world_size": 0}, "tables": [{"name": "a", "num_embeddings": 3, "embedding_dim": 4}]}',
            "topology.world_size = 0",
        ),
        (
            '{"topology": {"world_size": 4, "local_world_size": 3}, "tables": [{"name": "a", "num_embeddings": 3, "embedding_dim": 4}]}',
            "local_world_size 3 does not divide world_size 4",
        ),
        (
            '{"topology": {"world_size": 2}, "tables": [{"name": "a", "num_embeddings": 3, "embedding_dim": 4, "size": 1}]}',
            "tables[0].size = 1: unknown field",
        ),
        (
            '{"topology": {"world_size": 2}, "tables": [{"name": "a", "num_embeddings": 3, "embedding_dim": 4}, {"name": "a", "num_embeddings": 3, "embedding_dim": 4}]}',
            "tables[1].name 'a' duplicates tables[0].name",
        ),
        (
            '{"topology": {"world_size": 2}, "tables": [{"name": "a", "num_embeddings": 3, "embedding_dim": 4, "feature_names": ["f"]}, {"name": "b", "num_embeddings": 3, "embedding_dim": 4, "feature_names": ["f"]}]}',
            "uses feature 'f', already used by tables[0]",
        ),
    ],
)
def test_bad_request_exits_2_with_clear_message(run_cli, files, content, expected):
    request_path, plan_path, _ = files
    request_path.write_text(content)
    result = run_cli("validate", request_path, plan_path)
    assert result.returncode == 2
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"{request_path}: ")


def test_missing_file_and_bad_plan_version(run_cli, files, tmp_path):
    request_path, plan_path, _ = files
    missing = run_cli("validate", request_path, tmp_path / "nope.json")
    assert missing.returncode == 2
    assert "nope.json: (document): cannot read file: No such file or directory" in missing.stderr
    document = json.loads(plan_path.read_text())
    document["schema_version"] = "9.0"
    plan_path.write_text(json.dumps(document))
    future = run_cli("validate", request_path, plan_path)
    assert future.returncode == 2
    assert "schema_version = '9.0': this shardplan reads plan schema 1.x" in future.stderr
    assert "Traceback" not in missing.stderr + future.stderr


def test_usage_errors_exit_2(run_cli):
    result = run_cli("validate", "only-one.json")
    assert result.returncode == 2
    assert "the following arguments are required: plan" in result.stderr


def test_schema_prints_both_json_schemas(run_cli):
    result = run_cli("schema")
    assert result.returncode == 0
    schemas = json.loads(result.stdout)
    assert set(schemas) == {"PlanRequest", "ShardingPlan"}
    assert schemas["ShardingPlan"] == ShardingPlan.model_json_schema()
    assert "world_size" in schemas["PlanRequest"]["$defs"]["Topology"]["properties"]
    only = json.loads(run_cli("schema", "--model", "plan").stdout)
    assert list(only) == ["ShardingPlan"]


# --------------------------------------------------------------------------- plan


def _write_request(tmp_path, document) -> str:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(document))
    return str(path)


def test_plan_writes_a_valid_plan(run_cli, tmp_path):
    path = _write_request(
        tmp_path,
        {
            "topology": {"world_size": 4, "local_world_size": 2},
            "tables": [
                {"name": f"t{i}", "num_embeddings": 10**5 * (i + 1), "embedding_dim": 64}
                for i in range(6)
            ],
            "options": {"time_limit_s": 1},
        },
    )
    out = tmp_path / "plan.json"
    result = run_cli("plan", path, "--output", out)
    assert result.returncode == 0, result.stderr
    assert out.read_text().strip() == result.stdout.strip()
    plan = json.loads(result.stdout)
    assert plan["solver"]["objective"] >= plan["solver"]["lower_bound"]
    assert "gap" in result.stderr and result.stderr.startswith(plan["solver"]["status"])
    validated = run_cli("validate", path, out)
    assert validated.returncode == 0, validated.stdout


def test_plan_table_format(run_cli, tmp_path):
    path = _write_request(
        tmp_path,
        {
            "topology": {"world_size": 2},
            "tables": [
                {"name": "users", "num_embeddings": 1000, "embedding_dim": 128},
                {"name": "ads", "num_embeddings": 50, "embedding_dim": 16},
            ],
        },
    )
    result = run_cli("plan", path, "--format", "table")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split(" | ")[:4] == ["rank", "HBM GB (used %)", "DDR GB", "perf ms"]
    assert any(line.startswith("users ") for line in lines)
    assert any(line.startswith("status ") for line in lines)
    assert any(line.startswith("gap ") for line in lines)


def test_plan_exits_3_with_an_explanation(run_cli, tmp_path):
    path = _write_request(
        tmp_path,
        {
            "topology": {"world_size": 2, "hbm_bytes": 2**30, "ddr_bytes": 2**30},
            "tables": [{"name": "huge", "num_embeddings": 10**9, "embedding_dim": 128}],
        },
    )
    result = run_cli("plan", path)
    assert result.returncode == 3
    explanation = json.loads(result.stdout)
    assert explanation["status"] == "infeasible"
    assert explanation["reasons"][0]["tables"] == ["huge"]
    assert "no plan exists:" in result.stderr
    assert "table 'huge' fits no rank" in result.stderr


def test_progress_line_for_long_solves(monkeypatch, capsys):
    from clients import cli

    monkeypatch.setattr(cli._ProgressLine, "INTERVAL_S", 0.05)
    import time

    with cli._ProgressLine() as progress:
        progress.update("cp-sat", 1.25, 1.0)
        time.sleep(0.2)
    err = capsys.readouterr().err
    assert "planning: 0 s, cp-sat, best 1.25 ms, bound 1 ms" in err
