"""``PlannerClient`` (blocking) and ``AsyncPlannerClient`` (asyncio): the same operations,
retries, checks and cache (``core.py``), each run by a thin driver over httpx."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import httpx

from clients.http.core import Call, Core, Imported, Operation, Outcome, Resolved, Step, cache_for
from clients.http.retry import RetryPolicy
from planner_service import __version__
from planner_service.plan.api import AliasPage, AliasRecord, CheckResult, PlanPage, ValidateResult
from planner_service.plan.types import PlanRequest, ShardingPlan

T = TypeVar("T")
TransportT = TypeVar("TransportT", httpx.BaseTransport, httpx.AsyncBaseTransport)
HttpT = TypeVar("HttpT", httpx.Client, httpx.AsyncClient)

DEFAULT_TIMEOUT_S = 90.0  # a POST /v1/plans waits for its solve: up to 60 s + 10 s grace
CONNECT_TIMEOUT_S = 10.0
DEFAULT_RETRIES = 4

Request = PlanRequest | Mapping[str, Any]
Plan = ShardingPlan | Mapping[str, Any]
PathLike = str | os.PathLike[str]


class _Client(Generic[TransportT, HttpT]):
    """What both clients are made of: the core, and an httpx client to run it with.

    ``base_url``: the service, e.g. ``http://planner:8000``. ``token``: a bearer token
    (one of the service's SHARDPLAN_API_TOKENS), needed for writes, and for reads where
    the service protects them. ``timeout_s``: the longest wait for any one network step
    (connect, each read, each write); a POST /v1/plans waits for its solve, so keep it
    above the request's ``options.time_limit_s`` plus the service's grace. ``retries``:
    further attempts after the first; ``backoff_s``, ``max_backoff_s`` and
    ``max_retry_after_s`` shape the waits between them (``retry.py``). ``cache_dir``: a
    folder to keep verified plans in (``cache.py``). ``transport``: an httpx transport
    to send through (a proxy, an app in process)."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        cache_dir: PathLike | None = None,
        transport: TransportT | None = None,
        backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        max_retry_after_s: float = 60.0,
    ) -> None:
        policy = RetryPolicy(retries, backoff_s, max_backoff_s, max_retry_after_s)
        self._core = Core(base_url, policy, cache_for(cache_dir))
        headers = {"user-agent": f"shardplan-client/{__version__}", "accept": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self._http: HttpT = self._open(
            transport,
            base_url=self._core.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_S)),
        )

    @property
    def base_url(self) -> str:
        return self._core.base_url

    def _open(self, transport: TransportT | None, **options: Any) -> HttpT:
        raise NotImplementedError


class PlannerClient(_Client[httpx.BaseTransport, httpx.Client]):
    """The planner service, from blocking code (a training job's start, a CI step).

    Every call retries what can be retried and raises a ``PlannerError`` for the rest
    (``errors.py``); every plan it returns has been hashed again and is the one asked
    for. Use it as a context manager, or call ``close``."""

    def _open(self, transport: httpx.BaseTransport | None, **options: Any) -> httpx.Client:
        return httpx.Client(transport=transport, **options)

    def create_plan(self, request: Request) -> ShardingPlan:
        """POST /v1/plans: the plan for ``request``, solved now or already stored. The
        plan must answer this request (its ``request_hash``)."""
        return self._run(self._core.create_plan(request))

    def get_plan(self, plan_id: str) -> ShardingPlan:
        """GET /v1/plans/{plan_id}, or the cache when it holds the plan (plans never
        change); fetched plans are kept there."""
        return self._run(self._core.get_plan(plan_id))

    def get_request(self, plan_id: str) -> PlanRequest:
        """The request the plan was made for (checked against the plan's request_hash),
        from the cache when it holds it."""
        return self._run(self._core.get_request(plan_id))

    def resolve(self, alias: str, *, allow_stale_alias: bool = False) -> Resolved:
        """The plan ``alias`` points at now. Never from the cache alone, unless
        ``allow_stale_alias=True`` and the service cannot be reached: then the plan it
        pointed at when last resolved, with ``stale=True``."""
        return self._run(self._core.resolve(alias, allow_stale_alias))

    def check(self, request: Request) -> CheckResult:
        """POST /v1/check: does it fit, each rank's headroom; stores nothing."""
        return self._run(self._core.check(request))

    def validate(self, request: Request, plan: Plan) -> ValidateResult:
        """POST /v1/validate: every way ``plan`` breaks ``request``."""
        return self._run(self._core.validate(request, plan))

    def set_alias(self, name: str, plan_id: str, *, comment: str | None = None) -> AliasRecord:
        """PUT /v1/aliases/{name}: point ``name`` at a stored plan (needs a token)."""
        return self._run(self._core.set_alias(name, plan_id, comment))

    def import_plan(self, request: Request, plan: Plan) -> Imported:
        """PUT /v1/plans/{plan_id}: store a plan solved elsewhere (needs a token). Raises
        ``Conflict`` when it is not what its id addresses, ``InvalidPlan`` when it breaks
        its request."""
        return self._run(self._core.import_plan(request, plan))

    def list_plans(self, *, limit: int | None = None, after: str | None = None) -> PlanPage:
        """GET /v1/plans: stored plans, newest first; pass ``page.next`` as ``after``."""
        return self._run(self._core.list_plans(limit, after))

    def list_aliases(self, *, limit: int | None = None, after: str | None = None) -> AliasPage:
        """GET /v1/aliases: aliases by name; pass ``page.next`` as ``after``."""
        return self._run(self._core.list_aliases(limit, after))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self, operation: Operation[T]) -> T:
        outcome: Outcome = None
        while True:
            try:
                step = operation.send(outcome)
            except StopIteration as done:
                result: T = done.value
                return result
            outcome = self._perform(step)

    def _perform(self, step: Step) -> Outcome:
        if not isinstance(step, Call):
            time.sleep(step.seconds)
            return None
        try:
            return self._http.request(step.method, step.path, **step.options)
        except httpx.RequestError as error:
            return error


class AsyncPlannerClient(_Client[httpx.AsyncBaseTransport, httpx.AsyncClient]):
    """``PlannerClient`` for asyncio code: the same methods, awaited. Plans are parsed,
    hashed and cached on the event loop, as the answers arrive."""

    def _open(
        self, transport: httpx.AsyncBaseTransport | None, **options: Any
    ) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=transport, **options)

    async def create_plan(self, request: Request) -> ShardingPlan:
        """See ``PlannerClient.create_plan``."""
        return await self._run(self._core.create_plan(request))

    async def get_plan(self, plan_id: str) -> ShardingPlan:
        """See ``PlannerClient.get_plan``."""
        return await self._run(self._core.get_plan(plan_id))

    async def get_request(self, plan_id: str) -> PlanRequest:
        """See ``PlannerClient.get_request``."""
        return await self._run(self._core.get_request(plan_id))

    async def resolve(self, alias: str, *, allow_stale_alias: bool = False) -> Resolved:
        """See ``PlannerClient.resolve``."""
        return await self._run(self._core.resolve(alias, allow_stale_alias))

    async def check(self, request: Request) -> CheckResult:
        """See ``PlannerClient.check``."""
        return await self._run(self._core.check(request))

    async def validate(self, request: Request, plan: Plan) -> ValidateResult:
        """See ``PlannerClient.validate``."""
        return await self._run(self._core.validate(request, plan))

    async def set_alias(
        self, name: str, plan_id: str, *, comment: str | None = None
    ) -> AliasRecord:
        """See ``PlannerClient.set_alias``."""
        return await self._run(self._core.set_alias(name, plan_id, comment))

    async def import_plan(self, request: Request, plan: Plan) -> Imported:
        """See ``PlannerClient.import_plan``."""
        return await self._run(self._core.import_plan(request, plan))

    async def list_plans(self, *, limit: int | None = None, after: str | None = None) -> PlanPage:
        """See ``PlannerClient.list_plans``."""
        return await self._run(self._core.list_plans(limit, after))

    async def list_aliases(
        self, *, limit: int | None = None, after: str | None = None
    ) -> AliasPage:
        """See ``PlannerClient.list_aliases``."""
        return await self._run(self._core.list_aliases(limit, after))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _run(self, operation: Operation[T]) -> T:
        outcome: Outcome = None
        while True:
            try:
                step = operation.send(outcome)
            except StopIteration as done:
                result: T = done.value
                return result
            outcome = await self._perform(step)

    async def _perform(self, step: Step) -> Outcome:
        if not isinstance(step, Call):
            await asyncio.sleep(step.seconds)
            return None
        try:
            return await self._http.request(step.method, step.path, **step.options)
        except httpx.RequestError as error:
            return error
