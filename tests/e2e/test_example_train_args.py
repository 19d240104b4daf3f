"""examples/dlrm/train.py's command line, before anything trains: ``--help`` gives every
option a line, and a job whose plan is fetched but names no service stops with one line
in the command line's words (``--server`` or ``$SHARDPLAN_SERVER``), exit 2, before torch
is imported; under torchrun too, where the only traceback left is torchrun's own."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "dlrm"
TORCHRUN = Path(sys.executable).parent / "torchrun"
NO_SERVER = (
    "train.py: --plan alias:ranking is fetched from the planner service: pass --server URL "
    "or set $SHARDPLAN_SERVER\n"
)


@pytest.fixture
def train(monkeypatch):
    """The example's ``train`` module, imported as the script imports it."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    return importlib.import_module("train")


def test_help_gives_every_option_a_line_and_no_empty_default(train):
    parser = train.parser()
    for action in parser._actions:
        assert action.help, action.option_strings
    text = parser.format_help()
    assert "default: None" not in text and "(default: False)" not in text
    assert "Exit codes: 0 trained" in text and "$SHARDPLAN_SERVER" in text


def test_a_plan_to_fetch_without_a_service_is_one_line(train, monkeypatch, capsys):
    monkeypatch.delenv("SHARDPLAN_SERVER", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert train.main(["--plan", "alias:ranking"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", NO_SERVER)
    assert "job" not in sys.modules  # the job (torch, FBGEMM) was never imported


def test_a_plan_file_needs_no_service(train, monkeypatch, tmp_path):
    """Only a plan id or an alias is fetched: a file's path goes on to the job."""
    monkeypatch.delenv("SHARDPLAN_SERVER", raising=False)
    assert not train._fetched(str(tmp_path / "plan.json"))
    assert train._fetched("a" * 64) and train._fetched("alias:x")
    assert not train._fetched("A" * 64)  # a plan id is lowercase hex, as load_plan reads it


@pytest.mark.slow
def test_under_torchrun_the_reason_is_said_once_with_no_traceback_of_ours(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SHARDPLAN_SERVER"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(EXAMPLE / "train.py"),
         "--plan", "alias:ranking"],
        capture_output=True, text=True, env=env, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode != 0
    assert done.stderr.count(NO_SERVER.strip()) == 1, done.stderr
    assert "exitcode  : 2" in done.stderr  # the worker's own status, as torchrun reports it
    frames = [line for line in done.stderr.splitlines() if line.strip().startswith("File ")]
    assert frames and not [line for line in frames if "examples/dlrm" in line]  # torchrun's
