"""``shardplan measure REQUEST PLAN``: a real run on two gloo ranks (the table and the JSON
report), and the exits that run nothing: an invalid plan (1), a world size this machine
cannot run (2, before any rank starts) and unreadable files (2)."""

from __future__ import annotations

import multiprocessing
import os
import re
import time

import pytest

from planner_service.plan.codec import plan_bytes
from runtime.measure import MeasureReport
from runtime.measure.launch import RANKS_PER_CPU
from tests.support import builders
from tests.support.builders import request, table
from tests.support.cli_runner import run_in_process

FEW_STEPS = ("--steps", "3", "--warmup", "1", "--device", "cpu")


def _files(tmp_path, req, plan):
    request_path, plan_path = tmp_path / "request.json", tmp_path / "plan.json"
    request_path.write_text(req.model_dump_json())
    plan_path.write_bytes(plan_bytes(plan))
    return request_path, plan_path


def _small(world_size: int, rows: int = 100):
    req = request(
        [table("a", rows=rows, dim=8, pooling_factors=[2.0]), table("b", rows=30, dim=8)],
        world_size=world_size,
        batch_size=8,
        topology={"world_size": world_size, "compute_device": "cpu"},
    )
    plan = builders.plan(
        req,
        {"a": builders.row_wise(req, "a"), "b": builders.table_wise(req, "b", world_size - 1)},
    )
    return req, plan


@pytest.mark.slow
def test_measure_prints_the_table(tmp_path):
    req, plan = _small(2)
    request_path, plan_path = _files(tmp_path, req, plan)
    result = run_in_process("measure", request_path, plan_path, *FEW_STEPS)
    assert result.returncode == 0, result.stderr
    header = result.stdout.splitlines()[3].split()
    assert header[:4] == ["rank", "median", "p90", "step"] and header[-2:] == ["other", "error"]
    assert f"plan {plan.plan_id[:12]} on 2 rank(s): cpu, gloo" in result.stdout
    assert re.search(r"^job step [0-9.]+ ms \(rank [01], ", result.stdout, re.MULTILINE)


@pytest.mark.slow
def test_measure_json_is_the_report_written_to_output(tmp_path):
    req, plan = _small(2)
    request_path, plan_path = _files(tmp_path, req, plan)
    out = tmp_path / "report.json"
    result = run_in_process(
        "measure", request_path, plan_path, *FEW_STEPS, "--format", "json", "--seed", "7",
        "-o", out,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""  # the report is in the file instead
    report = MeasureReport.model_validate_json(out.read_text())
    assert report.plan_id == plan.plan_id and report.world_size == 2
    assert report.settings.steps == 3 and len(report.ranks[1].samples) == 3
    assert report.settings.seed == 7 and report.backend.value == "gloo"
    assert sorted(report.model_dump()) == [
        "backend",
        "job_step_ms",
        "machine",
        "plan_id",
        "predicted_job_ms",
        "ranks",
        "relative_error",
        "request_hash",
        "settings",
        "side_by_side_with",
        "slowest_rank",
        "world_size",
    ]
    assert report.side_by_side_with == []  # measured alone


def test_a_world_size_beyond_the_machine_is_refused_before_any_rank_starts(tmp_path):
    cpus = os.cpu_count() or 1
    world = RANKS_PER_CPU * cpus + 1
    req, plan = _small(world, rows=4 * world)
    request_path, plan_path = _files(tmp_path, req, plan)
    start = time.monotonic()
    before = set(multiprocessing.active_children())
    result = run_in_process("measure", request_path, plan_path, "--device", "cpu")
    assert result.returncode == 2
    assert f"world size {world}" in result.stderr
    assert f"at most {RANKS_PER_CPU * cpus} cpu ranks" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert set(multiprocessing.active_children()) <= before  # nothing started
    assert time.monotonic() - start < 20


def test_an_invalid_plan_exits_1_and_runs_nothing(tmp_path):
    req, _ = _small(2)
    _, other_plan = _small(2, rows=64)  # a's shards cover 64 rows, the request has 100
    request_path, plan_path = _files(tmp_path, req, other_plan)
    before = set(multiprocessing.active_children())
    result = run_in_process("measure", request_path, plan_path, "--device", "cpu")
    assert result.returncode == 1
    assert result.stdout == ""  # no report
    assert "invalid:" in result.stderr and "violation" in result.stderr
    assert set(multiprocessing.active_children()) <= before  # nothing started


def test_an_unreadable_request_exits_2(tmp_path):
    _, plan = _small(2)
    plan_path = tmp_path / "plan.json"
    plan_path.write_bytes(plan_bytes(plan))
    result = run_in_process("measure", tmp_path / "missing.json", plan_path)
    assert result.returncode == 2
    assert "missing.json" in result.stderr and "cannot read file" in result.stderr


@pytest.mark.slow
def test_versus_measures_plans_side_by_side(tmp_path):
    req, plan = _small(2)
    other = builders.plan(
        req,
        {"a": builders.table_wise(req, "a", 0), "b": builders.table_wise(req, "b", 0)},
    )
    request_path, plan_path = _files(tmp_path, req, plan)
    other_path = tmp_path / "other.json"
    other_path.write_bytes(plan_bytes(other))
    result = run_in_process("measure", request_path, plan_path, "--versus", other_path, *FEW_STEPS)
    assert result.returncode == 0, result.stderr
    for each in (plan, other):  # a table per plan, then both ranked
        assert f"plan {each.plan_id[:12]} on 2 rank(s): cpu, gloo" in result.stdout
    assert result.stdout.count("side by side with 1 other plan(s), a step of each in turn") == 2
    side = result.stdout.split("side by side: 2 plans, a step of each in turn")[1]
    ranked = [line.split() for line in side.splitlines()[3:5]]
    assert {row[0] for row in ranked} == {plan.plan_id[:12], other.plan_id[:12]}
    assert {row[1] for row in ranked} == {str(plan_path), str(other_path)}
    assert ranked[0][3] == "1.000" and float(ranked[1][3]) >= 1.0
    assert float(ranked[0][2]) <= float(ranked[1][2])


def test_versus_plans_are_checked_before_any_rank_starts(tmp_path):
    req, plan = _small(2)
    _, invalid = _small(2, rows=64)  # a's shards cover 64 rows, the request has 100
    request_path, plan_path = _files(tmp_path, req, plan)
    invalid_path = tmp_path / "invalid.json"
    invalid_path.write_bytes(plan_bytes(invalid))
    before = set(multiprocessing.active_children())
    result = run_in_process("measure", request_path, plan_path, "--versus", invalid_path)
    assert result.returncode == 1 and result.stdout == ""
    assert f"{invalid_path}:" in result.stderr and "invalid:" in result.stderr
    result = run_in_process("measure", request_path, plan_path, "--versus", "-")
    assert result.returncode == 2
    assert "--versus" in result.stderr and "standard input" in result.stderr
    many = ["--versus", str(plan_path)] * 32
    result = run_in_process("measure", request_path, plan_path, *many)
    assert result.returncode == 2 and "at most 31 other plans" in result.stderr
    assert set(multiprocessing.active_children()) <= before  # nothing started
