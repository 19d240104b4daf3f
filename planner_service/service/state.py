"""Per-process service state (settings, store, solve pool, plan cache) and the
dependencies routes use to reach it and to check credentials."""

from __future__ import annotations

import hmac
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from planner_service import PLANNER_VERSION
from planner_service.service import metrics
from planner_service.service.cpu import CpuLane
from planner_service.service.problems import ProblemError
from planner_service.service.settings import Settings
from planner_service.service.solving import SolvePool
from planner_service.service.store import PlanStore, StoredPlan, StoreUnavailableError, open_store


class PlanCache:
    """Plan bytes by plan_id, least recently used out first, bounded in bytes. Plans are
    immutable and content-addressed, so a cached copy is never stale."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, plan_id: str) -> bytes | None:
        with self._lock:
            data = self._entries.get(plan_id)
            if data is not None:
                self._entries.move_to_end(plan_id)
            return data

    def put(self, plan_id: str, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        with self._lock:
            if plan_id in self._entries:
                return
            self._entries[plan_id] = data
            self._bytes += len(data)
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= len(evicted)


@dataclass
class ServiceState:
    settings: Settings
    pool: SolvePool
    cache: PlanCache
    cpu: CpuLane = field(default_factory=CpuLane)
    _store: PlanStore | None = None
    _store_lock: threading.Lock = field(default_factory=threading.Lock)

    def store(self) -> PlanStore:
        """The store, opened on first use (and re-tried after a failure), so the service
        starts and answers /healthz while its database is still coming up."""
        with self._store_lock:
            if self._store is None:
                self._store = open_store(self.settings.database_url)
            return self._store

    def close(self) -> None:
        self.pool.shutdown()
        self.cpu.shutdown()
        if self._store is not None:
            self._store.close()
            self._store = None

    async def plan_bytes(self, plan_id: str) -> bytes | None:
        """A stored plan's bytes, from memory when possible."""
        data = self.cache.get(plan_id)
        if data is not None:
            metrics.CACHE.labels("memory").inc()
            return data
        stored = await self.stored(plan_id)
        if stored is None:
            return None
        metrics.CACHE.labels("store").inc()
        self.cache.put(plan_id, stored.plan)
        return stored.plan

    async def plan_for_request(self, request_hash: str) -> tuple[str, bytes] | None:
        """(plan_id, bytes) of the plan this planner version already stored for a request."""
        plan_id = await run_in_threadpool(
            self.store().plan_for_request, request_hash, PLANNER_VERSION
        )
        data = None if plan_id is None else await self.plan_bytes(plan_id)
        if plan_id is None or data is None:
            return None
        metrics.CACHE.labels("request").inc()
        return plan_id, data

    async def stored(self, plan_id: str) -> StoredPlan | None:
        return await run_in_threadpool(lambda: self.store().get_plan(plan_id))


def state_of(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state


UNAVAILABLE_RETRY_S = 5


def store_unavailable(error: StoreUnavailableError) -> ProblemError:
    return ProblemError(
        503,
        f"the plan store is unavailable: {error}",
        headers={"Retry-After": str(UNAVAILABLE_RETRY_S)},
    )


# --------------------------------------------------------------------------- credentials


def _bearer_identity(request: Request, settings: Settings) -> str:
    """The name of the token the request carries; 401 without one, 403 for a wrong one."""
    header = request.headers.get("authorization", "")
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        raise ProblemError(
            401,
            "this route needs `Authorization: Bearer <token>` (one of SHARDPLAN_API_TOKENS)",
            headers={"WWW-Authenticate": 'Bearer realm="shardplan"'},
        )
    presented = credentials.strip().encode()
    match = None
    for name, token in settings.api_tokens.items():
        # Compare against every token, in constant time each, so timing tells nothing.
        if hmac.compare_digest(presented, token.encode()) and match is None:
            match = name
    if match is None:
        raise ProblemError(403, "the bearer token is not one this service accepts")
    return match


def writer(request: Request) -> str:
    """Dependency for writes: the caller's identity (``anonymous`` when auth is off)."""
    settings = state_of(request).settings
    if not settings.auth_enabled:
        return "anonymous"
    return _bearer_identity(request, settings)


def reader(request: Request) -> None:
    """Dependency for reads: open unless SHARDPLAN_PROTECT_READS=1 (with tokens set)."""
    settings = state_of(request).settings
    if settings.auth_enabled and settings.protect_reads:
        _bearer_identity(request, settings)
