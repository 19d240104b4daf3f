"""Asynchronous solves (``POST /v1/plans`` with ``Prefer: respond-async``): jobs that
outlive the HTTP connection and the service process that started them.

- A job's id is derived from the request's hash and the planner version, so the same
  request names the same job from any client, worker or replica; its solve is the pool's
  solve of that request (key ``plan:<request_hash>``), so async and sync callers of one
  request share one solve.
- Each job is a row of the store's ``solves`` table: the request, status, progress and a
  lease (``owner``, ``heartbeat_at``). The process solving it renews the lease every
  ``job_lease_s / 3`` from a thread of its own (``leases.py``) and records progress at most
  once a second; the progress itself comes from the solver process
  (``SolvePool.progress``).
- A row still queued or running whose lease lapsed belongs to a process that is gone
  (killed, restarted, its host lost): any service process takes it over (``claim_solve``,
  atomic) and solves it again from the stored request, on start, every ``job_lease_s / 3``
  while it has room in its pool, and when the job is read. A process that stops cleanly
  lets its leases lapse at once. A job started ``MAX_ATTEMPTS`` times fails.
- Statuses are ``SolveJobStatus`` and stages ``SolveStage`` here; the store keeps their
  values (text), read back into the enums.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import socket
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.concurrency import run_in_threadpool

from planner_service import PLANNER_VERSION
from planner_service.plan.api import SolveJob, SolveJobStatus
from planner_service.plan.types import gap
from planner_service.service.http import metrics
from planner_service.service.http.problems import ProblemError
from planner_service.service.solver.decoded import DecodedRequest
from planner_service.service.solver.leases import LeaseKeeper
from planner_service.service.solver.pool import (
    ShuttingDownError,
    SolveProgress,
    SolverError,
    SolveStage,
    SolveUnavailableError,
)
from planner_service.service.solver.run import no_plan, solve_and_store, unavailable
from planner_service.service.state import ServiceState
from planner_service.service.store import (
    JobQueueFullError,
    NewSolve,
    StoredSolve,
    StoreUnavailableError,
)

log = logging.getLogger("shardplan.api")


class QueueFullError(SolveUnavailableError):
    """SHARDPLAN_JOB_QUEUE accepted jobs wait already: a new one is refused, not failed later."""

    title = "Job queue full"


MAX_ATTEMPTS = 3  # a job whose process stopped this many times is not resumed again
RECORD_INTERVAL_S = 1.0  # progress is written to the store at most this often per job
JOB_ID_PATTERN = r"^[0-9a-f]{64}$"


def job_id_for(request_hash: str) -> str:
    """The job of a request under this planner version: the same from every process."""
    return hashlib.sha256(f"solve:{PLANNER_VERSION}:{request_hash}".encode()).hexdigest()


def _now() -> datetime:
    return datetime.now(UTC)


def _stamp(moment: datetime) -> str:
    return moment.isoformat(timespec="microseconds")


@dataclass(eq=False)
class _Running:
    """A job this process is solving."""

    row: StoredSolve
    key: str  # the pool's key for its solve
    task: asyncio.Task[None] | None = None
    started_at: str | None = None
    recorded: float = -1e9  # loop time of the last progress written to the store
    last: SolveProgress | None = None  # the last progress its solver process reported
    flush_pending: bool = False  # a write of the latest progress is scheduled
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    # Its progress writes, one at a time in the order they were asked for (asyncio's lock
    # is first come, first served): two in threads at once could land out of order, and a
    # write of "queued" taken before the solve started landed after "running" (the job's
    # events went running, then queued again).
    writing: asyncio.Lock = field(default_factory=asyncio.Lock)


class SolveJobs:
    """This service process's side of the jobs: starts, records, resumes and reports them.
    Everything runs on the event loop; the store is called in threads."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.streams = 0  # event streams open (GET /v1/solves/{id}/events)
        self._running: dict[str, _Running] = {}
        self._by_key: dict[str, str] = {}  # pool key -> job id
        self._sweeper: asyncio.Task[None] | None = None
        self._writes: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()  # set: sweep now (a place in the pool is free)
        settings = state.settings
        self.leases = LeaseKeeper(
            self._renew,
            interval_s=self.lease_s / 3,
            stall_limit_s=settings.max_time_limit_s + settings.solve_grace_s + self.lease_s,
        )

    @property
    def lease_s(self) -> float:
        return self.state.settings.job_lease_s

    # ------------------------------------------------------------------ life

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_forever())
        self.leases.start()

    def _renew(self) -> None:
        """The lease keeper's call, in its thread: renew every lease this process holds."""
        self.state.store().jobs.renew(self.owner, _stamp(_now()))

    async def stop(self) -> None:
        """Stop solving (the pool is about to be shut down) and let this process's leases
        lapse, so that another process resumes its jobs at once."""
        had_jobs = bool(self._running)
        tasks = [t for t in (self._sweeper, *(r.task for r in self._running.values())) if t]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, *self._writes, return_exceptions=True)
        await asyncio.to_thread(self.leases.stop)
        if had_jobs:
            with contextlib.suppress(StoreUnavailableError):
                await run_in_threadpool(self.state.store().jobs.release, self.owner)
        self._running.clear()
        self._by_key.clear()

    def on_progress(self, key: str) -> None:
        """The pool's hook: the solve of ``key`` started or reported progress."""
        job_id = self._by_key.get(key)
        running = self._running.get(job_id) if job_id else None
        if running is None:
            return
        running.changed.set()
        running.changed = asyncio.Event()
        state = self.state.pool.progress(key)
        if state is not None and state.progress is not None:
            running.last = state.progress
        loop_time = asyncio.get_running_loop().time()
        first_start = state is not None and state.running and running.started_at is None
        if first_start and state is not None:
            running.started_at = _stamp(_now() - timedelta(seconds=state.elapsed_s))
        wait_s = running.recorded + RECORD_INTERVAL_S - loop_time
        if first_start or wait_s <= 0:
            self._record_now(running)
        elif not running.flush_pending:  # the last report of a burst is written too
            running.flush_pending = True
            asyncio.get_running_loop().call_later(wait_s, self._flush, running)

    def _record_now(self, running: _Running) -> None:
        running.recorded = asyncio.get_running_loop().time()
        self._write(self._record(running))

    def _flush(self, running: _Running) -> None:
        running.flush_pending = False
        if self._running.get(running.row.job_id) is running:
            self._record_now(running)

    # ------------------------------------------------------------------ submit

    async def submit(self, request: DecodedRequest) -> SolveJob:
        """The job for ``request`` (its references inlined): done at once when its plan is
        stored, else started here unless it is running somewhere already, else queued in
        the store until a process has room. 503 when the queue is full: an accepted job
        runs."""
        try:
            return await self._submit(request)
        except JobQueueFullError as error:
            metrics.REJECTED.inc()
            raise unavailable(self._queue_full(error)) from None

    async def _submit(self, request: DecodedRequest) -> SolveJob:
        request_hash = request.request_hash
        job_id = job_id_for(request_hash)
        new = NewSolve(
            job_id, request_hash, PLANNER_VERSION, request.document, request.time_limit_s
        )
        store = self.state.store()
        existing = await self.state.plan_for_request(request_hash)
        if existing is not None:
            done = await run_in_threadpool(store.jobs.add_done, new, existing[0], _stamp(_now()))
            return self._resource(done)
        if job_id in self._running:
            return await self.get(job_id) or self._resource(self._running[job_id].row)
        key = "plan:" + request_hash
        if not self.state.pool.reserve(key):  # no await between the check and the hold
            waiting = await run_in_threadpool(
                lambda: store.jobs.enqueue(
                    new, now=_stamp(_now()), max_waiting=self.state.settings.job_queue
                )
            )
            return self._resource(waiting)
        try:
            row, claimed = await self._claim(job_id, new)
        except BaseException:
            self.state.pool.release(key)
            raise
        assert row is not None
        if claimed:
            self._begin(row, request)
        else:
            self.state.pool.release(key)
        return await self.get(job_id) or self._resource(row)

    def _queue_full(self, error: JobQueueFullError) -> QueueFullError:
        """Retry-After: when this process could start one more solve, plus the waiting
        jobs' time limits shared over its solver processes (long: other replicas help)."""
        pool = self.state.pool
        retry_after_s = pool.retry_after_s() + math.ceil(error.time_limits_s / pool.workers)
        return QueueFullError(
            f"{error.waiting} accepted job(s) wait for a solver process already, the most "
            f"SHARDPLAN_JOB_QUEUE ({self.state.settings.job_queue}) allows; nothing was "
            "queued",
            retry_after_s,
        )

    async def _claim(self, job_id: str, new: NewSolve | None) -> tuple[StoredSolve | None, bool]:
        now = _now()
        return await run_in_threadpool(
            lambda: self.state.store().jobs.claim(
                job_id,
                owner=self.owner,
                now=_stamp(now),
                stale_before=_stamp(now - timedelta(seconds=self.lease_s)),
                max_attempts=MAX_ATTEMPTS,
                new=new,
            )
        )

    def _begin(self, row: StoredSolve, request: DecodedRequest | None) -> None:
        key = "plan:" + row.request_hash
        running = _Running(row, key)
        self._running[row.job_id] = running
        self._by_key[key] = row.job_id
        self.leases.hold()
        running.task = asyncio.create_task(self._solve(running, request))

    async def _solve(self, running: _Running, request: DecodedRequest | None) -> None:
        job_id = running.row.job_id
        row = running.row
        try:
            if await self._stored_meanwhile(running):
                return
            if request is None:  # resumed: the request is in the store, whole and canonical
                document = await run_in_threadpool(self.state.store().jobs.request, job_id)
                assert document is not None
                request = DecodedRequest.stored(document, row.request_hash, row.time_limit_s)
            result, _ = await solve_and_store(self.state, request.restarted())
            if result.plan is not None:
                report = await asyncio.to_thread(_solver_report, result.plan)
                await self._end(
                    job_id, SolveJobStatus.DONE, running, plan_id=result.plan_id, final=report
                )
            else:
                await self._end(job_id, SolveJobStatus.NO_PLAN, running, problem=no_plan(result))
        except ProblemError as error:
            if error.title != ShuttingDownError.title:  # else resumed by the next process
                await self._end(job_id, SolveJobStatus.FAILED, running, problem=error)
        except SolverError as error:
            log.error("job %s: %s", job_id, error)
            problem = ProblemError(500, "the solver raised; the traceback is in the server log")
            await self._end(job_id, SolveJobStatus.FAILED, running, problem=problem)
        except StoreUnavailableError as error:  # its lease lapses: resumed when it is back
            log.warning("job %s: the store failed mid-job: %s", job_id, error)
        except Exception:  # a bug: the job fails rather than being resumed forever
            log.exception("job %s failed", job_id)
            problem = ProblemError(500, "the job failed; the traceback is in the server log")
            await self._end(job_id, SolveJobStatus.FAILED, running, problem=problem)
        finally:
            self.leases.drop()
            self._running.pop(job_id, None)
            self._by_key.pop(running.key, None)
            self.state.pool.release(running.key)
            running.changed.set()
            self._wake.set()  # a place is free: a waiting job may take it now

    async def _stored_meanwhile(self, running: _Running) -> bool:
        """End the job with the plan its request has now, if it has one: stored by a sync
        POST, another replica or an earlier attempt while this job waited or its process
        was gone. A resumed job never solves a request that is answered already."""
        existing = await self.state.plan_for_request(running.row.request_hash)
        if existing is None:
            return False
        plan_id, plan = existing
        report = await asyncio.to_thread(_solver_report, plan)
        await self._end(
            running.row.job_id, SolveJobStatus.DONE, running, plan_id=plan_id, final=report
        )
        return True

    async def _end(
        self,
        job_id: str,
        status: SolveJobStatus,
        running: _Running,
        *,
        plan_id: str | None = None,
        problem: ProblemError | None = None,
        final: tuple[float, float] | None = None,
    ) -> None:
        """Record the job's end, with its last stage and, when done, the plan's objective
        and lower bound (else the last the solver reported)."""
        document = None if problem is None else _problem_bytes(problem)
        last = running.last
        objective, bound = final or ((last.objective, last.bound) if last else (None, None))
        await run_in_threadpool(
            lambda: self.state.store().jobs.end(
                job_id,
                status,
                plan_id=plan_id,
                problem=document,
                progress=(_stage_text(last.stage if last else None), objective, bound),
                now=_stamp(_now()),
            )
        )

    async def _record(self, running: _Running) -> None:
        async with running.writing:  # the state read and written in turn: the last wins
            state = self.state.pool.progress(running.key)
            if state is None:
                return
            progress = state.progress
            owned = await run_in_threadpool(
                lambda: self.state.store().jobs.record_progress(
                    running.row.job_id,
                    self.owner,
                    running=state.running,
                    stage=_stage_text(progress.stage if progress else None),
                    objective=progress.objective if progress else None,
                    bound=progress.bound if progress else None,
                    started_at=running.started_at,
                    now=_stamp(_now()),
                )
            )
        if not owned and running.row.job_id in self._running:
            log.warning("job %s was taken over by another process", running.row.job_id)

    def _write(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._writes.add(task)
        task.add_done_callback(self._written)

    def _written(self, task: asyncio.Task[None]) -> None:
        self._writes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("recording a job's progress failed: %s", task.exception())

    # ------------------------------------------------------------------ resume

    async def _sweep_forever(self) -> None:
        """Sweep every lease/3, and at once when one of this process's jobs ends; each
        sweep shows the lease keeper that the event loop is alive."""
        while True:
            self.leases.beat()
            try:
                await self.sweep()
            except StoreUnavailableError as error:
                log.warning("jobs: the store is not reachable: %s", error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.lease_s / 3)
            self._wake.clear()

    async def sweep(self) -> None:
        """Take jobs waiting in the queue and jobs whose leases lapsed, oldest first, as
        many as the pool has room for (this process's own leases are the keeper's)."""
        store = self.state.store()
        room = self.state.pool.capacity - self.state.pool.depth
        if room <= 0:
            return
        stale_before = _stamp(_now() - timedelta(seconds=self.lease_s))
        for job_id in await run_in_threadpool(store.jobs.to_take, stale_before, room):
            await self._take_over(job_id)

    async def _take_over(self, job_id: str) -> StoredSolve | None:
        """Take a waiting or lapsed job when the pool has room. A place is held while the
        store is asked (under a key of its own: the request's is not known yet), then
        handed to the job's solve with no await between."""
        hold = "take:" + job_id
        if job_id in self._running or not self.state.pool.reserve(hold):
            return None
        try:
            row, claimed = await self._claim(job_id, None)
        finally:
            self.state.pool.release(hold)
        if row is not None and claimed and job_id not in self._running:
            self.state.pool.reserve("plan:" + row.request_hash)
            if row.attempts > 1:
                log.warning("job %s: resuming it (attempt %d)", job_id, row.attempts)
            self._begin(row, None)
        return row

    # ------------------------------------------------------------------ read

    async def get(self, job_id: str) -> SolveJob | None:
        """The job as it is now: from this process's solve when it runs here, else from
        the store (taken over first when its lease lapsed)."""
        running = self._running.get(job_id)
        if running is not None:
            return self._live(running)
        row = await run_in_threadpool(self.state.store().jobs.get, job_id)
        lapsed = row is not None and row.active and row.heartbeat_at < self._stale_before()
        if row is not None and (row.waiting or lapsed):
            row = await self._take_over(job_id) or row
            running = self._running.get(job_id)
            if running is not None:
                return self._live(running)
        return None if row is None else self._resource(row)

    async def changed(self, job_id: str, timeout_s: float) -> None:
        """Returns when the job this process runs changes, or after ``timeout_s``."""
        running = self._running.get(job_id)
        if running is None:
            await asyncio.sleep(timeout_s)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(running.changed.wait(), timeout_s)

    def _stale_before(self) -> str:
        return _stamp(_now() - timedelta(seconds=self.lease_s))

    def _live(self, running: _Running) -> SolveJob:
        """The job as this process runs it. Once its solve has started it stays running,
        with the last progress, until its end is recorded: the pool forgets a solve when
        it returns, and the plan is stored after that (in a full suite on PostgreSQL, long
        enough that the job's events went running, then queued again, then done)."""
        state = self.state.pool.progress(running.key)
        finishing = state is None and running.started_at is not None
        progress = state.progress if state else running.last if finishing else None
        elapsed_s = None
        if state is not None and state.running:
            elapsed_s = round(state.elapsed_s, 3)
        elif finishing and running.started_at is not None:
            started = datetime.fromisoformat(running.started_at)
            elapsed_s = round((_now() - started).total_seconds(), 3)
        resource = self._resource(running.row)
        return resource.model_copy(
            update={
                "status": SolveJobStatus.RUNNING if elapsed_s is not None else resource.status,
                "stage": _stage_text(progress.stage if progress else None),
                "objective": progress.objective if progress else None,
                "lower_bound": progress.bound if progress else None,
                "gap": _gap(progress.objective, progress.bound) if progress else None,
                "elapsed_s": elapsed_s,
            }
        )

    def _resource(self, row: StoredSolve) -> SolveJob:
        elapsed_s = None
        if row.started_at is not None:
            end = _now() if row.active else datetime.fromisoformat(row.updated_at)
            elapsed_s = round((end - datetime.fromisoformat(row.started_at)).total_seconds(), 3)
        return SolveJob(
            job_id=row.job_id,
            status=SolveJobStatus(row.status),
            request_hash=row.request_hash,
            planner_version=row.planner_version,
            stage=row.stage,
            objective=row.objective,
            lower_bound=row.lower_bound,
            gap=_gap(row.objective, row.lower_bound),
            elapsed_s=elapsed_s,
            time_limit_s=row.time_limit_s,
            attempts=row.attempts,
            created_at=row.created_at,
            updated_at=row.updated_at,
            plan_id=row.plan_id,
            plan_url=None if row.plan_id is None else f"/v1/plans/{row.plan_id}",
            problem=None if row.problem is None else json.loads(row.problem),
        )


def _solver_report(plan: bytes) -> tuple[float, float]:
    """A stored plan's objective and lower bound (read as JSON: it was just validated)."""
    solver = json.loads(plan)["solver"]
    return float(solver["objective"]), float(solver["lower_bound"])


def _stage_text(stage: SolveStage | None) -> str | None:
    """A stage as the store and the job's JSON name it."""
    return None if stage is None else stage.value


def _gap(objective: float | None, bound: float | None) -> float | None:
    if objective is None or bound is None:
        return None
    return gap(objective, bound)


def _problem_bytes(problem: ProblemError) -> bytes:
    return json.dumps(problem.document()).encode()
