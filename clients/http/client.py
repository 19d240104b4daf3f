"""``PlannerClient`` (blocking) and ``AsyncPlannerClient`` (asyncio): the same operations,
retries, checks and cache (``core.py``), each run by a thin driver over httpx."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import httpx

from clients.http.core import (
    Call,
    Core,
    EventDecoder,
    Imported,
    Operation,
    Outcome,
    Resolved,
    Step,
    cache_for,
)
from clients.http.fetched import FetchedPlan
from clients.http.retry import RetryPolicy
from planner_service import __version__
from planner_service.plan.api import (
    AliasPage,
    AliasRecord,
    CheckGates,
    CheckResult,
    PlanPage,
    SolveJob,
    ValidateResult,
)
from planner_service.plan.types import DeviceProfile, PlanRequest, ShardingPlan

T = TypeVar("T")
TransportT = TypeVar("TransportT", httpx.BaseTransport, httpx.AsyncBaseTransport)
HttpT = TypeVar("HttpT", httpx.Client, httpx.AsyncClient)

DEFAULT_TIMEOUT_S = 90.0  # a POST /v1/plans waits for its solve: up to 60 s + 10 s grace
CONNECT_TIMEOUT_S = 10.0
DEFAULT_RETRIES = 4

Request = PlanRequest | Mapping[str, Any]
Plan = ShardingPlan | Mapping[str, Any]
Profile = DeviceProfile | Mapping[str, Any]
PathLike = str | os.PathLike[str]
OnProgress = Callable[[SolveJob], None]
EVENT_STREAM = "text/event-stream"


class _StreamEnded(httpx.RemoteProtocolError):
    """An event stream that closed before its job ended: reconnect, as after a reset."""


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
    to send through (a proxy, an app in process). ``compressed``: ask for plans
    zstd- or gzip-encoded (the default; plan JSON compresses 10 to 200 times); False asks
    for identity."""

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
        compressed: bool = True,
    ) -> None:
        policy = RetryPolicy(retries, backoff_s, max_backoff_s, max_retry_after_s)
        self._core = Core(base_url, policy, cache_for(cache_dir))
        # Plans are served zstd- or gzip-encoded when asked (a 1 MB plan: 1/200 or 1/50 of the
        # bytes); httpx decodes the body, and the plan id is verified on the decoded bytes.
        headers = {
            "user-agent": f"shardplan-client/{__version__}",
            "accept": "application/json",
            "accept-encoding": "zstd, gzip" if compressed else "identity",
        }
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

    def submit_plan(self, request: Request) -> SolveJob:
        """POST /v1/plans with ``Prefer: respond-async``: the solve's job at once (202),
        done already when the plan is stored. Follow it with ``get_solve``,
        ``watch_solve`` or ``wait_for_plan``."""
        return self._run(self._core.submit_plan(request))

    def get_solve(self, job_id: str) -> SolveJob:
        """GET /v1/solves/{job_id}: the job as it is now."""
        return self._run(self._core.get_solve(job_id))

    def watch_solve(self, job_id: str) -> Iterator[SolveJob]:
        """GET /v1/solves/{job_id}/events: the job on each change, the last one ended
        (done, no_plan, failed). A stream that breaks (a restarted service) is reopened
        with the retry policy's waits; the job goes on meanwhile."""
        call = Call("GET", self._core.solve_events_path(job_id))
        started, attempts = time.monotonic(), 0
        while True:
            attempts += 1
            try:
                with self._http.stream(
                    "GET", call.path, headers={"accept": EVENT_STREAM}
                ) as response:
                    if response.status_code != 200:
                        response.read()
                        outcome: httpx.Response | httpx.RequestError = response
                    else:
                        decoder = EventDecoder(f"GET {self.base_url}{call.path}")
                        for line in response.iter_lines():
                            job = decoder.line(line)
                            if job is not None:
                                attempts = 0  # an answer: the failures start over
                                yield job
                                if job.status.ended:
                                    return
                        outcome = _StreamEnded("the stream ended before the job did")
            except httpx.RequestError as error:
                outcome = error
            time.sleep(self._core.stream_failed(call, outcome, attempts, started))

    def wait_for_plan(
        self, request: Request, *, on_progress: OnProgress | None = None
    ) -> ShardingPlan:
        """``create_plan``'s plan by way of an async solve: submit it, follow its events
        (``on_progress`` hears each), then fetch the plan. No connection is held for the
        whole solve, and a service restarted meanwhile resumes the job. Raises what
        ``create_plan`` would (``NoPlanFound``, ``Overloaded``...)."""
        job = self.submit_plan(request)
        if not job.status.ended:
            for job in self.watch_solve(job.job_id):  # noqa: B020 (the last is the end)
                if on_progress is not None:
                    on_progress(job)
        elif on_progress is not None:
            on_progress(job)
        return self._run(self._core.solved_plan(job))

    def get_plan(self, plan_id: str) -> ShardingPlan:
        """GET /v1/plans/{plan_id}, or the cache when it holds the plan (plans never
        change); fetched plans are kept there. ``plan_id`` may be a unique prefix of the
        id (8 hex digits or more, as plans are printed short): then the service is always
        asked, the plan's id must start with it, and ``NotFound`` or ``Conflict`` (more
        than one plan starts with it: ``matching_plan_ids``) says when it names none or
        several. ``fetch_plan`` also says whether the service vouches for its solver
        report."""
        return self._run(self._core.get_plan(plan_id))

    def fetch_plan(self, plan_id: str) -> FetchedPlan:
        """As ``get_plan``, with what the service says of the plan's solver report
        (``solver_report_verified``: False for an imported plan, whose status, bound and
        gap are the importer's word), from the cache too."""
        return self._run(self._core.fetch_plan(plan_id))

    def get_request(self, plan_id: str) -> PlanRequest:
        """The request the plan was made for (checked against the plan's request_hash),
        from the cache when it holds it; ``plan_id`` as for ``get_plan``."""
        return self._run(self._core.get_request(plan_id))

    def resolve(self, alias: str, *, allow_stale_alias: bool = False) -> Resolved:
        """The plan ``alias`` points at now. Never from the cache alone, unless
        ``allow_stale_alias=True`` and the service cannot be reached: then the plan it
        pointed at when last resolved, with ``stale=True``."""
        return self._run(self._core.resolve(alias, allow_stale_alias))

    def check(
        self, request: Request, gates: CheckGates | None = None, baseline: str | None = None
    ) -> CheckResult:
        """POST /v1/check: does it fit and pass ``gates`` (compared with ``baseline``, a
        stored plan's id or alias:NAME), where the bytes live, each rank's headroom; stores
        nothing."""
        return self._run(self._core.check(request, gates, baseline))

    def validate(self, request: Request, plan: Plan) -> ValidateResult:
        """POST /v1/validate: every way ``plan`` breaks ``request``."""
        return self._run(self._core.validate(request, plan))

    def set_alias(self, name: str, plan_id: str, *, comment: str | None = None) -> AliasRecord:
        """PUT /v1/aliases/{name}: point ``name`` at a stored plan, by its id or a unique
        prefix of it (needs a token); the record names the whole id."""
        return self._run(self._core.set_alias(name, plan_id, comment))

    def import_plan(self, request: Request, plan: Plan) -> Imported:
        """PUT /v1/plans/{plan_id}: store a plan solved elsewhere (needs a token). Raises
        ``Conflict`` when it is not what its id addresses, ``InvalidPlan`` when it breaks
        its request."""
        return self._run(self._core.import_plan(request, plan))

    def put_profile(self, profile: Profile) -> str:
        """PUT /v1/profiles/{profile_id}: store a device profile (``shardplan calibrate``'s)
        at its content address (needs a token); its ``profile_id``, for a request's
        ``options.device_profile_id``. Storing it again is a no-op."""
        return self._run(self._core.put_profile(profile))

    def get_profile(self, profile_id: str) -> DeviceProfile:
        """GET /v1/profiles/{profile_id}: the stored profile, its content address computed
        again (``IntegrityError`` unless it is ``profile_id``)."""
        return self._run(self._core.get_profile(profile_id))

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

    async def submit_plan(self, request: Request) -> SolveJob:
        """See ``PlannerClient.submit_plan``."""
        return await self._run(self._core.submit_plan(request))

    async def get_solve(self, job_id: str) -> SolveJob:
        """See ``PlannerClient.get_solve``."""
        return await self._run(self._core.get_solve(job_id))

    async def watch_solve(self, job_id: str) -> AsyncIterator[SolveJob]:
        """See ``PlannerClient.watch_solve``."""
        call = Call("GET", self._core.solve_events_path(job_id))
        started, attempts = time.monotonic(), 0
        while True:
            attempts += 1
            try:
                async with self._http.stream(
                    "GET", call.path, headers={"accept": EVENT_STREAM}
                ) as response:
                    if response.status_code != 200:
                        await response.aread()
                        outcome: httpx.Response | httpx.RequestError = response
                    else:
                        decoder = EventDecoder(f"GET {self.base_url}{call.path}")
                        async for line in response.aiter_lines():
                            job = decoder.line(line)
                            if job is not None:
                                attempts = 0  # an answer: the failures start over
                                yield job
                                if job.status.ended:
                                    return
                        outcome = _StreamEnded("the stream ended before the job did")
            except httpx.RequestError as error:
                outcome = error
            await asyncio.sleep(self._core.stream_failed(call, outcome, attempts, started))

    async def wait_for_plan(
        self, request: Request, *, on_progress: OnProgress | None = None
    ) -> ShardingPlan:
        """See ``PlannerClient.wait_for_plan``."""
        job = await self.submit_plan(request)
        if not job.status.ended:
            async for job in self.watch_solve(job.job_id):  # noqa: B020 (the last is the end)
                if on_progress is not None:
                    on_progress(job)
        elif on_progress is not None:
            on_progress(job)
        return await self._run(self._core.solved_plan(job))

    async def get_plan(self, plan_id: str) -> ShardingPlan:
        """See ``PlannerClient.get_plan``."""
        return await self._run(self._core.get_plan(plan_id))

    async def fetch_plan(self, plan_id: str) -> FetchedPlan:
        """See ``PlannerClient.fetch_plan``."""
        return await self._run(self._core.fetch_plan(plan_id))

    async def get_request(self, plan_id: str) -> PlanRequest:
        """See ``PlannerClient.get_request``."""
        return await self._run(self._core.get_request(plan_id))

    async def resolve(self, alias: str, *, allow_stale_alias: bool = False) -> Resolved:
        """See ``PlannerClient.resolve``."""
        return await self._run(self._core.resolve(alias, allow_stale_alias))

    async def check(
        self, request: Request, gates: CheckGates | None = None, baseline: str | None = None
    ) -> CheckResult:
        """See ``PlannerClient.check``."""
        return await self._run(self._core.check(request, gates, baseline))

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

    async def put_profile(self, profile: Profile) -> str:
        """See ``PlannerClient.put_profile``."""
        return await self._run(self._core.put_profile(profile))

    async def get_profile(self, profile_id: str) -> DeviceProfile:
        """See ``PlannerClient.get_profile``."""
        return await self._run(self._core.get_profile(profile_id))

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
