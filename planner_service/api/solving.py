"""Solving off the event loop: a pool of worker processes behind a bounded queue.

Solves are CPU-bound (enumeration in Python, CP-SAT in C++ threads), so they run in
``spawn``-started worker processes and the event loop only awaits them. At most
``workers + queue`` solves are admitted at once; beyond that ``PoolFullError`` (→ 503 with
``Retry-After``). Identical requests in flight share one solve. A crashed worker process
breaks the pool; the next call builds a new one and the affected callers get
``PoolFullError`` rather than an internal error.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class SolveResult:
    """What a worker sends back: the stored form of the plan or of its infeasibility."""

    plan_id: str | None
    plan: bytes | None
    infeasibility: bytes | None
    wall_time_s: float


class PoolFullError(RuntimeError):
    def __init__(self, retry_after_s: int, reason: str) -> None:
        super().__init__(reason)
        self.retry_after_s = retry_after_s


def solve_document(request_document: bytes) -> SolveResult:
    """Runs in a worker process: parse (already validated by the API) and solve."""
    from planner_service.codec import parse_request, plan_bytes
    from planner_service.solver import solve

    request = parse_request(request_document)
    outcome = solve(request)
    if outcome.plan is not None:
        return SolveResult(
            outcome.plan.plan_id, plan_bytes(outcome.plan), None, outcome.wall_time_s
        )
    assert outcome.infeasibility is not None
    infeasibility = outcome.infeasibility.model_dump_json().encode()
    return SolveResult(None, None, infeasibility, outcome.wall_time_s)


def _warm_up() -> None:
    """Import the solver stack once per worker so the first solve does not pay for it."""
    import planner_service.solver  # noqa: F401


class SolvePool:
    def __init__(
        self, workers: int, queue: int, on_depth: Callable[[int], None] | None = None
    ) -> None:
        self.workers = workers
        self._on_depth = on_depth or (lambda depth: None)
        self.capacity = workers + queue
        self._executor: ProcessPoolExecutor | None = None
        self._in_flight: dict[str, asyncio.Task[Any]] = {}
        self._recent_s: deque[float] = deque(maxlen=32)

    @property
    def depth(self) -> int:
        """Solves admitted and not finished (running + queued)."""
        return len(self._in_flight)

    def start(self) -> None:
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_warm_up,
            )

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def retry_after_s(self) -> int:
        """A hint for clients turned away: how long the queue takes to drain, roughly."""
        typical = sorted(self._recent_s)[len(self._recent_s) // 2] if self._recent_s else 1.0
        waves = max(1, math.ceil(self.depth / self.workers))
        return max(1, math.ceil(typical * waves))

    async def solve(
        self, key: str, request_document: bytes, finish: Callable[[SolveResult], T]
    ) -> tuple[T, bool]:
        """Solve ``request_document`` in a worker process, then run ``finish`` (blocking,
        e.g. storing the plan) in a thread. Identical keys in flight share one solve.
        Returns ``finish``'s result and whether this call joined another caller's solve.

        The solve runs as its own task: a caller that goes away (client disconnect) does
        not cancel it, so its plan is still stored for the retry."""
        task = self._in_flight.get(key)
        if task is not None:
            return await asyncio.shield(task), True
        if self.depth >= self.capacity:
            raise PoolFullError(
                self.retry_after_s(),
                f"all {self.workers} solver process(es) are busy and the queue of "
                f"{self.capacity - self.workers} is full",
            )
        self.start()
        task = asyncio.create_task(self._run(request_document, finish))
        self._in_flight[key] = task
        self._on_depth(self.depth)
        task.add_done_callback(lambda _: self._finished(key))
        return await asyncio.shield(task), False

    def _finished(self, key: str) -> None:
        self._in_flight.pop(key, None)
        self._on_depth(self.depth)

    async def _run(self, request_document: bytes, finish: Callable[[SolveResult], T]) -> T:
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            result = await loop.run_in_executor(self._executor, solve_document, request_document)
        except BrokenProcessPool:
            self.shutdown()
            raise PoolFullError(1, "a solver process died; the pool was restarted") from None
        self._recent_s.append(time.perf_counter() - started)
        return await asyncio.to_thread(finish, result)
