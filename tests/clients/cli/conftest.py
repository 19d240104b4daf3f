"""The service the commands that talk to one run against: a real ``shardplan serve`` on
loopback with a SQLite store, writes needing ``TOKEN``, one per test module; and the
console script to run them with."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.servers import started_service

TOKEN = "ci-token-0123456789"


@pytest.fixture(scope="module")
def service(shardplan_exe, tmp_path_factory):
    directory = tmp_path_factory.mktemp("cli-service")
    server = started_service(shardplan_exe, directory, {"SHARDPLAN_API_TOKENS": f"ci:{TOKEN}"})
    yield server
    server.stop()


@pytest.fixture
def cli(shardplan_exe):
    """``cli(*args, token=TOKEN)``: the console script, with SHARDPLAN_TOKEN set (None:
    unset), that never prints a traceback."""

    def run(*args: object, token: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "SHARDPLAN_TOKEN"}
        if token is not None:
            env["SHARDPLAN_TOKEN"] = token
        result = subprocess.run(
            [str(shardplan_exe), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
            env=env,
        )
        assert "Traceback" not in result.stderr, result.stderr
        return result

    return run


def import_made_elsewhere(service, request_path) -> str:
    """The service's plan for the request at ``request_path``, as another planner version
    would have made it (its shards and report, under ``offline-9.9``), imported by PUT:
    its id. The service says its solver report is unverified."""
    from clients.http import PlannerClient
    from planner_service.plan.codec import parse_request
    from tests.support import builders

    req = parse_request(request_path.read_bytes())
    with PlannerClient(service.base, token=TOKEN) as client:
        own = client.create_plan(req)
        plan = builders.seal_plan(
            request=req,
            planner_version="offline-9.9",
            tables=own.tables,
            rank_stats=own.rank_stats,
            solver=own.solver,
        )
        client.import_plan(req, plan)
    return plan.plan_id
