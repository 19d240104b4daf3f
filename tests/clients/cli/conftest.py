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
