"""The service the commands that talk to one run against: a real ``shardplan serve`` on
loopback with a SQLite store, writes needing ``TOKEN``; one per test module."""

from __future__ import annotations

import pytest

from tests.support.servers import started_service

TOKEN = "ci-token-0123456789"


@pytest.fixture(scope="module")
def service(shardplan_exe, tmp_path_factory):
    directory = tmp_path_factory.mktemp("cli-service")
    server = started_service(shardplan_exe, directory, {"SHARDPLAN_API_TOKENS": f"ci:{TOKEN}"})
    yield server
    server.stop()
