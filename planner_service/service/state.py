"""Per-process service state: settings, store, solve pool, plan cache and CPU lane, and
their life in a worker process (``ServiceState.running``, the app's lifespan)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool

from planner_service import PLANNER_VERSION
from planner_service.service.cpu import CpuLane
from planner_service.service.http import metrics
from planner_service.service.http.fetch import PlanResponses
from planner_service.service.http.metrics import CacheLookup
from planner_service.service.processes import die_with_parent
from planner_service.service.settings import SUPERVISOR_PID_VARIABLE, Settings
from planner_service.service.solver.pool import SolvePool
from planner_service.service.store import (
    PlanBodies,
    PlanStore,
    StoredPlan,
    StoreUnavailableError,
    open_store,
)

log = logging.getLogger("shardplan.api")


class PlanCache:
    """Plans' prepared responses (identity and gzip bytes, their headers) by plan_id, least
    recently used out first, bounded in bytes. Plans are immutable and content-addressed,
    so a cached copy is never stale, but for an imported plan's mark, which goes when the
    planner makes the same plan (a replica that did not make it says "unverified" until
    its copy is evicted: the cautious side)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, PlanResponses] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, plan_id: str) -> PlanResponses | None:
        with self._lock:
            data = self._entries.get(plan_id)
            if data is not None:
                self._entries.move_to_end(plan_id)
            return data

    def put(self, plan_id: str, bodies: PlanBodies) -> PlanResponses:
        """Cache a plan's responses; a plan cached already keeps its entry, unless it was
        marked imported and the planner has since made it (``Plans.put_planned``)."""
        data = PlanResponses.of(plan_id, bodies)
        with self._lock:
            held = self._entries.get(plan_id)
            if held is not None and (data.imported or not held.imported):
                return held
            if held is not None:
                del self._entries[plan_id]
                self._bytes -= held.size
            if data.size > self.max_bytes:
                return data
            self._entries[plan_id] = data
            self._bytes += data.size
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.size
        return data


@dataclass
class ServiceState:
    settings: Settings
    pool: SolvePool
    cache: PlanCache
    cpu: CpuLane = field(default_factory=CpuLane)
    # Set once SIGTERM or SIGINT asks this process to stop: what never ends by itself (an
    # event stream) ends then, within the graceful shutdown.
    stopping: threading.Event = field(default_factory=threading.Event)
    _store: PlanStore | None = None
    _store_lock: threading.Lock = field(default_factory=threading.Lock)

    def store(self) -> PlanStore:
        """The store, opened on first use (and re-tried after a failure), so the service
        starts and answers /healthz while its database is still coming up."""
        with self._store_lock:
            if self._store is None:
                self._store = open_store(self.settings.database_url)
            return self._store

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """A worker process's life: the app's lifespan."""
        _die_with_supervisor()
        _notice_stop_signals(self.stopping)
        try:
            self.store()
        except StoreUnavailableError as error:  # serve anyway; /readyz says why
            log.warning("plan store not reachable at start: %s", error)
        self.pool.start()
        self.cpu.start()
        yield
        self.close()

    def close(self) -> None:
        self.pool.shutdown()
        self.cpu.shutdown()
        if self._store is not None:
            self._store.close()
            self._store = None

    async def plan_bytes(self, plan_id: str) -> bytes | None:
        """A stored plan's bytes, from memory when possible."""
        responses = await self.plan_responses(plan_id)
        return None if responses is None else responses.bodies.identity

    async def plan_responses(self, plan_id: str) -> PlanResponses | None:
        """A stored plan's prepared responses, from memory when possible."""
        responses = self.cache.get(plan_id)
        if responses is not None:
            metrics.cache_counter(CacheLookup.MEMORY).inc()
            return responses
        bodies = await run_in_threadpool(lambda: self.store().plans.bodies(plan_id))
        if bodies is None:
            return None
        metrics.cache_counter(CacheLookup.STORE).inc()
        return self.cache.put(plan_id, bodies)

    async def plan_for_request(self, request_hash: str) -> tuple[str, bytes] | None:
        """(plan_id, bytes) of the plan this planner version already stored for a request."""
        plan_id = await run_in_threadpool(
            self.store().plans.for_request, request_hash, PLANNER_VERSION
        )
        data = None if plan_id is None else await self.plan_bytes(plan_id)
        if plan_id is None or data is None:
            return None
        metrics.cache_counter(CacheLookup.REQUEST).inc()
        return plan_id, data

    async def stored(self, plan_id: str) -> StoredPlan | None:
        return await run_in_threadpool(lambda: self.store().plans.get(plan_id))


def _notice_stop_signals(stopping: threading.Event) -> None:
    """Sets ``stopping`` on SIGTERM and SIGINT, then hands the signal on to the handler in
    place (uvicorn's). uvicorn's handler starts a graceful shutdown that tells the app
    nothing and waits for every response to end, so an event stream ran to the end of the
    grace and was cancelled: a ``CancelledError`` traceback each and no chunked terminator
    (issue 36). Signals are the main thread's; elsewhere (an app in a test) nothing is done."""
    if threading.current_thread() is not threading.main_thread():
        return
    for number in (signal.SIGTERM, signal.SIGINT):
        handler = signal.getsignal(number)
        if callable(handler):
            signal.signal(number, _chained(stopping, handler))


def _chained(stopping: threading.Event, handler: Callable[[int, Any], Any]) -> Callable[..., None]:
    def chained(number: int, frame: Any) -> None:
        stopping.set()
        handler(number, frame)

    return chained


def _die_with_supervisor() -> None:
    """Under ``shardplan serve --workers N`` this process is one of uvicorn's workers. If
    the supervisor is SIGKILLed (no cleanup runs), this worker must go too, and with it
    its solver processes (which die with it the same way)."""
    supervisor_pid = os.environ.get(SUPERVISOR_PID_VARIABLE)
    if supervisor_pid:
        die_with_parent(int(supervisor_pid))
