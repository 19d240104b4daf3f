"""Shared fixtures: the installed ``shardplan`` console script and scratch files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli_runner import run_in_process, run_process


@pytest.fixture(scope="session")
def shardplan_exe() -> Path:
    exe = Path(sys.executable).parent / "shardplan"
    assert exe.exists(), "install the package first (make test does): the console script is missing"
    return exe


@pytest.fixture
def run_cli():
    """``shardplan ARGS`` in this process (tests/support/cli_runner.py): what it prints and returns."""
    return run_in_process


@pytest.fixture
def run_cli_process(shardplan_exe):
    """``shardplan ARGS`` as a real process, for tests whose subject is the process."""

    def run(*args: object, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess[str]:
        return run_process(shardplan_exe, *args, timeout=timeout, **kwargs)

    return run


@pytest.fixture(scope="session")
def postgres():
    """One real PostgreSQL server for the session; each test takes a fresh database."""
    from tests.support.servers import PostgresServer

    server = PostgresServer().start()
    yield server
    server.destroy()


BACKENDS = ["sqlite", "postgres"]


def database_url(backend: str, postgres_server, directory: Path) -> str:
    """A fresh, empty store of the given kind."""
    if backend == "sqlite":
        return str(directory / "plans.db")
    return postgres_server.new_database()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the PostgreSQL server, through the fixture or a backend
    parameter, so that ``make test-fast`` can run without PostgreSQL installed."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "postgres" in item.fixturenames or "postgres" in params.values():
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(params=BACKENDS)
def store_url(request, tmp_path):
    postgres_server = request.getfixturevalue("postgres") if request.param == "postgres" else None
    return database_url(request.param, postgres_server, tmp_path)


# --------------------------------------------------------------------------- test budgets
# A test's budget is the wall time its call may take on the CI machine (2 cores), with
# room for a loaded run; docs/testing.md lists them. A test over its budget fails, naming
# the budget: the suite stays fast because a slow test is seen the day it becomes slow, not
# because a product's speed is asserted (benchmarks/ measure that). `slow` tests get the
# larger budget; `@pytest.mark.budget(seconds)` sets one test's own, with a reason nearby.
BUDGET_S = 30.0
SLOW_BUDGET_S = 120.0
BUDGET_SCALE = float(os.environ.get("SHARDPLAN_TEST_BUDGET_SCALE", "1"))
# Beside other test processes on the same cores (scripts/test-lanes.sh) a test's wall time
# stretches up to that many times: a docs page's commands took 19 s alone and 66 s beside a
# second worker. The budgets are for a test alone on the machine, so they scale with them.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def budget_of(item: pytest.Item) -> float:
    marker = item.get_closest_marker("budget")
    if marker is not None:
        seconds = float(marker.args[0])
    elif item.get_closest_marker("slow") is not None:
        seconds = SLOW_BUDGET_S
    else:
        seconds = BUDGET_S
    return seconds * BUDGET_SCALE * WORKERS


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.passed or BUDGET_SCALE == 0:
        return
    budget = budget_of(item)
    if call.duration > budget:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {call.duration:.1f} s, over its budget of {budget:.0f} s "
            "(docs/testing.md, 'Budgets'): make it faster, mark it slow, or give it "
            "@pytest.mark.budget(seconds) with the reason; SHARDPLAN_TEST_BUDGET_SCALE "
            "scales every budget on a slower machine (0 turns the check off)"
        )
