"""``options.time_limit_s`` on the service as its client waits for it, from the request's
arrival to the answer (issue 37, item 3): a request without a plan is answered within it
however costly explaining why would be, and a request that waits its whole limit for a
solver process is answered then, without one. Against a real ``shardplan serve`` with
one solver process; correctness bounds, not benchmarks (benchmarks/time_limit_bench.py)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from planner_service.plan.canonical import canonical_bytes
from tests.clients.cli.test_plan_time_limit import no_plan_request
from tests.service.test_solver_pool import hard_request, tiny_request
from tests.support.servers import Service

pytestmark = [pytest.mark.slow, pytest.mark.alone]

TIME_LIMIT_S = 1.0
BOUND_S = 3.0  # generous: the suite runs beside other work on 2 cores
BUSY_S = 8.0  # the solve that holds the one solver process


@pytest.fixture(scope="module")
def server(shardplan_exe, tmp_path_factory):
    directory = tmp_path_factory.mktemp("time-limits")
    service = Service(shardplan_exe, directory / "log", db=str(directory / "p.db"))
    service.start()
    yield service
    service.stop()


def test_a_request_without_a_plan_is_answered_within_its_limit(server):
    body = canonical_bytes(no_plan_request(TIME_LIMIT_S))
    with httpx.Client(base_url=server.base, timeout=60) as http:
        started = time.monotonic()
        answer = http.post("/v1/plans", content=body)
        elapsed_s = time.monotonic() - started
    assert answer.status_code == 422, answer.text[:500]
    assert answer.json()["infeasibility"]["reasons"]
    assert elapsed_s < TIME_LIMIT_S + BOUND_S, elapsed_s


def test_a_request_that_waits_its_whole_limit_for_a_solver_is_answered_then(server):
    busy: list[httpx.Response] = []

    def hold_the_solver() -> None:
        with httpx.Client(base_url=server.base, timeout=60) as http:
            busy.append(http.post("/v1/plans", json=hard_request(5, time_limit_s=BUSY_S)))

    holder = threading.Thread(target=hold_the_solver)
    holder.start()
    time.sleep(1.0)  # the hard solve has the one solver process
    with httpx.Client(base_url=server.base, timeout=60) as http:
        request = tiny_request("queued")
        request["options"]["time_limit_s"] = TIME_LIMIT_S
        started = time.monotonic()
        answer = http.post("/v1/plans", json=request)
        elapsed_s = time.monotonic() - started
    holder.join()
    assert answer.status_code == 422, answer.text[:500]
    problem = answer.json()
    assert problem["title"] == "No plan found"
    (reason,) = problem["infeasibility"]["reasons"]
    assert reason["code"] == "timed_out"
    assert "for a free solver process (all 1 were busy)" in reason["message"]
    assert "options.time_limit_s = 1 s" in reason["message"]
    assert elapsed_s < TIME_LIMIT_S + BOUND_S < BUSY_S, elapsed_s  # not after the hard solve
    assert busy and busy[0].status_code == 201, busy[0].text[:300] if busy else None
