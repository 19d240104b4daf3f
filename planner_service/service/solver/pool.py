"""The solve pool: solver processes that the service starts, watches and kills, so that
solving runs off the event loop.

Solves are CPU-bound (enumeration in Python, CP-SAT in C++ threads), so they run in
long-lived ``spawn``-started solver processes, warm (each imports the solver stack once),
one job at a time over its own pipe; the event loop only awaits them.

- Admission: at most ``workers + queue`` solves at once; beyond that ``PoolFullError``
  (503) with a Retry-After estimated from the time limits of what runs and waits. A caller
  that must await something before it asks for its solve (a job) ``reserve``s its place
  first, so that no other solve is admitted into it meanwhile.
- Time limit: waiting here for a solver process counts against a request's
  ``time_limit_s`` (not an async job's, nor the wait for a process still starting); a
  solve that waits its whole limit is answered then with ``WaitedOutError``.
- Identical requests in flight share one solve. A solve continues when its caller goes
  away, so its plan is still stored for the retry.
- Watchdog: a solve still running ``grace_s`` past its ``options.time_limit_s`` has its
  process killed (SIGKILL) and replaced, and its callers get ``SolveOverranError``. The
  solver is meant to stop at its time limit; the service does not depend on it.
  (``ProcessPoolExecutor``, used before, cannot kill one task.)
- A solver process that dies (the OOM killer, a crash) is replaced: ``SolverDiedError``.
- Progress: the solver's ``on_progress`` reports (stage, best objective, bound) travel
  back over the same pipe as ``SolveProgress`` (the stage a ``SolveStage``), at most one
  per ``PROGRESS_INTERVAL_S`` (and each new stage), and ``progress(key)`` tells where a
  solve in flight is; ``on_progress`` hears the key.
- No orphans: each solver process asks the kernel to SIGKILL it when the thread that
  started it ends (``PR_SET_PDEATHSIG``), so it dies with the service however the service
  ends, and an idle one also exits when its pipe closes. Processes are started only on
  the event loop's thread, which lives as long as the service. ``shutdown`` kills them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

from planner_service.plan.api import PlanSummary
from planner_service.service.processes import SOLVER_NAME, die_with_parent, name_process

T = TypeVar("T")
# What the service does with a plan before its client has it: the plan's bytes cross the
# pipe, their gzip and zstd encodings are made and stored, and the plan is sent. The
# encodings, measured on the loaded 2-core machine at 0.55 to 1.1 us per shard of
# shard-list plans (about 150 bytes a shard: 7 ns a byte), follow the bytes; schema 2.0
# writes about 100 bytes a table and 180 a rank. Three times the encodings' figure for
# the lot; the solver's search stops that much earlier (``solve.deadline.AfterSolve``).
AFTER_SOLVE_S_PER_TABLE = 3e-6
AFTER_SOLVE_S_PER_RANK = 4e-6
log = logging.getLogger("shardplan.api")

READY = "ready"  # a solver process's first message: warm, waiting for a job
RESPAWN_DELAY_S = 1.0  # before replacing a process that died before it was ready
RECENT_SOLVES = 32
PROGRESS_INTERVAL_S = 0.5  # a solver process reports progress at most this often


class SolveStage(StrEnum):
    """The solver's stages, in the order it reports them (``solve/pipeline.py``, and
    ``solve/cpsat/search.py`` for ``cp-sat``); the values are the names the solver reports
    and a job shows in its ``stage``."""

    ENUMERATE = "enumerate"
    WARM_START = "warm start"
    PACKING_BOUND = "packing bound"
    CP_SAT = "cp-sat"


_STAGE_NAMES = frozenset(stage.value for stage in SolveStage)


class SolveOutcome(StrEnum):
    """How a solve ended, as the solve-duration metric counts it: with a plan, without one
    (infeasible or none found in time), or killed past its time limit, or its process died."""

    PLAN = "plan"
    NO_PLAN = "no_plan"
    OVERRAN = "overran"
    DIED = "died"


@dataclass(frozen=True)
class SolveProgress:
    """Where a solve is: the solver's stage, its best objective and best lower bound so far
    (ms; None until known)."""

    stage: SolveStage
    objective: float | None
    bound: float | None


@dataclass(frozen=True)
class SolveState:
    """A solve in flight: ``running`` once a solver process took it (else waiting), for
    ``elapsed_s`` seconds, and the last progress its process reported."""

    running: bool
    elapsed_s: float
    progress: SolveProgress | None


@dataclass(frozen=True)
class SolveResult:
    """What a worker sends back: the stored form of the plan (and its summary, for lists)
    or of its infeasibility."""

    plan_id: str | None
    plan: bytes | None
    infeasibility: bytes | None
    wall_time_s: float
    summary: PlanSummary | None = None


@dataclass(frozen=True)
class _SolverCrash:
    """An exception raised inside the solver (a bug), as its traceback."""

    traceback: str


class SolveUnavailableError(RuntimeError):
    """No answer from the pool for this solve, for now: 503 with ``title``, this message,
    ``Retry-After`` and the ``extensions`` as problem fields."""

    title = "Service unavailable"

    def __init__(self, detail: str, retry_after_s: int, **extensions: Any) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s
        self.extensions = extensions


class PoolFullError(SolveUnavailableError):
    title = "Solver pool full"


class SolveOverranError(SolveUnavailableError):
    title = "Solve overran its time limit"


class SolverDiedError(SolveUnavailableError):
    title = "Solver process died"


class ShuttingDownError(SolveUnavailableError):
    title = "Service shutting down"

    def __init__(self) -> None:
        super().__init__(
            "the service is shutting down and stopped this solve before it ended; nothing "
            "was stored. Ask again: another replica, or this one once it is back, will "
            "solve it",
            1,
        )


class WaitedOutError(RuntimeError):
    """A solve waited its whole time limit for a free solver process: there is no time left
    to solve it, so it is answered at once (422 ``timed_out``, ``run.py``)."""

    def __init__(self, waited_s: float, time_limit_s: float, workers: int) -> None:
        super().__init__(f"waited {waited_s:.2f} s of a {time_limit_s:g} s time limit")
        self.waited_s = waited_s
        self.time_limit_s = time_limit_s
        self.workers = workers


class SolverError(RuntimeError):
    """The solver raised: a bug, answered as an internal error with its traceback logged."""


# --------------------------------------------------------------------------- solver process


def run_solver_process(connection: Connection, service_pid: int) -> None:
    """A solver process's whole life: die with the service, warm up, then solve one job
    at a time until the pipe closes (the service is gone)."""
    die_with_parent(service_pid)
    name_process(SOLVER_NAME)
    # Ctrl-C, and SIGTERM sent to a whole process group or cgroup (systemd), reach us as
    # well as the service: the service decides when a solve ends (it SIGKILLs us).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Warm: the first solve does not pay for these imports.
    import planner_service.service.solver.decoded  # noqa: F401
    import planner_service.solve.pipeline  # noqa: F401

    with contextlib.suppress(EOFError, OSError):
        connection.send(READY)
        while True:
            document, spent_s = connection.recv()
            reporter = _ProgressReporter(connection)
            result = _solve_safely(document, spent_s, reporter.report)
            with reporter.lock:
                connection.send(result)


class _ProgressReporter:
    """The solver's ``on_progress`` in a solver process: sends each new stage, and otherwise
    at most one report per ``PROGRESS_INTERVAL_S``, to the service. CP-SAT calls it from
    its own thread, hence the lock. Reporting never changes what the solver does."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.lock = threading.Lock()
        self._stage: SolveStage | None = None
        self._sent = -math.inf

    def report(self, name: str, objective: float | None, bound: float | None) -> None:
        """The solver names its stage as text: the enum from here on. A name that is no
        ``SolveStage`` is not reported (reporting must not fail a solve); a test runs every
        stage so that none is missed."""
        if name not in _STAGE_NAMES:
            return
        stage = SolveStage(name)
        now = time.monotonic()
        with self.lock:
            if stage == self._stage and now - self._sent < PROGRESS_INTERVAL_S:
                return
            self._stage, self._sent = stage, now
            with contextlib.suppress(OSError, ValueError):
                self.connection.send(SolveProgress(stage, objective, bound))


def _solve_safely(
    request_document: bytes,
    spent_s: float,
    on_progress: Callable[[str, float | None, float | None], None],
) -> SolveResult | _SolverCrash:
    try:
        return solve_document(request_document, on_progress, spent_s=spent_s)
    except Exception:
        return _SolverCrash(traceback.format_exc())


def solve_document(
    request_document: bytes,
    on_progress: Callable[[str, float | None, float | None], None] | None = None,
    *,
    spent_s: float = 0.0,
) -> SolveResult:
    """Runs in a solver process: parse (already validated by the API) and solve, in what is
    left of the time limit once the service's ``spent_s`` and the parse are taken off."""
    from planner_service.plan.codec import plan_bytes
    from planner_service.service.solver.decoded import request_of
    from planner_service.solve.deadline import AfterSolve, Deadline
    from planner_service.solve.pipeline import solve

    started = time.monotonic()
    request = request_of(request_document)
    spent_s += time.monotonic() - started
    deadline = Deadline.for_time_limit(
        request.options.time_limit_s,
        spent_s=spent_s,
        after=AfterSolve(s_per_table=AFTER_SOLVE_S_PER_TABLE, s_per_rank=AFTER_SOLVE_S_PER_RANK),
    )
    outcome = solve(request, on_progress=on_progress, deadline=deadline)
    if outcome.plan is not None:
        plan = outcome.plan
        return SolveResult(
            plan.plan_id, plan_bytes(plan), None, outcome.wall_time_s, PlanSummary.of(plan)
        )
    assert outcome.infeasibility is not None
    infeasibility = outcome.infeasibility.model_dump_json().encode()
    return SolveResult(None, None, infeasibility, outcome.wall_time_s)


# --------------------------------------------------------------------------- the pool


@dataclass(eq=False)
class _Job:
    key: str
    document: bytes
    time_limit_s: float
    spent_s: float  # of the time limit, before the pool had it (see ``SolvePool.solve``)
    done: asyncio.Future[SolveResult]
    queued: float  # event-loop time when it began to wait for a solver process
    wait_counts: bool  # whether that wait counts against its time limit
    started: float = 0.0  # event-loop time when a solver process took it
    waited_out: asyncio.TimerHandle | None = None  # answers it once its limit is spent
    deadline: float = math.inf  # started + time limit + grace: killed past this
    progress: SolveProgress | None = None  # the last its solver process reported


@dataclass(eq=False)
class _Solver:
    """One solver process, the service's end of its pipe, and the job it is on."""

    process: BaseProcess
    connection: Connection
    started: float
    ready: bool = False
    job: _Job | None = None
    watchdog: asyncio.TimerHandle | None = None
    retired: bool = False  # killed by the pool (overrun, shutdown): its exit is expected


def exit_description(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"


def _seconds(value: float) -> str:
    return f"{value:g}"


class SolvePool:
    """``workers`` solver processes and room for ``queue`` waiting solves; a solve is
    killed ``grace_s`` past its time limit. ``on_depth`` hears the number of solves
    admitted, ``on_failure`` each solve that overran or whose process died (with its
    seconds), ``on_progress`` the key of each solve that started or reported progress.
    Call ``start`` and everything else on the event loop's thread."""

    def __init__(
        self,
        workers: int,
        queue: int,
        *,
        grace_s: float,
        on_depth: Callable[[int], None] | None = None,
        on_failure: Callable[[SolveOutcome, float], None] | None = None,
        on_progress: Callable[[str], None] | None = None,
    ) -> None:
        self.workers = workers
        self.queue = queue
        self.grace_s = grace_s
        self._on_depth = on_depth or (lambda depth: None)
        self._on_failure = on_failure or (lambda outcome, elapsed_s: None)
        self._on_progress = on_progress or (lambda key: None)
        self._jobs: dict[str, _Job] = {}  # by key, while in flight
        self._solvers: list[_Solver] = []
        self._waiting: deque[_Job] = deque()
        self._in_flight: dict[str, asyncio.Task[Any]] = {}
        self._reserved: set[str] = set()  # keys whose solve is to be asked for (``reserve``)
        # How far recent solves that ran to their time limits went past them (Retry-After
        # errs by this much); solves that stopped early (gap reached) say nothing about it.
        self._overshoot_s: deque[float] = deque(maxlen=RECENT_SOLVES)
        self._warm_up_s = 2.0  # how long the last solver process took to get ready
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def capacity(self) -> int:
        return self.workers + self.queue

    @property
    def depth(self) -> int:
        """Solves admitted and not finished (running + queued), and places reserved."""
        return len(self._in_flight) + len(self._reserved)

    def start(self) -> None:
        """Start the solver processes, from the event loop's thread (the app's lifespan):
        PR_SET_PDEATHSIG ties each process to the thread that started it."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._thread = threading.current_thread()
            for _ in range(self.workers):
                self._spawn()

    def shutdown(self) -> None:
        """Kill every solver process now (a solve holds nothing worth saving) and answer
        every solve still running or waiting."""
        self._closed = True
        jobs = [solver.job for solver in self._solvers if solver.job] + list(self._waiting)
        for solver in self._solvers:
            self._kill(solver)
        self._solvers.clear()
        self._waiting.clear()
        for job in jobs:
            if not job.done.done():
                job.done.set_exception(ShuttingDownError())

    async def solve(
        self,
        key: str,
        request_document: bytes,
        time_limit_s: float,
        finish: Callable[[SolveResult], T],
        *,
        spent_s: float = 0.0,
        wait_counts: bool = True,
    ) -> tuple[T, bool]:
        """Solve ``request_document`` (whose ``options.time_limit_s`` is ``time_limit_s``)
        in a solver process, then run ``finish`` (blocking, e.g. storing the plan) in a
        thread. Identical keys in flight share one solve. Returns ``finish``'s result and
        whether this call joined another caller's solve. ``spent_s``: how much of the time
        limit the caller has used already (decoding the request); the solver gets what is
        left. Waiting here for a solver process counts too (``wait_counts``; not for an
        async job, whose clock starts when it starts solving): a solve that waits its
        whole limit raises ``WaitedOutError`` then, without taking a process.

        The solve runs as its own task: a caller that goes away (client disconnect) does
        not cancel it, so its plan is still stored for the retry."""
        task = self._in_flight.get(key)
        if task is not None:
            self.release(key)
            return await asyncio.shield(task), True
        if key in self._reserved:
            self._reserved.discard(key)  # the place held for it, counted in depth until now
        else:
            self.admit(key)
        self.start()
        job = self._job(key, request_document, time_limit_s, spent_s, wait_counts)
        task = asyncio.create_task(self._run(job, finish))
        self._in_flight[key] = task
        self._on_depth(self.depth)
        task.add_done_callback(lambda done: self._finished(key, done))
        return await asyncio.shield(task), False

    def admit(self, key: str) -> None:
        """Raise ``PoolFullError`` unless a solve of ``key`` would be admitted now (or
        joins the one in flight)."""
        if key not in self._in_flight and self.depth >= self.capacity:
            raise PoolFullError(
                f"all {self.workers} solver process(es) are busy and the queue of "
                f"{self.queue} is full",
                self.retry_after_s(),
            )

    def reserve(self, key: str) -> bool:
        """Hold a place for a solve of ``key`` that its caller asks for after some awaits
        (a job: claimed in the store first), so that the place ``admit`` saw free is not
        given to another meanwhile; False when the pool is full. ``solve`` of ``key`` takes
        the place; ``release`` gives it back when no solve is asked for."""
        if key in self._in_flight or key in self._reserved:
            return True
        if self.depth >= self.capacity:
            return False
        self._reserved.add(key)
        self._on_depth(self.depth)
        return True

    def release(self, key: str) -> None:
        """Give back the place ``reserve`` held for ``key``, if it still holds it."""
        if key in self._reserved:
            self._reserved.discard(key)
            self._on_depth(self.depth)

    def progress(self, key: str) -> SolveState | None:
        """Where the solve of ``key`` is, while it is in flight."""
        job = self._jobs.get(key)
        if job is None or self._loop is None:
            return None
        running = job.started > 0
        elapsed_s = self._loop.time() - job.started if running else 0.0
        return SolveState(running, elapsed_s, job.progress)

    def _finished(self, key: str, task: asyncio.Task[Any]) -> None:
        self._in_flight.pop(key, None)
        self._jobs.pop(key, None)
        self._on_depth(self.depth)
        if not task.cancelled():
            task.exception()  # retrieved, even when every caller has gone away

    def _job(
        self, key: str, document: bytes, time_limit_s: float, spent_s: float, wait_counts: bool
    ) -> _Job:
        assert self._loop is not None
        now = self._loop.time()
        return _Job(
            key, document, time_limit_s, spent_s, self._loop.create_future(), now, wait_counts
        )

    async def _run(self, job: _Job, finish: Callable[[SolveResult], T]) -> T:
        if self._closed:
            raise ShuttingDownError()
        assert self._loop is not None
        self._jobs[job.key] = job
        self._waiting.append(job)
        if job.wait_counts:
            left_s = max(0.0, job.time_limit_s - job.spent_s)
            job.waited_out = self._loop.call_later(left_s, self._wait_over, job)
        self._dispatch()
        result = await job.done
        return await asyncio.to_thread(finish, result)

    def _wait_over(self, job: _Job) -> None:
        """A waiting solve has spent its whole time limit: answer it, without a process;
        unless a solver process is still starting (a fresh service, a replacement), which
        is the service's wait, not the request's: then it gets that process when ready."""
        assert self._loop is not None
        if job not in self._waiting or job.done.done():
            return
        starting = [s for s in self._solvers if not s.ready]
        if starting or len(self._solvers) < self.workers:
            return
        self._waiting.remove(job)
        waited_s = self._loop.time() - job.queued
        job.done.set_exception(WaitedOutError(waited_s, job.time_limit_s, self.workers))

    def retry_after_s(self) -> int:
        """Seconds until a solve asked for now would start, erring long. A running solve
        is taken to end at its time limit plus the most that recent solves which ran to
        their time limits went past them (the grace until there is one, and never more),
        or at its hard deadline once past that; each waiting solve then takes its time
        limit plus that overshoot on the first process free. Solves that end early (gap
        reached) only make the estimate long."""
        if self._loop is None:
            return max(1, math.ceil(self._warm_up_s))
        now = self._loop.time()
        overshoot_s = min(self.grace_s, max(self._overshoot_s, default=self.grace_s))
        free_in = [self._free_in(solver, now, overshoot_s) for solver in self._solvers]
        free_in += [self._warm_up_s] * (self.workers - len(free_in))  # being replaced
        heapq.heapify(free_in)
        for job in self._waiting:
            heapq.heapreplace(free_in, free_in[0] + job.time_limit_s + overshoot_s)
        return max(1, math.ceil(free_in[0]))

    def _free_in(self, solver: _Solver, now: float, overshoot_s: float) -> float:
        if solver.job is not None:
            expected_end = solver.job.started + solver.job.time_limit_s + overshoot_s
            return (expected_end if expected_end > now else solver.job.deadline) - now
        if not solver.ready:
            return max(0.0, solver.started + self._warm_up_s - now)
        return 0.0

    # ----------------------------------------------------------------------- processes

    def _spawn(self) -> None:
        assert self._loop is not None
        assert threading.current_thread() is self._thread, "spawn on the event loop's thread"
        context = multiprocessing.get_context("spawn")
        service_end, solver_end = context.Pipe()
        process = context.Process(
            target=run_solver_process,
            args=(solver_end, os.getpid()),
            name="shardplan-solver",
            daemon=True,
        )
        process.start()
        solver_end.close()  # so the pipe reads end-of-file once the process is gone
        solver = _Solver(process, service_end, started=self._loop.time())
        self._solvers.append(solver)
        threading.Thread(
            target=self._listen, args=(solver,), name=f"solver-{process.pid}", daemon=True
        ).start()

    def _listen(self, solver: _Solver) -> None:
        """On a thread per solver process: hands each message to the event loop, then the
        process's exit once the pipe closes, so the loop never blocks on a pipe or a join."""
        while True:
            try:
                message = solver.connection.recv()
            except (EOFError, OSError):
                break
            if not self._call_soon(self._received, solver, message):
                return
        solver.process.join()
        self._call_soon(self._exited, solver)

    def _call_soon(self, callback: Callable[..., None], *args: Any) -> bool:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the event loop is closed: the service has ended
            return False
        return True

    def _kill(self, solver: _Solver) -> None:
        solver.retired = True
        self._unassign(solver)
        with contextlib.suppress(ProcessLookupError):
            solver.process.kill()

    # ----------------------------------------------------------------------- events

    def _received(self, solver: _Solver, message: Any) -> None:
        assert self._loop is not None
        if solver.retired:
            return
        if isinstance(message, SolveProgress):
            if solver.job is not None:
                solver.job.progress = message
                self._on_progress(solver.job.key)
            return
        if message == READY:
            solver.ready = True
            self._warm_up_s = self._loop.time() - solver.started
        else:
            job = self._unassign(solver)
            if job is not None and not job.done.done():
                self._answer(job, message)
        self._dispatch()

    def _answer(self, job: _Job, message: SolveResult | _SolverCrash) -> None:
        assert self._loop is not None
        if isinstance(message, _SolverCrash):
            job.done.set_exception(SolverError(f"the solver raised:\n{message.traceback}"))
            return
        overshoot_s = self._loop.time() - job.started - job.time_limit_s
        if overshoot_s >= 0:
            self._overshoot_s.append(overshoot_s)
        job.done.set_result(message)

    def _exited(self, solver: _Solver) -> None:
        """A solver process ended: replace it, unless the pool killed it (and so has
        already replaced it) or is shutting down."""
        assert self._loop is not None
        solver.connection.close()
        if solver in self._solvers:
            self._solvers.remove(solver)
        if solver.retired:
            return
        job = self._unassign(solver)
        how = exit_description(solver.process.exitcode)
        when = "mid-solve" if job else "idle" if solver.ready else "before it was ready"
        log.error("solver process %s %s, %s; replacing it", solver.process.pid, how, when)
        if self._closed:
            return
        if solver.ready:
            self._spawn()
        else:  # it never got ready: do not spin on a process that cannot start
            self._loop.call_later(RESPAWN_DELAY_S, self._respawn)
        if job is not None and not job.done.done():
            self._on_failure(SolveOutcome.DIED, self._loop.time() - job.started)
            job.done.set_exception(self._died(solver, how))
        self._dispatch()

    def _died(self, solver: _Solver, how: str) -> SolverDiedError:
        detail = (
            f"the solver process (pid {solver.process.pid}) working on this request ended "
            f"mid-solve ({how}); it was replaced and nothing was stored"
        )
        if solver.process.exitcode == -signal.SIGKILL:
            detail += (
                ". A SIGKILL nobody sent is usually the kernel's OOM killer: give the "
                "service more memory or fewer solver processes (SHARDPLAN_SOLVE_WORKERS)"
            )
        return SolverDiedError(detail, self.retry_after_s())

    def _respawn(self) -> None:
        if not self._closed:
            self._spawn()

    def _overran(self, solver: _Solver) -> None:
        """The watchdog: the solve is past its time limit and grace. Kill the process,
        start another, and tell the callers."""
        assert self._loop is not None
        job = solver.job
        self._kill(solver)
        self._solvers.remove(solver)
        self._spawn()
        self._dispatch()
        if job is None or job.done.done():
            return
        elapsed_s = self._loop.time() - job.started
        self._on_failure(SolveOutcome.OVERRAN, elapsed_s)
        log.error(
            "solve killed %.2f s after it started: time limit %s s + grace %s s",
            elapsed_s,
            _seconds(job.time_limit_s),
            _seconds(self.grace_s),
        )
        job.done.set_exception(self._overrun(job, elapsed_s))

    def _overrun(self, job: _Job, elapsed_s: float) -> SolveOverranError:
        return SolveOverranError(
            f"this solve ran {elapsed_s:.2f} s, past its options.time_limit_s = "
            f"{_seconds(job.time_limit_s)} s plus this service's grace of "
            f"{_seconds(self.grace_s)} s (SHARDPLAN_SOLVE_GRACE_S), so its solver process "
            "was killed and replaced and nothing was stored. The solver is meant to stop "
            "at its time limit: please report this with the request. To get a plan now, "
            "ask again with a smaller options.time_limit_s, or plan it with `shardplan "
            "plan`, which has no such limit",
            self.retry_after_s(),
            time_limit_s=job.time_limit_s,
            grace_s=self.grace_s,
        )

    # ----------------------------------------------------------------------- dispatch

    def _dispatch(self) -> None:
        """Give waiting solves to idle, ready solver processes, oldest first."""
        while self._waiting and not self._closed:
            solver = next((s for s in self._solvers if s.ready and s.job is None), None)
            if solver is None:
                return
            job = self._waiting.popleft()
            if not job.done.done():
                self._assign(solver, job)

    def _assign(self, solver: _Solver, job: _Job) -> None:
        assert self._loop is not None
        job.started = self._loop.time()
        job.deadline = job.started + job.time_limit_s + self.grace_s
        if job.waited_out is not None:
            job.waited_out.cancel()
        spent_s = job.spent_s + (job.started - job.queued if job.wait_counts else 0.0)
        solver.job = job
        solver.watchdog = self._loop.call_at(job.deadline, self._overran, solver)
        with contextlib.suppress(OSError):  # the process is gone: its exit answers the job
            solver.connection.send((job.document, spent_s))
        self._on_progress(job.key)

    def _unassign(self, solver: _Solver) -> _Job | None:
        if solver.watchdog is not None:
            solver.watchdog.cancel()
            solver.watchdog = None
        job, solver.job = solver.job, None
        return job
