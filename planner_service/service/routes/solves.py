"""Asynchronous solves: ``POST /v1/plans`` with ``Prefer: respond-async`` (RFC 7240)
answers 202 with a job (``solver/jobs.py``); GET /v1/solves/{job_id} reports it,
GET /v1/solves/{job_id}/events streams it as server-sent events until it ends, and
GET /v1/solves/{job_id}/view shows it to people."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from planner_service.plan.api import SolveJob
from planner_service.service.deps import JobId, Jobs, State, reader
from planner_service.service.http.problems import PROBLEM_CONTENT, ProblemError
from planner_service.service.http.responses import job_content, job_response
from planner_service.service.pages.job import render_job_page
from planner_service.service.solver.jobs import SolveJobs

router = APIRouter(tags=["solves"])

EVENT_STREAM = "text/event-stream"
POLL_S = 1.0  # a stream looks at a job run elsewhere (another process) this often
HEARTBEAT_S = 15.0  # a comment line at least this often keeps proxies from closing it


@router.get(
    "/v1/solves/{job_id}",
    dependencies=[Depends(reader)],
    responses={
        200: {"description": "the job as it is now", **job_content()},
        404: {"description": "no such job", **PROBLEM_CONTENT},
    },
)
async def get_solve(job_id: JobId, jobs: Jobs) -> Response:
    """A solve job: status, stage, incumbent objective, lower bound, gap and elapsed time
    as the solver reports them, the plan (``plan_id``, ``plan_url``) once done, or the
    problem once it ended without one. ``Cache-Control: no-store``: it changes."""
    job = await _job(jobs, job_id)
    response = job_response(job, status=200)
    response.headers["Cache-Control"] = "no-store"
    return response


@router.get(
    "/v1/solves/{job_id}/events",
    dependencies=[Depends(reader)],
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "server-sent events: `event: solve` with the job (as GET "
            "/v1/solves/{job_id}) on each change, the last when it has ended; `: keep-alive` "
            "comments between",
            "content": {EVENT_STREAM: {"schema": {"type": "string"}}},
        },
        404: {"description": "no such job", **PROBLEM_CONTENT},
        503: {"description": "too many event streams open", **PROBLEM_CONTENT},
    },
)
async def solve_events(
    job_id: JobId, http_request: Request, jobs: Jobs, state: State
) -> StreamingResponse:
    """The job as a stream of server-sent events, one per change (progress at most twice a
    second), ending with the job's final state; poll GET /v1/solves/{job_id} instead when
    a stream cannot be held open."""
    _reserve_stream(jobs, state.settings.max_event_streams)
    try:
        first = await _job(jobs, job_id)
    except BaseException:
        jobs.streams -= 1
        raise
    return _CountedStream(
        jobs,
        _events(jobs, first, http_request, state.stopping),
        media_type=EVENT_STREAM,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def _reserve_stream(jobs: SolveJobs, limit: int) -> None:
    """Counts a stream in before anything awaits, or refuses it: checked and counted across
    an await, 8 of 40 opens at once got through a cap of 3 (issue 36). The cap is per HTTP
    worker process (docs/operations.md)."""
    if jobs.streams >= limit:
        raise ProblemError(
            503,
            f"this service process has {limit} event streams open "
            "(SHARDPLAN_MAX_EVENT_STREAMS); poll GET /v1/solves/{job_id} instead, or retry",
            headers={"Retry-After": "5"},
        )
    jobs.streams += 1


class _CountedStream(StreamingResponse):
    """An event stream that counts itself out when its response ends, however it ends (an
    async generator never started runs no ``finally``: a client gone before the first event
    would have kept its count for good)."""

    def __init__(self, jobs: SolveJobs, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.jobs = jobs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.jobs.streams -= 1


async def _events(
    jobs: SolveJobs, job: SolveJob, http_request: Request, stopping: threading.Event
) -> AsyncIterator[str]:
    """Each change of the job (elapsed time aside) as an event, a comment every
    ``HEARTBEAT_S`` without one, until the job ends, the client goes away or the server is
    stopping (each looked for every ``POLL_S`` at most, so that a stream left behind stops
    counting within it, and a stopping server's streams end cleanly within its grace; the
    client reconnects to a replica that serves)."""
    loop = asyncio.get_running_loop()
    sent: str | None = None  # the last job sent, without its clock fields
    last_write = loop.time()
    number = 0
    while True:
        seen = job.model_dump_json(exclude={"elapsed_s", "updated_at"})
        if seen != sent:
            number += 1
            yield f"event: solve\nid: {number}\ndata: {job.model_dump_json()}\n\n"
            sent, last_write = seen, loop.time()
            if job.status.ended:
                return
        elif loop.time() - last_write >= HEARTBEAT_S:
            yield ": keep-alive\n\n"
            last_write = loop.time()
        await jobs.changed(job.job_id, POLL_S)
        if stopping.is_set() or await http_request.is_disconnected():
            return
        job = await jobs.get(job.job_id) or job


@router.get(
    "/v1/solves/{job_id}/view",
    dependencies=[Depends(reader)],
    response_class=HTMLResponse,
    responses={404: {"description": "no such job", **PROBLEM_CONTENT}},
)
async def view_solve(job_id: JobId, jobs: Jobs) -> HTMLResponse:
    """A page for people: the job's status and progress, reloaded every 2 s while it runs
    (no scripts), then the plan's page once it is done."""
    job = await _job(jobs, job_id)
    return HTMLResponse(render_job_page(job), headers={"Cache-Control": "no-store"})


async def _job(jobs: SolveJobs, job_id: str) -> SolveJob:
    job = await jobs.get(job_id)
    if job is None:
        raise ProblemError(
            404,
            f"no solve job {job_id} here: jobs come from POST /v1/plans with "
            "`Prefer: respond-async`",
        )
    return job
