"""``shardplan calibrate``'s bad input: exit 2 with a one-line message naming the option,
the value and what is accepted, before any rank is spawned."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from tests.support.cli_runner import run_in_process


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--budget-s", "5"), "--budget-s 5 is outside [10, 3600] seconds"),
        (("--budget-s", "4000"), "--budget-s 4000 is outside [10, 3600] seconds"),
        (("--budget-s", "nan"), "--budget-s nan is outside [10, 3600] seconds"),
        (
            ("--world-sizes", str(4 * (os.cpu_count() or 1) + 1)),
            f"runs cpu worlds of 2 to {4 * (os.cpu_count() or 1)} ranks",
        ),
        (("--world-sizes", "1"), "--world-sizes 1: this machine runs cpu worlds of 2 to"),
        (("--world-sizes", "2,x"), "--world-sizes = 'x': not a positive whole number"),
        (("--threads", "0"), "--threads 0: give 1 or more"),
    ],
)
def test_bad_options_exit_2_before_spawning(args: tuple[str, ...], message: str) -> None:
    before = set(multiprocessing.active_children())
    result = run_in_process("calibrate", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""
    assert set(multiprocessing.active_children()) <= before  # nothing started


def test_an_output_path_that_cannot_be_written_exits_2(tmp_path: object) -> None:
    result = run_in_process("calibrate", "-o", "/nonexistent/dir/profile.json")
    assert result.returncode == 2
    assert "--output" in result.stderr and "cannot write" in result.stderr
