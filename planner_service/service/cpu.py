"""CPU-bound work a route does itself (validating a plan against a request, rendering a
plan page, per-rank headroom): in worker processes, a few at a time, never on the event
loop.

Processes, not threads: the work is pure Python and holds the GIL, and with two threads
busy, /healthz answered in 160 ms at the median and 316 ms at p99 on the 2-core machine
(benchmarks/hostile_bench.py, 4,096-rank plans) because the event loop waited for the GIL
at every step. A process leaves the loop to the OS scheduler, which wakes it at once.
Calls beyond ``workers + queue`` get 503 with ``Retry-After`` rather than piling up bodies
in memory. A call cannot be stopped once it runs, so its slot is freed when its work ends,
not when its client goes away. Functions and their arguments cross a pipe: module-level
functions, picklable arguments. No worker outlives the service (as solver processes do
not: ``processes.die_with_parent``).
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import ParamSpec, TypeVar

from planner_service.service.http.problems import ProblemError
from planner_service.service.processes import CPU_WORKER_NAME, die_with_parent, name_process

P = ParamSpec("P")
T = TypeVar("T")

CPU_WORKERS = 2
CPU_QUEUE = 32
BUSY_RETRY_S = 1


def _start_worker(service_pid: int) -> None:
    """As a solver process does: die with the service however it ends (PR_SET_PDEATHSIG,
    see solver/pool.py), leave Ctrl-C and SIGTERM to the service, and import what the work
    needs once, not on its first call."""
    die_with_parent(service_pid)
    name_process(CPU_WORKER_NAME)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import planner_service.service.pages.plan  # noqa: F401
    import planner_service.validate.validator  # noqa: F401


def _ready() -> None:
    """Nothing: a call that makes the pool start a worker."""


class CpuLane:
    """At most ``workers`` functions running in worker processes, ``queue`` more waiting."""

    def __init__(self, workers: int = CPU_WORKERS, queue: int = CPU_QUEUE) -> None:
        self.workers = workers
        self.capacity = workers + queue
        self._slots = asyncio.Semaphore(workers)
        self._admitted = 0
        self._executor: ProcessPoolExecutor | None = None

    @property
    def admitted(self) -> int:
        """Calls running or waiting for a worker."""
        return self._admitted

    def start(self) -> None:
        """Ready the pool and start its processes now, from the event loop's thread (the
        one their PR_SET_PDEATHSIG ties them to), which lives as long as the service: every
        plan request is decoded here, and a worker's start (a second or two of imports on a
        loaded machine) would otherwise count against the first requests' time limits."""
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(os.getpid(),),
            )
            for _ in range(self.workers):  # a spawn pool starts a process per waiting call
                self._executor.submit(_ready)

    def shutdown(self, *, wait: bool = True) -> None:
        """Stop the workers: calls not started are cancelled, running ones end first. With
        ``wait`` (the service's own shutdown) this returns once the pool is gone, its
        queues closed and their semaphores unlinked: uvicorn ends a SIGTERMed process by
        raising SIGTERM again, so nothing at exit would unlink them, and Python's
        resource tracker reported five leaked semaphores (a call queue's three, a result
        queue's two) whenever the lane had run anything."""
        if self._executor is not None:
            self._executor.shutdown(wait=wait, cancel_futures=True)
            self._executor = None

    async def run(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``function(*args, **kwargs)`` in a worker; its exceptions are raised here."""
        if self._admitted >= self.capacity:
            raise _busy(f"{self.capacity} CPU-bound requests (decoding, validations, plan "
                        "pages) are already running or queued here")  # fmt: skip
        self._admitted += 1
        try:
            await self._slots.acquire()
        except BaseException:  # cancelled while waiting for a worker
            self._admitted -= 1
            raise
        try:
            self.start()
            executor = self._executor
            assert executor is not None
            call = functools.partial(function, *args, **kwargs)
            future = asyncio.get_running_loop().run_in_executor(executor, call)
        except BaseException:
            self._release()
            raise
        future.add_done_callback(lambda _: self._release())
        try:
            return await asyncio.shield(future)
        except BrokenProcessPool:
            if self._executor is executor:  # not a new pool another caller started
                self.shutdown(wait=False)  # the next call starts a new pool
            raise _busy("a worker process died; the pool was restarted") from None

    def _release(self) -> None:
        self._admitted -= 1
        self._slots.release()


def _busy(reason: str) -> ProblemError:
    return ProblemError(
        503, f"{reason}; retry in {BUSY_RETRY_S} s", headers={"Retry-After": str(BUSY_RETRY_S)}
    )
