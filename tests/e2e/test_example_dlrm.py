"""The DLRM example end to end (examples/dlrm/): its planning request posted to a real
``shardplan serve``, an alias set, the job launched with the real ``torchrun`` on two gloo
ranks; every rank trains with the alias's plan, the first steps' losses are the unsharded
reference's, and the loss falls. A plan for another world size stops every rank, within
its deadline, with the plan check's message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.servers import started_service

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "dlrm" / "train.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
# Small enough for CI's two cores: 26 tables of at most 10,132 rows, 32 samples per rank.
SMALL = ["--scale", "0.001", "--batch-size", "32", "--seed", "0"]
STEPS = 50
COMPARED_STEPS = 3
WINDOW = 10
DEADLINE_S = 30.0
RUN_TIMEOUT_S = 150


def _env() -> dict[str, str]:
    """The examples import this checkout's packages, and each rank uses one thread."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def example(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def torchrun(*args: str) -> subprocess.CompletedProcess[str]:
    """The job on two ranks, launched as the docs launch it."""
    return subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def ran(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def service(shardplan_exe, tmp_path_factory):
    server = started_service(shardplan_exe, tmp_path_factory.mktemp("dlrm-service"), {})
    yield server.base
    server.stop()


def publish(base: str, alias: str, *args: str) -> str:
    """POST the request the example prints, point ``alias`` at the plan; its id."""
    request = json.loads(ran(example("--print-request", *args)).stdout)
    with httpx.Client(base_url=base, timeout=120) as http:
        created = http.post("/v1/plans", json=request)
        assert created.status_code in (200, 201), created.text
        plan_id = created.headers["x-shardplan-plan-id"]
        moved = http.put(f"/v1/aliases/{alias}", json={"plan_id": plan_id})
        assert moved.status_code in (200, 201), moved.text
    return plan_id


def metrics(directory: Path, name: str) -> dict:
    return json.loads((directory / name).read_text())


@pytest.mark.parametrize("features", ["pooled", "sequence"])
def test_the_job_trains_with_the_alias_plan_as_the_unsharded_reference(service, tmp_path, features):
    config = [*SMALL, "--features", features]
    plan_id = publish(service, f"dlrm-{features}", "--world-size", "2", *config)
    done = ran(
        torchrun(
            "--plan", f"alias:dlrm-{features}", "--server", service, "--steps", str(STEPS),
            "--deadline-s", str(DEADLINE_S), "--metrics-out", str(tmp_path), *config,
        )
    )  # fmt: skip
    ranks = [metrics(tmp_path, f"rank{r}.json") for r in range(2)]
    for r, result in enumerate(ranks):
        assert result["plan_id"] == plan_id, result
        assert f"rank {r}: plan {plan_id} from alias:dlrm-{features}: 26 tables on 2 ranks" in (
            done.stdout
        )
    assert ranks[0]["global_losses"] == ranks[1]["global_losses"]
    assert ranks[0]["examples_per_s"] > 0

    ran(example("--reference", "--world-size", "2", "--steps", str(COMPARED_STEPS),
                "--metrics-out", str(tmp_path), *config))  # fmt: skip
    want = metrics(tmp_path, "reference.json")
    for step in range(COMPARED_STEPS):
        for r in range(2):
            assert ranks[r]["losses"][step] == pytest.approx(
                want["rank_losses"][step][r], rel=1e-5
            ), (step, r)
        assert ranks[0]["global_losses"][step] == pytest.approx(
            want["global_losses"][step], rel=1e-5
        ), step

    losses = ranks[0]["global_losses"]
    assert len(losses) == STEPS
    start, end = sum(losses[:WINDOW]) / WINDOW, sum(losses[-WINDOW:]) / WINDOW
    assert end < start - 0.05, (start, end, losses)
    assert f"step {STEPS}/{STEPS} [####################] loss " in done.stderr
    assert f"trained {STEPS} steps: loss {start:.4f} -> {end:.4f}" in done.stdout


def test_a_plan_for_another_world_size_stops_every_rank_with_the_check(service, tmp_path):
    plan_id = publish(service, "dlrm-three", "--world-size", "3", *SMALL)
    started = time.monotonic()
    done = torchrun(
        "--plan", plan_id, "--server", service, "--deadline-s", str(DEADLINE_S),
        "--metrics-out", str(tmp_path), *SMALL,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert done.returncode != 0, done.stdout
    says = (
        "the plan is for world_size 3 but the process group has 2 ranks; plan again for 2 "
        "ranks or start 3 processes"
    )
    for r in range(2):
        line = f"rank {r}: cannot start: "
        reasons = [x for x in done.stderr.splitlines() if x.startswith(line)]
        assert len(reasons) == 1 and says in reasons[0], done.stderr
    assert not list(tmp_path.glob("rank*.json"))  # nobody trained
    assert elapsed < DEADLINE_S, elapsed  # nothing waited for a peer
