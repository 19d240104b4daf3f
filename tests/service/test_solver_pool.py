"""The solve pool (``planner_service/service/solver/pool.py``) against real servers and real
processes: a solve past its time limit and grace is killed and its process replaced, a
solver process that dies is replaced, and no solver process outlives the server, however
the server ends. Processes are found through /proc; nothing is mocked. And the progress a
solver process reports: every stage the solver names is a ``SolveStage``."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from planner_service.service.processes import SOLVER_NAME
from planner_service.service.solver import pool
from planner_service.service.solver.pool import SolveProgress, SolveStage
from tests.support.servers import Service

# Slow lane: its subject is processes (started, killed, signalled) or multi-process runs.
pytestmark = [pytest.mark.slow, pytest.mark.alone]

LONG_SOLVE_S = 30.0


def hard_request(seed: int, *, time_limit_s: float, tables: int = 300, world_size: int = 64):
    """Hundreds of tables on 64 ranks, searched to a proven optimum (``gap_limit`` 0),
    which CP-SAT cannot reach: the solve runs to its time limit."""
    return {
        "topology": {"world_size": world_size, "local_world_size": 8},
        "tables": [
            {
                "name": f"t{i}",
                "num_embeddings": 1000 + (i * 7919 + seed * 104729) % 5_000_000,
                "embedding_dim": [16, 32, 64, 128][i % 4],
                "pooling_factors": [1.0 + (i * 31 % 17)],
            }
            for i in range(tables)
        ],
        "options": {"time_limit_s": time_limit_s, "gap_limit": 0.0, "seed": seed},
    }


def tiny_request(name: str) -> dict:
    return {
        "topology": {"world_size": 2},
        "tables": [{"name": name, "num_embeddings": 1000, "embedding_dim": 16}],
        "options": {"time_limit_s": 5.0},
    }


# --------------------------------------------------------------------------- /proc


def stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time in clock ticks) of a process, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name may hold spaces and parens
    return fields[0], int(fields[1]), int(fields[19])


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "?"


def process_tree(root: int) -> dict[int, int]:
    """``root`` and every process below it: pid -> start time (so a reused pid is not
    mistaken for a survivor)."""
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := stat(int(entry))) is not None:
            children.setdefault(found[1], []).append(int(entry))
            started[int(entry)] = found[2]
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in started:
            tree[pid] = started[pid]
            todo.extend(children.get(pid, []))
    return tree


def alive(pid: int, start_time: int) -> bool:
    found = stat(pid)
    return found is not None and found[2] == start_time and found[0] not in "ZX"


def solver_pids(server: Service) -> set[int]:
    """The solver processes of a one-HTTP-worker server: its ``spawn`` children that name
    themselves so (the CPU lane's workers are ``spawn`` children too)."""
    assert server.process is not None
    return {
        pid
        for pid in process_tree(server.process.pid)
        if "spawn_main" in command_line(pid)
        and stat(pid) is not None
        and process_name(pid) == SOLVER_NAME
    }


def process_name(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.05)


def start_long_solve(server: Service, seed: int) -> tuple[threading.Thread, dict]:
    """A solve that runs for LONG_SOLVE_S, started once a solver process is warm (a tiny
    solve first), so that it is admitted straight into a solver process, not queued."""
    with httpx.Client(base_url=server.base, timeout=120) as http:
        assert http.post("/v1/plans", json=tiny_request(f"warm{seed}")).status_code == 201
        background = post_in_background(server.base, hard_request(seed, time_limit_s=LONG_SOLVE_S))
        wait_for(
            lambda: "shardplan_solve_queue_depth 1.0" in http.get("/metrics").text,
            "the long solve was not admitted",
        )
    return background


def post_in_background(base: str, document: dict) -> tuple[threading.Thread, dict]:
    """POST /v1/plans from a thread; the response (or the transport error) lands in the dict."""
    outcome: dict[str, object] = {}

    def post() -> None:
        try:
            with httpx.Client(base_url=base, timeout=120) as http:
                outcome["response"] = http.post("/v1/plans", json=document)
        except httpx.TransportError as error:  # the server went away mid-request
            outcome["error"] = error

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread, outcome


def kill_what_is_left(server: Service) -> None:
    """Cleanup after a failed assertion: the whole session, survivors included."""
    assert server.process is not None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait(timeout=30)


# --------------------------------------------------------------------------- no orphans


@pytest.mark.parametrize("http_workers", [1, 2])
@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_no_process_outlives_the_server_killed_mid_solve(
    signal_number, http_workers, shardplan_exe, tmp_path
):
    # A grace shorter than the solve, so that it is still running when the grace ends on
    # any machine (the solve stops at its deterministic work budget: about 9 s on an idle
    # 2-core machine, inside the default 10 s grace).
    short_grace = {"SHARDPLAN_SHUTDOWN_GRACE_S": "1"}
    server = Service(
        shardplan_exe,
        tmp_path / "log",
        db=str(tmp_path / "plans.db"),
        workers=http_workers,
        env=short_grace,
    ).start()
    assert server.process is not None
    try:
        solving_thread, outcome = start_long_solve(server, 1)
        # One solver process per HTTP worker (SHARDPLAN_SOLVE_WORKERS=1), plus the HTTP
        # workers themselves under a supervisor. Recorded once all have started, or after
        # 30 s with whatever there is: every one of them must go.
        spawned = 1 if http_workers == 1 else 2 * http_workers
        deadline = time.monotonic() + 30
        tree = process_tree(server.process.pid)
        while sum("spawn_main" in command_line(pid) for pid in tree) < spawned:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
            tree = process_tree(server.process.pid)

        os.kill(server.process.pid, signal_number)  # the server alone, not its process group
        deadline = time.monotonic() + 20
        while survivors := [pid for pid, started in tree.items() if alive(pid, started)]:
            if time.monotonic() > deadline:
                described = [f"{pid} [{stat(pid)}] {command_line(pid)}" for pid in survivors]
                pytest.fail(
                    f"20 s after {signal.Signals(signal_number).name} of the server "
                    f"({server.process.pid}), {len(survivors)} of its {len(tree)} processes "
                    "live on:\n" + "\n".join(described)
                )
            server.process.poll()  # reap the server itself
            time.sleep(0.1)
        solving_thread.join(timeout=60)
        if signal_number == signal.SIGTERM:  # told why, after uvicorn's graceful period
            response = outcome["response"]
            assert isinstance(response, httpx.Response)
            assert response.status_code == 503 and response.headers["retry-after"] == "1"
            assert response.json()["title"] == "Service shutting down"
    finally:
        kill_what_is_left(server)


def test_a_stopping_server_lets_a_solve_in_flight_finish_within_its_shutdown_grace(
    shardplan_exe, tmp_path
):
    """SHARDPLAN_SHUTDOWN_GRACE_S above the solve's length: SIGTERM mid-solve still gets the
    plan (201), then the server exits. With a grace shorter than the solve, the same solve
    gets 503 (the test above)."""
    grace = {"SHARDPLAN_SHUTDOWN_GRACE_S": str(LONG_SOLVE_S + 30)}
    server = Service(
        shardplan_exe, tmp_path / "log", db=str(tmp_path / "plans.db"), env=grace
    ).start()
    assert server.process is not None
    try:
        solving_thread, outcome = start_long_solve(server, 3)
        os.kill(server.process.pid, signal.SIGTERM)
        solving_thread.join(timeout=LONG_SOLVE_S + 60)
        response = outcome.get("response")
        assert isinstance(response, httpx.Response), outcome
        assert response.status_code == 201, response.text
        assert server.process.wait(timeout=30) is not None
    finally:
        kill_what_is_left(server)


def test_an_idle_solver_process_exits_when_its_pipe_to_the_service_closes():
    context = multiprocessing.get_context("spawn")
    service_end, solver_end = context.Pipe()
    process = context.Process(target=pool.run_solver_process, args=(solver_end, os.getpid()))
    process.start()
    solver_end.close()
    try:
        assert service_end.poll(120), "the solver process never said it was ready"
        assert service_end.recv() == pool.READY
        service_end.close()
        process.join(timeout=60)
        assert process.exitcode == 0
    finally:
        process.kill()
        process.join()


def test_every_stage_the_solver_reports_reaches_the_service_as_a_solve_stage():
    """The solver names its stages as text and a solver process reads each into
    ``SolveStage`` before sending it (a name it did not know would go unreported): a solve
    that runs every stage, CP-SAT included, sends each of them, as the enum."""

    class Pipe:
        def __init__(self) -> None:
            self.sent: list[object] = []

        def send(self, message: object) -> None:
            self.sent.append(message)

    pipe = Pipe()
    reporter = pool._ProgressReporter(pipe)  # type: ignore[arg-type]
    names: list[str] = []  # as the solver names them

    def report(name: str, objective: float | None, bound: float | None) -> None:
        names.append(name)
        reporter.report(name, objective, bound)

    document = json.dumps(hard_request(1, time_limit_s=3.0, tables=40, world_size=8))
    result = pool.solve_document(document.encode(), report)
    assert result.plan is not None
    assert set(names) == {stage.value for stage in SolveStage}
    assert all(isinstance(message, SolveProgress) for message in pipe.sent)
    stages = [message.stage for message in pipe.sent]  # type: ignore[attr-defined]
    assert all(isinstance(stage, SolveStage) for stage in stages)
    assert list(dict.fromkeys(stages)) == list(SolveStage)  # each, in the enum's order


# --------------------------------------------------------------------------- overrun


@pytest.fixture
def no_grace_server(shardplan_exe, tmp_path):
    """One solver process and no grace: a solve is killed the moment it passes its time
    limit, so a request whose solve cannot finish within its time limit overruns for real."""
    env = {"SHARDPLAN_SOLVE_GRACE_S": "0"}
    server = Service(shardplan_exe, tmp_path / "log", db=str(tmp_path / "p.db"), env=env)
    server.start()
    yield server
    server.stop()


def test_a_solve_past_its_time_limit_and_grace_is_killed_and_its_process_replaced(
    no_grace_server,
):
    # A solver process names itself once spawned and imported: wait for that.
    wait_for(lambda: len(solver_pids(no_grace_server)) == 1, "the solver process")
    before = solver_pids(no_grace_server)
    with httpx.Client(base_url=no_grace_server.base, timeout=120) as http:
        # Reading 20,000 tables in the solver process alone takes far longer than 10 ms,
        # and nothing stops it (the solver's own deadline stops every stage after it), so
        # this solve cannot end within its time limit.
        overran = http.post("/v1/plans", json=hard_request(2, time_limit_s=0.01, tables=20_000))
        assert overran.status_code == 503, overran.text[:300]
        assert overran.headers["content-type"] == "application/problem+json"
        problem = overran.json()
        assert problem["title"] == "Solve overran its time limit"
        assert "options.time_limit_s = 0.01 s" in problem["detail"]
        assert "grace of 0 s (SHARDPLAN_SOLVE_GRACE_S)" in problem["detail"]
        assert "killed and replaced" in problem["detail"]
        assert problem["time_limit_s"] == 0.01 and problem["grace_s"] == 0.0
        assert int(overran.headers["retry-after"]) >= 1

        # The overrunning process is gone and a fresh one serves the next solve.
        (killed,) = before
        wait_for(lambda: stat(killed) is None or stat(killed)[0] in "ZX", "killed solver")
        wait_for(lambda: len(solver_pids(no_grace_server)) == 1, "replacement solver")
        assert killed not in solver_pids(no_grace_server)
        assert http.post("/v1/plans", json=tiny_request("after")).status_code == 201
        metrics = http.get("/metrics").text
        assert 'shardplan_solve_duration_seconds_count{outcome="overran"} 1.0' in metrics


def test_a_solver_process_that_dies_mid_solve_is_503_and_replaced(shardplan_exe, tmp_path):
    server = Service(shardplan_exe, tmp_path / "log", db=str(tmp_path / "p.db")).start()
    try:
        with httpx.Client(base_url=server.base, timeout=120) as http:
            thread, outcome = start_long_solve(server, 3)
            (victim,) = solver_pids(server)
            os.kill(victim, signal.SIGKILL)  # as the kernel's OOM killer would
            thread.join(timeout=60)
            response = outcome["response"]
            assert isinstance(response, httpx.Response)
            assert response.status_code == 503, response.text[:300]
            assert response.json()["title"] == "Solver process died"
            assert "SIGKILL" in response.json()["detail"]
            assert int(response.headers["retry-after"]) >= 1
            wait_for(lambda: len(solver_pids(server)) == 1, "replacement solver")
            assert victim not in solver_pids(server)
            assert http.post("/v1/plans", json=tiny_request("after")).status_code == 201
    finally:
        server.stop()
