"""Everything the client does, once, without doing any I/O on the network: each operation
is a generator that yields the steps it needs (``Call``: send this HTTP request;
``Sleep``: wait this long before the next attempt) and gets back what each step gave (an
``httpx.Response``, or the ``httpx.RequestError`` it raised). ``PlannerClient`` runs the
steps with ``httpx.Client`` and ``time.sleep``, ``AsyncPlannerClient`` with
``httpx.AsyncClient`` and ``asyncio.sleep``: the retries, the checks, the cache and the
errors are the same code for both.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from clients.http.cache import DiskCache, utc_now
from clients.http.errors import (
    IntegrityError,
    PlannerError,
    PlannerHTTPError,
    PlannerUnavailable,
    UnexpectedResponse,
    validation_summary,
)
from clients.http.fetched import FetchedPlan, solver_report_verified
from clients.http.integrity import PLAN_ID, verified_plan, verified_profile
from clients.http.retry import RetryPolicy, is_retryable, retry_after_s
from planner_service.plan.api import (
    AliasPage,
    AliasRecord,
    CheckGates,
    CheckResult,
    PlanPage,
    SolveJob,
    SolveJobStatus,
    ValidateResult,
)
from planner_service.plan.canonical import canonical_bytes
from planner_service.plan.codec import parse_plan, parse_profile, parse_request, request_hash
from planner_service.plan.encodings import ENCODINGS, plan_etag
from planner_service.plan.errors import FieldProblem, InputError
from planner_service.plan.plan_ids import is_full_plan_id, plan_id_problem
from planner_service.plan.types import DeviceProfile, PlanRequest, ShardingPlan, profile_id_of

log = logging.getLogger("shardplan.client")

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

ALIAS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
JOB_ID = re.compile(r"[0-9a-f]{64}")
MAX_EVENT_CHARS = 1 << 20  # one server-sent event's data; more is not a job
JSON = "application/json"


@dataclass(frozen=True)
class Call:
    """Send this request (relative to the client's base URL)."""

    method: str
    path: str
    content: bytes | None = None
    params: Mapping[str, str | int] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def options(self) -> dict[str, Any]:
        """The rest, as ``httpx.Client.request`` takes them."""
        return {"content": self.content, "params": self.params, "headers": self.headers}


@dataclass(frozen=True)
class Sleep:
    """Wait this long, then carry on."""

    seconds: float


Step = Call | Sleep
Outcome = httpx.Response | httpx.RequestError | None  # None answers a Sleep
Operation = Generator[Step, Outcome, T]


@dataclass(frozen=True)
class Resolved:
    """What an alias resolved to. ``stale`` is True only when the service could not be
    reached and ``allow_stale_alias=True`` let the cache answer: then ``plan`` is the plan
    the alias pointed at when it was last resolved, at ``resolved_at``, and it may have
    moved since."""

    alias: str
    plan: ShardingPlan
    stale: bool
    version: int | None  # the alias's version (1 when first set, +1 per move)
    resolved_at: str  # ISO 8601, UTC
    # False for an imported plan: its solver report is the importer's word (fetched.py).
    solver_report_verified: bool = True

    @property
    def plan_id(self) -> str:
        return self.plan.plan_id


@dataclass(frozen=True)
class Imported:
    """A plan put to the service: ``created`` is False when it was stored already;
    ``solver_report_verified`` is what the service says of its solver report (False: the
    importer's word, as for every plan put)."""

    plan: ShardingPlan
    created: bool
    solver_report_verified: bool = False


class Core:
    """The operations, for a service at ``base_url``; see the module docstring."""

    def __init__(self, base_url: str, policy: RetryPolicy, cache: DiskCache | None) -> None:
        self.base_url = base_url.rstrip("/")
        self.policy = policy
        self.cache = cache

    # ------------------------------------------------------------------------ plans

    def create_plan(self, request: PlanRequest | Mapping[str, Any]) -> Operation[ShardingPlan]:
        model = as_request(request)
        call = Call("POST", "/v1/plans", canonical_bytes(model), headers={"content-type": JSON})
        response = yield from self._exchange(call)
        plan = self._plan(response, response.headers.get("x-shardplan-plan-id"))
        if plan.request_hash != request_hash(model):
            raise IntegrityError(
                f"POST {self._url(call)}: the plan answers the request with hash "
                f"{plan.request_hash}, not this one ({request_hash(model)})",
                expected_plan_id=None,
                plan_id=plan.plan_id,
            )
        self._keep(plan, response)
        return plan

    # ------------------------------------------------------------------------ async solves

    def submit_plan(self, request: PlanRequest | Mapping[str, Any]) -> Operation[SolveJob]:
        """POST /v1/plans with ``Prefer: respond-async``: the solve's job (202)."""
        body = canonical_bytes(as_request(request))
        headers = {"content-type": JSON, "prefer": "respond-async"}
        call = Call("POST", "/v1/plans", body, headers=headers)
        response = yield from self._exchange(call)
        if response.status_code != 202:
            raise UnexpectedResponse(
                f"POST {self._url(call)}: {response.status_code}, not 202 with a job: the "
                "service did not honour `Prefer: respond-async` (older than the async API?)"
            )
        return self._document(response, call, SolveJob)

    def get_solve(self, job_id: str) -> Operation[SolveJob]:
        check_job_id(job_id)
        call = Call("GET", f"/v1/solves/{job_id}")
        response = yield from self._exchange(call)
        return self._document(response, call, SolveJob)

    def solve_events_path(self, job_id: str) -> str:
        check_job_id(job_id)
        return f"/v1/solves/{job_id}/events"

    def solved_plan(self, job: SolveJob) -> Operation[ShardingPlan]:
        """An ended job's plan (fetched, verified, and checked to answer the job's
        request), or its problem raised as the sync POST would have raised it."""
        url = f"{self.base_url}/v1/solves/{job.job_id}"
        if job.status is SolveJobStatus.DONE and job.plan_id is not None:
            plan = yield from self.get_plan(job.plan_id)
            if plan.request_hash != job.request_hash:
                raise IntegrityError(
                    f"GET {url}: its plan {plan.plan_id} answers the request with hash "
                    f"{plan.request_hash}, not the job's ({job.request_hash})",
                    expected_plan_id=job.plan_id,
                    plan_id=plan.plan_id,
                )
            return plan
        if job.problem is not None:
            raise PlannerHTTPError.from_problem("GET", url, job.problem)
        raise UnexpectedResponse(f"GET {url}: job {job.status.value} without a plan or problem")

    def get_plan(self, plan_id: str) -> Operation[ShardingPlan]:
        fetched = yield from self.fetch_plan(plan_id)
        return fetched.plan

    def fetch_plan(self, plan_id: str) -> Operation[FetchedPlan]:
        """The plan ``plan_id`` names, and whether the service vouches for its solver
        report: a whole id, answered from the cache when it holds the plan (plans never
        change); or a prefix, always asked of the service (only it knows whether the
        prefix names one plan), and verified to start with it."""
        check_plan_id(plan_id)
        cached = self.cache.fetched(plan_id) if self.cache and is_full_plan_id(plan_id) else None
        if cached is not None:
            return cached  # plans never change: no need to ask
        response = yield from self._exchange(Call("GET", f"/v1/plans/{plan_id}"))
        plan = self._plan(response, plan_id)
        self._keep(plan, response)
        return FetchedPlan(
            plan=plan, solver_report_verified=solver_report_verified(response.headers)
        )

    def get_request(self, plan_id: str) -> Operation[PlanRequest]:
        plan = yield from self.get_plan(plan_id)
        plan_id = plan.plan_id  # the whole id, when asked by a prefix
        cached = self.cache.request(plan) if self.cache else None
        if cached is not None:
            return cached
        call = Call("GET", f"/v1/plans/{plan_id}/request")
        response = yield from self._exchange(call)
        request = self._document(response, call, PlanRequest)
        if request_hash(request) != plan.request_hash:
            raise IntegrityError(
                f"GET {self._url(call)}: the request's hash is {request_hash(request)}, "
                f"but plan {plan_id} was made for {plan.request_hash}",
                expected_plan_id=plan_id,
                plan_id=plan.plan_id,
            )
        if self.cache:
            self.cache.put_request(plan, request)
        return request

    def import_plan(
        self, request: PlanRequest | Mapping[str, Any], plan: ShardingPlan | Mapping[str, Any]
    ) -> Operation[Imported]:
        model = as_plan(plan)
        plan_id = model.plan_id
        body = _pair(as_request(request), model)
        call = Call("PUT", f"/v1/plans/{plan_id}", body, headers={"content-type": JSON})
        response = yield from self._exchange(call)
        stored = self._plan(response, plan_id)
        self._keep(stored, response)
        verified = solver_report_verified(response.headers)
        return Imported(
            stored, created=response.status_code == 201, solver_report_verified=verified
        )

    def list_plans(self, limit: int | None, after: str | None) -> Operation[PlanPage]:
        call = Call("GET", "/v1/plans", params=_page_params(limit, after))
        response = yield from self._exchange(call)
        return self._document(response, call, PlanPage)

    # ------------------------------------------------------------------------ aliases

    def resolve(self, alias: str, allow_stale_alias: bool) -> Operation[Resolved]:
        check_alias(alias)
        remembered = self.cache.alias(alias) if self.cache else None
        known = None
        if self.cache and remembered:
            known = self.cache.fetched(remembered.plan_id)
        # With that plan cached, the service need only say it is still the one (304): any
        # representation's tag (whichever encoding the service chooses) will do.
        headers = {}
        if known:
            tags = (f'"{plan_etag(known.plan.plan_id, coding)}"' for coding in ENCODINGS)
            headers["if-none-match"] = ", ".join(tags)
        try:
            response = yield from self._exchange(
                Call("GET", f"/v1/aliases/{alias}", headers=headers)
            )
        except PlannerUnavailable as unavailable:
            if not (allow_stale_alias and remembered and known):
                raise
            log.warning(
                "alias %r: %s; using the plan it named when last resolved, at %s "
                "(allow_stale_alias=True): %s",
                alias, unavailable, remembered.resolved_at, known.plan.plan_id,
            )  # fmt: skip
            return Resolved(
                alias, known.plan, True, remembered.version, remembered.resolved_at,
                known.solver_report_verified,
            )  # fmt: skip
        if response.status_code == 304 and known:  # still the plan named in If-None-Match
            plan = known.plan
        else:
            plan = self._plan(response, response.headers.get("x-shardplan-plan-id"))
        version = _version(response.headers.get("x-shardplan-alias-version"))
        verified = solver_report_verified(response.headers)  # a 304 says it too
        resolved_at = utc_now()
        if self.cache:
            self._keep(plan, response)
            resolved_at = self.cache.put_alias(alias, plan.plan_id, version).resolved_at
        return Resolved(alias, plan, False, version, resolved_at, verified)

    def set_alias(self, name: str, plan_id: str, comment: str | None) -> Operation[AliasRecord]:
        check_alias(name)
        check_plan_id(plan_id)
        body = json.dumps({"plan_id": plan_id, "comment": comment}).encode()
        call = Call("PUT", f"/v1/aliases/{name}", body, headers={"content-type": JSON})
        response = yield from self._exchange(call)
        return self._document(response, call, AliasRecord)

    def list_aliases(self, limit: int | None, after: str | None) -> Operation[AliasPage]:
        call = Call("GET", "/v1/aliases", params=_page_params(limit, after))
        response = yield from self._exchange(call)
        return self._document(response, call, AliasPage)

    # ------------------------------------------------------------------------ profiles

    def put_profile(self, profile: DeviceProfile | Mapping[str, Any]) -> Operation[str]:
        """PUT /v1/profiles/{profile_id} at the profile's own content address; its id. The
        service's answer (the stored profile) must be that profile."""
        model = as_profile(profile)
        profile_id = profile_id_of(model)
        body = canonical_bytes(model)
        call = Call("PUT", f"/v1/profiles/{profile_id}", body, headers={"content-type": JSON})
        response = yield from self._exchange(call)
        self._profile(response, profile_id)
        return profile_id

    def get_profile(self, profile_id: str) -> Operation[DeviceProfile]:
        check_profile_id(profile_id)
        response = yield from self._exchange(Call("GET", f"/v1/profiles/{profile_id}"))
        return self._profile(response, profile_id)

    # ------------------------------------------------------------------------ checks

    def check(
        self,
        request: PlanRequest | Mapping[str, Any],
        gates: CheckGates | None = None,
        baseline: str | None = None,
    ) -> Operation[CheckResult]:
        body = canonical_bytes(as_request(request))
        params = _gate_params(gates or CheckGates(), baseline)
        call = Call("POST", "/v1/check", body, params=params, headers={"content-type": JSON})
        response = yield from self._exchange(call)
        return self._document(response, call, CheckResult)

    def validate(
        self, request: PlanRequest | Mapping[str, Any], plan: ShardingPlan | Mapping[str, Any]
    ) -> Operation[ValidateResult]:
        body = _pair(as_request(request), as_plan(plan))
        call = Call("POST", "/v1/validate", body, headers={"content-type": JSON})
        response = yield from self._exchange(call)
        return self._document(response, call, ValidateResult)

    # ------------------------------------------------------------------------ exchanges

    def _exchange(self, call: Call) -> Operation[httpx.Response]:
        """``call``'s response, retried as the policy says (see retry.py); a 2xx or 304
        response, or the error for any other."""
        started = time.monotonic()
        attempts = 0
        while True:
            attempts += 1
            outcome = yield call
            assert outcome is not None
            if not is_retryable(outcome):
                return self._final(call, outcome)
            error, wait_s = self._failure(outcome)
            if attempts > self.policy.retries:
                elapsed_s = time.monotonic() - started
                raise PlannerUnavailable(
                    call.method, self._url(call), attempts=attempts, elapsed_s=elapsed_s,
                    last_error=error,
                ) from error  # fmt: skip
            delay_s = self.policy.delay_s(attempts, wait_s)
            log.info(
                "%s %s: %s; attempt %d of %d in %.2f s",
                call.method, self._url(call), error, attempts + 1, self.policy.retries + 1,
                delay_s,
            )  # fmt: skip
            yield Sleep(delay_s)

    def stream_failed(
        self,
        call: Call,
        outcome: httpx.Response | httpx.RequestError,
        attempts: int,
        started: float,
    ) -> float:
        """An event stream's attempt failed (its answer was not a stream, or the connection
        broke or ended before the job did): the wait before attempt ``attempts + 1``, or
        the error to raise, as ``_exchange`` decides for other calls."""
        if not is_retryable(outcome):
            self._final(call, outcome)  # raises for errors
            raise UnexpectedResponse(f"GET {self._url(call)}: not an event stream")
        error, wait_s = self._failure(outcome)
        if attempts > self.policy.retries:
            raise PlannerUnavailable(
                call.method, self._url(call), attempts=attempts,
                elapsed_s=time.monotonic() - started, last_error=error,
            ) from error  # fmt: skip
        delay_s = self.policy.delay_s(attempts, wait_s)
        log.info("GET %s: %s; reconnecting in %.2f s", self._url(call), error, delay_s)
        return delay_s

    def _final(self, call: Call, outcome: httpx.Response | httpx.RequestError) -> httpx.Response:
        if isinstance(outcome, httpx.DecodingError):  # a damaged compressed body
            raise IntegrityError(
                f"{call.method} {self._url(call)}: the body cannot be decoded as its "
                f"Content-Encoding says: {outcome}",
                expected_plan_id=None,
                plan_id=None,
            ) from None
        if isinstance(outcome, httpx.RequestError):
            raise PlannerError(f"{call.method} {self._url(call)}: {outcome}") from outcome
        if outcome.is_success or outcome.status_code == 304:
            return outcome
        raise PlannerHTTPError.from_response(outcome)

    def _failure(
        self, outcome: httpx.Response | httpx.RequestError
    ) -> tuple[Exception, float | None]:
        """A retried outcome as an error, and the wait the service asked for, if any."""
        if isinstance(outcome, httpx.RequestError):
            return outcome, None
        wait_s = retry_after_s(outcome)
        return PlannerHTTPError.from_response(outcome, wait_s), wait_s

    def _url(self, call: Call) -> str:
        return self.base_url + call.path

    # ------------------------------------------------------------------------ answers

    def _plan(self, response: httpx.Response, expected_plan_id: str | None) -> ShardingPlan:
        source = f"{response.request.method} {response.request.url}"
        return verified_plan(response.content, source=source, expected_plan_id=expected_plan_id)

    def _profile(self, response: httpx.Response, profile_id: str) -> DeviceProfile:
        source = f"{response.request.method} {response.request.url}"
        return verified_profile(response.content, source=source, expected_profile_id=profile_id)

    def _document(self, response: httpx.Response, call: Call, model: type[M]) -> M:
        try:
            return model.model_validate_json(response.content)
        except ValidationError as error:
            raise UnexpectedResponse(
                f"{call.method} {self._url(call)}: {response.status_code}, but the body is "
                f"not a {model.__name__}: {validation_summary(error)}"
            ) from None

    def _keep(self, plan: ShardingPlan, response: httpx.Response) -> None:
        """Cache ``plan``, with what ``response`` (which served it) says of its report."""
        if self.cache:
            verified = solver_report_verified(response.headers)
            self.cache.put_plan(plan, solver_report_verified=verified)


# --------------------------------------------------------------------------- arguments


def as_request(request: PlanRequest | Mapping[str, Any]) -> PlanRequest:
    """A PlanRequest, or a dict of one checked with the vocabulary (InputError naming
    every bad field) before anything is sent."""
    if isinstance(request, PlanRequest):
        return request
    return parse_request(_json_text(request, "request"), source="request")


def as_plan(plan: ShardingPlan | Mapping[str, Any]) -> ShardingPlan:
    if isinstance(plan, ShardingPlan):
        return plan
    return parse_plan(_json_text(plan, "plan"), source="plan")


def as_profile(profile: DeviceProfile | Mapping[str, Any]) -> DeviceProfile:
    if isinstance(profile, DeviceProfile):
        return profile
    return parse_profile(_json_text(profile, "profile"), source="profile")


def _json_text(document: Any, what: str) -> str:
    if not isinstance(document, Mapping):
        problem = FieldProblem(
            "", f"must be a {what} model or a dict of one", type(document).__name__
        )
        raise InputError(what, [problem])
    try:
        return json.dumps(document)
    except (TypeError, ValueError) as error:
        raise InputError(what, [FieldProblem("", f"not JSON data: {error}")]) from None


def _pair(request: PlanRequest, plan: ShardingPlan) -> bytes:
    """The body of POST /v1/validate and PUT /v1/plans/{plan_id}."""
    return canonical_bytes(
        {"request": request.model_dump(mode="json"), "plan": plan.model_dump(mode="json")}
    )


def check_plan_id(plan_id: str) -> None:
    """A plan's whole id, or a prefix of it of at least 8 digits (``plan.plan_ids``)."""
    problem = plan_id_problem(plan_id, "plan_id")
    if problem is not None:
        raise InputError("argument", [problem])


def check_profile_id(profile_id: str) -> None:
    if not isinstance(profile_id, str) or not PLAN_ID.fullmatch(profile_id):
        message = "must be 64 lowercase hex digits (a device profile's sha256 content address)"
        raise InputError("argument", [FieldProblem("profile_id", message, profile_id)])


def check_job_id(job_id: str) -> None:
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        message = "must be 64 lowercase hex digits (a solve job's id, from submit_plan)"
        raise InputError("argument", [FieldProblem("job_id", message, job_id)])


class EventDecoder:
    """Jobs from a job's server-sent event stream (the WHATWG format), line by line:
    ``line`` returns the job an event holds when a blank line ends it, else None.
    Comments (keep-alives), ``event``, ``id`` and ``retry`` are skipped; data over
    ``MAX_EVENT_CHARS``, or data that is not a ``SolveJob``, is ``UnexpectedResponse``."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._data: list[str] = []
        self._chars = 0

    def line(self, line: str) -> SolveJob | None:
        if not line:
            data, self._data, self._chars = "\n".join(self._data), [], 0
            return self._job(data) if data else None
        name, _, value = line.partition(":")
        if name == "data":
            value = value.removeprefix(" ")
            self._chars += len(value)
            if self._chars > MAX_EVENT_CHARS:
                raise UnexpectedResponse(
                    f"{self.source}: an event of over {MAX_EVENT_CHARS} characters"
                )
            self._data.append(value)
        return None

    def _job(self, data: str) -> SolveJob:
        try:
            return SolveJob.model_validate_json(data)
        except ValidationError as error:
            raise UnexpectedResponse(
                f"{self.source}: an event that is not a SolveJob: {validation_summary(error)}"
            ) from None


def check_alias(name: str) -> None:
    if not isinstance(name, str) or not ALIAS.fullmatch(name):
        message = (
            "must be letters, digits, '.', '_' and '-', starting with a letter or digit; "
            "at most 128 characters"
        )
        raise InputError("argument", [FieldProblem("alias", message, name)])


def _gate_params(gates: CheckGates, baseline: str | None) -> dict[str, str | int]:
    """POST /v1/check's query: the gates set, and the baseline (a plan id or alias:NAME)."""
    params: dict[str, str | int] = {}
    for name, value in gates.model_dump(exclude_none=True).items():
        params[name] = ",".join(value) if isinstance(value, list) else repr(float(value))
    if baseline is not None:
        params["baseline"] = baseline
    return params


def _page_params(limit: int | None, after: str | None) -> dict[str, str | int]:
    params: dict[str, str | int] = {}
    if limit is not None:
        params["limit"] = limit
    if after is not None:
        params["after"] = after
    return params


def _version(header: str | None) -> int | None:
    return int(header) if header and header.isascii() and header.isdigit() else None


def cache_for(cache_dir: str | os.PathLike[str] | None) -> DiskCache | None:
    return None if cache_dir is None else DiskCache(cache_dir)
