"""Hostile input (issue 18, section 2): every body route answers every case in
``tests/service/hostile.py`` with a 422 problem+json that names the field, the value and the limit,
never a 500 or a stall. In process for each route and case (fast), then the whole set
against a real server, which must still answer ``/healthz`` and solve afterwards."""

from __future__ import annotations

import asyncio
import functools
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import httpx
import pytest
from fastapi import FastAPI

from planner_service.plan.api import PlanSummary, SolveJobStatus
from planner_service.plan.canonical import canonical_bytes
from planner_service.plan.codec import parse_request
from planner_service.plan.errors import InputError
from planner_service.service.app import create_app
from planner_service.service.cpu import CpuLane
from planner_service.service.http.problems import ProblemError
from planner_service.service.settings import Settings
from tests.conftest import BACKENDS, database_url
from tests.service import test_solver_pool as pool_tests
from tests.service import test_solves as solves_tests
from tests.service.hostile import Hostile, every_case, valid_pair, valid_request
from tests.service.test_api import cursor_of
from tests.service.test_importing import lopsided
from tests.service.test_solver_pool import alive, command_line, process_tree
from tests.service.test_solves import ASYNC, timed_request
from tests.support import builders
from tests.support.builders import request, table
from tests.support.servers import Service

pytestmark = pytest.mark.timeout(120)

JSON = {"content-type": "application/json"}
STALL_S = 60
CASES = every_case()


def assert_names_the_field(response: httpx.Response, case: Hostile) -> None:
    assert response.status_code == 422, (case.name, response.status_code, response.text[:400])
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["title"] == "Invalid input"
    named = [error for error in problem["errors"] if error["path"] == case.path]
    assert named, (case.name, problem["errors"])
    assert all("value" in error for error in named), named
    assert any(case.says in error["message"] for error in named), named


@dataclass(frozen=True)
class InProcess:
    """The app in this process (lifespan run, httpx's ASGI transport, no socket):
    calling it answers like ``httpx.Client.request``."""

    app: FastAPI
    call: Callable[..., httpx.Response]

    def __call__(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.call(method, path, **kwargs)


@pytest.fixture(scope="module")
def in_process(tmp_path_factory) -> Iterator[InProcess]:
    database = tmp_path_factory.mktemp("hostile") / "plans.db"
    app = create_app(Settings(database_url=str(database), solve_workers=1))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    with (
        anyio.from_thread.start_blocking_portal() as portal,
        portal.wrap_async_context_manager(app.router.lifespan_context(app)),
    ):
        client = httpx.AsyncClient(transport=transport, base_url="http://app")

        async def call(method: str, path: str, **kwargs: Any) -> httpx.Response:
            with anyio.fail_after(STALL_S):  # a stall fails the test, not the run
                return await client.request(method, path, **kwargs)

        yield InProcess(
            app,
            lambda method, path, **kwargs: portal.call(
                functools.partial(call, method, path, **kwargs)
            ),
        )
        portal.call(client.aclose)


@pytest.mark.parametrize(("route", "case"), CASES, ids=[f"{r} {c.name}" for r, c in CASES])
def test_hostile_input_is_422_naming_field_value_and_limit(in_process, route, case):
    method, path = route.split(" ")
    assert_names_the_field(in_process(method, path, content=case.body, headers=JSON), case)


@pytest.fixture(scope="module")
def hostile_service(shardplan_exe, tmp_path_factory):
    directory = tmp_path_factory.mktemp("hostile-service")
    server = Service(shardplan_exe, directory / "log", db=str(directory / "plans.db")).start()
    yield server
    server.stop()


def test_real_server_refuses_every_hostile_input_and_keeps_serving(hostile_service):
    with httpx.Client(base_url=hostile_service.base, timeout=60) as http:
        for route, case in CASES:
            method, path = route.split(" ")
            assert_names_the_field(http.request(method, path, content=case.body), case)
            assert http.get("/healthz").status_code == 200
        # Nothing was left running in the solve pool: a real solve is admitted and fits.
        checked = http.post("/v1/check", json=valid_request())
        assert checked.status_code == 200, checked.text
        assert checked.json()["fits"] is True
        assert "Traceback" not in hostile_service.log()


@pytest.mark.slow  # solves to their time limits
@pytest.mark.parametrize("backend", BACKENDS)
def test_hostile_clients_of_the_newer_routes_on_each_store(
    backend, request, shardplan_exe, tmp_path
):
    """Issue 36 as its prober went at it, on each store: a NUL in a cursor (PostgreSQL's
    503), a forged "optimal" plan imported under this planner's version (then a POST's
    ``hit``), and async submissions past the queue (all accepted, three failed later)."""
    postgres = request.getfixturevalue("postgres") if backend == "postgres" else None
    env = {"SHARDPLAN_SOLVE_WORKERS": "1", "SHARDPLAN_SOLVE_QUEUE": "0", "SHARDPLAN_JOB_QUEUE": "1"}
    db = database_url(backend, postgres, tmp_path)
    server = Service(shardplan_exe, tmp_path / "log", db=db, env=env).start()
    try:
        with httpx.Client(base_url=server.base, timeout=60) as http:
            for route in ("/v1/plans", "/v1/aliases"):
                answer = http.get(route, params={"after": cursor_of("2026\0\nx")})
                assert answer.status_code == 422 and answer.json()["errors"][0]["path"] == "after"
            req, plan, plan_id = lopsided("hostile")
            put = http.put(f"/v1/plans/{plan_id}", json={"request": req, "plan": plan})
            assert (
                put.status_code == 201 and put.headers["x-shardplan-solver-report"] == "unverified"
            )
            posted = http.post("/v1/plans", json=req)
            assert posted.headers["x-shardplan-cache"] == "miss"
            assert posted.headers["x-shardplan-plan-id"] != plan_id
            _flood_of_async_submissions(http)
        assert "Traceback" not in server.log()
    finally:
        server.stop()


def _flood_of_async_submissions(http: httpx.Client) -> None:
    """Five distinct async solves at once with room for two: each is a 202 whose job ends
    with its plan, or a 503 with Retry-After; none is accepted and then failed."""
    documents = [timed_request(70 + index, 1.0) for index in range(5)]
    with ThreadPoolExecutor(len(documents)) as threads:
        answers = list(
            threads.map(lambda doc: http.post("/v1/plans", json=doc, headers=ASYNC), documents)
        )
    assert {answer.status_code for answer in answers} == {202, 503}
    for answer in answers:
        if answer.status_code == 503:
            assert int(answer.headers["retry-after"]) >= 1
            continue
        ended = solves_tests.wait_for(http, answer.json()["job_id"], lambda job: job.status.ended)
        assert ended.status is SolveJobStatus.DONE, ended.problem


# --------------------------------------------------------------------------- off the loop


def test_validate_reports_problems_in_both_documents_by_their_path_in_the_body(in_process):
    req, plan = valid_pair()
    req["tables"][0]["embedding_dim"] = 0
    plan["world_size"] = 70_000  # within the type's limit, over the service's
    response = in_process("POST", "/v1/validate", json={"request": req, "plan": plan})
    assert response.status_code == 422
    assert [(e["path"], e["value"]) for e in response.json()["errors"]] == [
        ("request.tables[0].embedding_dim", "0"),
        ("plan.world_size", "70000"),
    ]
    assert "at most 65536 on this service" in response.json()["errors"][1]["message"]


def _stored_plan(in_process_app: FastAPI, world_size: int) -> str:
    """A plan on ``world_size`` ranks put straight into the app's store; its plan_id."""
    req = request([table("a"), table("b")], world_size=world_size)
    plan = builders.plan(
        req,
        {"a": builders.table_wise(req, "a", 0), "b": builders.row_wise(req, "b")},
        hbm_bytes=[7 * 2**20 if rank == 3 else 2**20 for rank in range(world_size)],
    )
    in_process_app.state.service.store().plans.put(
        plan_id=plan.plan_id,
        request_hash=plan.request_hash,
        planner_version=plan.planner_version,
        request=canonical_bytes(req),
        plan=canonical_bytes(plan),
        summary=PlanSummary.of(plan),
    )
    return plan.plan_id


@pytest.mark.parametrize("world_size", [8, 4096])
def test_plan_page_rows_grow_with_what_differs_not_with_world_size(in_process, world_size):
    plan_id = _stored_plan(in_process.app, world_size)
    page = in_process("GET", f"/v1/plans/{plan_id}/view")
    assert page.status_code == 200, page.text
    ranks = re.findall(r'<tr data-ranks="([0-9-]+)"', page.text)
    assert ranks == ["0", "1-2", "3", f"4-{world_size - 1}"]  # 0 holds a, 3 more HBM
    assert f"2 tables on {world_size} ranks" in page.text


def wait_for(path: Path) -> str:
    """Runs in a lane's worker: blocks until ``path`` exists."""
    while not path.exists():
        time.sleep(0.01)
    return path.read_text()


def test_cpu_lane_turns_away_work_beyond_its_queue_and_frees_slots_only_when_work_ends(
    tmp_path,
):
    go = tmp_path / "go"

    async def scenario(lane: CpuLane) -> None:
        running = asyncio.create_task(lane.run(wait_for, go))
        while lane.admitted == 0:  # it took the one slot
            await asyncio.sleep(0)
        with pytest.raises(ProblemError) as busy:
            await lane.run(sum, [1, 2])
        assert busy.value.status == 503 and busy.value.headers == {"Retry-After": "1"}
        running.cancel()  # the client went away; its worker still runs
        with pytest.raises(asyncio.CancelledError):
            await running
        with pytest.raises(ProblemError):
            await lane.run(sum, [1, 2])
        go.write_text("done")
        while lane.admitted:  # the work ends, then its slot is free
            await asyncio.sleep(0.01)
        assert await lane.run(sum, [1, 2]) == 3
        with pytest.raises(InputError) as refused:  # raised in the worker, named here
            await lane.run(parse_request, b'{"topology": {"world_size": 0}}')
        assert refused.value.problems[0].path == "topology.world_size"

    lane = CpuLane(workers=1, queue=0)
    try:
        asyncio.run(scenario(lane))
    finally:
        lane.shutdown()


def die() -> None:
    """Runs in a lane's worker: the process ends as if killed (out of memory, say)."""
    os._exit(1)


def test_cpu_lane_replaces_a_dead_worker_and_answers_503_meanwhile():
    async def scenario(lane: CpuLane) -> None:
        with pytest.raises(ProblemError) as died:
            await lane.run(die)
        assert died.value.status == 503 and "the pool was restarted" in died.value.detail
        assert lane.admitted == 0
        assert await lane.run(sum, [2, 3]) == 5

    lane = CpuLane(workers=1, queue=0)
    try:
        asyncio.run(scenario(lane))
    finally:
        lane.shutdown()


@pytest.mark.slow  # signals a server
@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_lane_workers_do_not_outlive_the_server(signal_number, shardplan_exe, tmp_path):
    """The processes that validate and render die with the server, as solver processes do
    (tests/service/test_solver_pool.py), however it ends."""
    server = Service(shardplan_exe, tmp_path / "log", db=str(tmp_path / "plans.db")).start()
    assert server.process is not None
    try:
        req, plan = valid_pair()
        with httpx.Client(base_url=server.base, timeout=60) as http:
            checked = http.post("/v1/validate", json={"request": req, "plan": plan})
            assert checked.json() == {"valid": True, "violations": []}
        tree = process_tree(server.process.pid)
        assert any("spawn_main" in command_line(pid) for pid in tree)  # a lane worker
        os.kill(server.process.pid, signal_number)
        pool_tests.wait_for(
            lambda: (
                server.process.poll() is not None  # type: ignore[union-attr]
                and not any(alive(pid, started) for pid, started in tree.items())
            ),
            f"every process of the server gone after {signal.Signals(signal_number).name}",
            timeout_s=30,
        )
    finally:
        pool_tests.kill_what_is_left(server)
