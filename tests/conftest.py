"""Shared fixtures: the installed ``shardplan`` console script and scratch files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shardplan_exe() -> Path:
    exe = Path(sys.executable).parent / "shardplan"
    assert exe.exists(), "install the package first (make test does): the console script is missing"
    return exe


@pytest.fixture
def run_cli(shardplan_exe):
    def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(shardplan_exe), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return run


@pytest.fixture(scope="session")
def postgres():
    """One real PostgreSQL server for the session; each test takes a fresh database."""
    from tests.servers import PostgresServer

    server = PostgresServer().start()
    yield server
    server.destroy()


BACKENDS = ["sqlite", "postgres"]


def database_url(backend: str, postgres_server, directory: Path) -> str:
    """A fresh, empty store of the given kind."""
    if backend == "sqlite":
        return str(directory / "plans.db")
    return postgres_server.new_database()


@pytest.fixture(params=BACKENDS)
def store_url(request, tmp_path):
    postgres_server = request.getfixturevalue("postgres") if request.param == "postgres" else None
    return database_url(request.param, postgres_server, tmp_path)
