"""``shardplan plan``'s time limit as its user waits for it: from the command's start to
its exit, imports, reading the request and writing the plan included (issue 37, item 3).
A correctness bound, not a benchmark (benchmarks/time_limit_bench.py measures)."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from benchmarks.workloads import memory_tight_tables, named_workload, workload_request
from clients.cli.exits import EXIT_NO_PLAN
from planner_service.plan.canonical import canonical_bytes
from planner_service.plan.codec import parse_plan
from planner_service.plan.types import Infeasibility

pytestmark = pytest.mark.alone

TIME_LIMIT_S = 1.0
BOUND_S = TIME_LIMIT_S + 3.0  # generous: the suite runs beside other work on 2 cores
SUMMARY = re.compile(r"gap [0-9.]+%, ([0-9.]+) s$", re.MULTILINE)


def test_a_one_second_plan_exits_within_its_limit_and_reports_the_wall_from_its_start(
    shardplan_exe, tmp_path
):
    request = named_workload("medium", 32, {"time_limit_s": TIME_LIMIT_S})
    path = tmp_path / "medium.json"
    path.write_bytes(canonical_bytes(request))
    bare_started = time.monotonic()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    bare_s = time.monotonic() - bare_started
    started = time.monotonic()
    done = subprocess.run(
        [str(shardplan_exe), "plan", str(path), "-o", str(tmp_path / "plan.json")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    wall_s = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-500:]
    assert wall_s < BOUND_S, (wall_s, done.stderr[-300:])
    assert parse_plan((tmp_path / "plan.json").read_bytes()).world_size == 32
    reported = SUMMARY.search(done.stderr)
    assert reported is not None, done.stderr[-300:]
    reported_s = float(reported.group(1))
    # What the command reports is its wall from its start: what this test measured, less
    # the interpreter's own start and the exit (at once after the output: no teardown).
    assert wall_s - bare_s - 0.5 <= reported_s <= wall_s, (reported_s, wall_s, bare_s)
    assert reported_s >= 0.5 * TIME_LIMIT_S  # the imports and the solve are in it


def no_plan_request(time_limit_s: float):
    """10,000 tables on 4,096 ranks whose weights need three times the HBM there is: no
    plan exists, and explaining why (memory totals, the least world size that fits) is
    costly; before the explanation had a budget, the command took 5.3 s of a 1 s limit."""
    tables = memory_tight_tables(10_000, 4096, fill=3.0)
    return workload_request(tables, 4096, options={"time_limit_s": time_limit_s})


@pytest.mark.slow
def test_a_one_second_request_without_a_plan_exits_within_its_limit(shardplan_exe, tmp_path):
    path = tmp_path / "no-plan.json"
    path.write_bytes(canonical_bytes(no_plan_request(TIME_LIMIT_S)))
    started = time.monotonic()
    done = subprocess.run(
        [str(shardplan_exe), "plan", str(path), "-o", str(tmp_path / "why.json")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    wall_s = time.monotonic() - started
    assert done.returncode == EXIT_NO_PLAN, done.stderr[-500:]
    assert wall_s < BOUND_S, (wall_s, done.stderr[-300:])
    why = Infeasibility.model_validate_json((tmp_path / "why.json").read_bytes())
    assert why.reasons  # the explanation is there, however much of it fitted
