"""What routes depend on, as ``Annotated`` aliases: the process's service state and solve
jobs, the caller's identity (bearer tokens from SHARDPLAN_API_TOKENS), the plan-id (a full
id, or a unique prefix of one resolved to its plan: ``PlanInPath``), job-id and profile-id
path parameters, and whether the caller asked for an asynchronous answer
(RFC 7240 ``Prefer: respond-async``). Tests replace any of these with
``app.dependency_overrides``."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Header, Path, Request

from planner_service.plan.plan_ids import PLAN_ID_OR_PREFIX_PATTERN
from planner_service.service.http.problems import ProblemError
from planner_service.service.plan_ids import PLAN_ID_DESCRIPTION, PlanRef, Where, resolve_plan_id
from planner_service.service.settings import Settings
from planner_service.service.solver.jobs import JOB_ID_PATTERN, SolveJobs
from planner_service.service.state import ServiceState

PLAN_ID_PATTERN = r"^[0-9a-f]{64}$"


def state_of(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state


def jobs_of(request: Request) -> SolveJobs:
    jobs: SolveJobs = request.app.state.jobs
    return jobs


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


def respond_async(
    prefer: Annotated[
        str | None,
        Header(
            max_length=1024,
            description="RFC 7240 preferences; `respond-async` makes POST /v1/plans answer "
            "202 with the solve's job at once",
        ),
    ] = None,
) -> bool:
    """Whether an RFC 7240 ``Prefer`` header asks for ``respond-async`` (a token among
    comma-separated preferences, any case, with or without parameters)."""
    if not prefer:
        return False
    return any(
        part.split(";")[0].split("=")[0].strip().lower() == "respond-async"
        for part in prefer.split(",")
    )


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


State = Annotated[ServiceState, Depends(state_of)]
Jobs = Annotated[SolveJobs, Depends(jobs_of)]
Writer = Annotated[str, Depends(writer)]
PlanId = Annotated[
    str, Path(pattern=PLAN_ID_PATTERN, description="a plan's content address (sha256, hex)")
]


async def plan_in_path(
    plan_id: Annotated[
        str,
        # Checked by resolve_plan_id, whose 422 says what is accepted in words; the pattern
        # is here for the OpenAPI document.
        Path(
            description=PLAN_ID_DESCRIPTION,
            json_schema_extra={"pattern": PLAN_ID_OR_PREFIX_PATTERN},
        ),
    ],
    state: State,
) -> PlanRef:
    """The stored plan a path names by its id, or by a unique prefix of it."""
    return await resolve_plan_id(state, plan_id, where=Where.PATH)


PlanInPath = Annotated[PlanRef, Depends(plan_in_path)]
ProfileId = Annotated[
    str,
    Path(
        pattern=PLAN_ID_PATTERN,
        description="a device profile's content address (sha256 of its canonical JSON, hex)",
    ),
]
JobId = Annotated[
    str,
    Path(
        pattern=JOB_ID_PATTERN,
        description="a solve job's id (64 hex digits, from the request's hash and the "
        "planner version)",
    ),
]
RespondAsync = Annotated[bool, Depends(respond_async)]
