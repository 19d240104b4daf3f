"""``shardplan serve`` as a process on loopback: a port it cannot have stops it before it
says it serves; the access log is off unless asked for; stopped by SIGTERM after its CPU
lane has worked, it leaves no semaphore behind. (Its flags and variables are in
test_commands.py.)"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import httpx
import pytest

from tests.support.servers import Service

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_a_busy_port_is_one_line_and_exit_2_before_serving(run_cli_process, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli_process("serve", "--port", port, "--db", tmp_path / "plans.db")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"shardplan serve: cannot listen on 127.0.0.1:{port}: Address already in use; another "
        "process has it: stop that one, or choose another --port\n"
    )


def test_an_address_not_of_this_machine_names_the_host(run_cli_process, tmp_path):
    """192.0.2.1 is TEST-NET-1 (RFC 5737): no machine has it."""
    result = run_cli_process(
        "serve", "--host", "192.0.2.1", "--port", "0", "--db", tmp_path / "plans.db"
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("shardplan serve: cannot listen on 192.0.2.1:0: ")
    assert result.stderr.endswith("choose another --host\n")


@pytest.mark.slow  # its subject is the process
def test_the_access_log_is_off_unless_asked_for(shardplan_exe, tmp_path):
    def requests_logged(directory: Path, **options) -> str:
        directory.mkdir()
        service = Service(
            shardplan_exe, directory / "log", db=str(directory / "plans.db"), **options
        ).start()
        try:
            httpx.get(f"{service.base}/v1/plans/{'e' * 64}", timeout=30)
        finally:
            service.stop()
        return service.log()

    quiet = requests_logged(tmp_path / "default")
    assert "GET /healthz" not in quiet and "GET /v1/plans" not in quiet
    logged = requests_logged(tmp_path / "flag", args=("--access-log",))
    assert "127.0.0.1:" in logged and f'"GET /v1/plans/{"e" * 64} HTTP/1.1" 404' in logged
    assert '"GET /healthz HTTP/1.1" 200' in logged
    by_variable = requests_logged(tmp_path / "variable", env={"SHARDPLAN_ACCESS_LOG": "1"})
    assert '"GET /healthz HTTP/1.1" 200' in by_variable


@pytest.mark.slow  # its subject is the process
def test_sigterm_after_the_cpu_lane_worked_leaks_no_semaphores(shardplan_exe, tmp_path):
    """The lane's process pool holds five named semaphores; a SIGTERMed service ends by
    SIGTERM (uvicorn raises it again), so nothing at exit would unlink them: the lane's
    shutdown must, or Python's resource tracker reports them as leaked."""
    service = Service(shardplan_exe, tmp_path / "log", db=str(tmp_path / "plans.db")).start()
    try:
        pair = {
            "request": json.loads((EXAMPLES / "request.json").read_text()),
            "plan": json.loads((EXAMPLES / "plan.json").read_text()),
        }
        checked = httpx.post(f"{service.base}/v1/validate", json=pair, timeout=60)
        assert checked.json() == {"valid": True, "violations": []}  # ran in the CPU lane
    finally:
        service.stop()
    assert service.process.returncode == -15  # SIGTERM's default, after a graceful stop
    assert "leaked semaphore" not in service.log(), service.log()
    assert "Traceback" not in service.log(), service.log()
