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
