"""Aliases: stable names (``ranking-prod``) that point at a plan, with their history, so a
job can fetch "the current plan" and a bad plan can be rolled back by pointing back; and
the list of them all."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from planner_service.plan.api import AliasHistory, AliasPage, AliasRecord
from planner_service.plan.codec import load_json
from planner_service.plan.encodings import ENCODINGS
from planner_service.plan.errors import InputError, problems_from_validation_error
from planner_service.plan.plan_ids import PLAN_ID_OR_PREFIX_PATTERN
from planner_service.plan.text import FreeText
from planner_service.service.deps import State, Writer, reader
from planner_service.service.http.fetch import (
    PreparedResponse,
    fetch_headers,
    negotiated,
    revalidated,
)
from planner_service.service.http.openapi import JsonObject, json_body
from planner_service.service.http.paging import (
    DEFAULT_LIMIT,
    After,
    Limit,
    decode_cursor,
    encode_cursor,
    page,
)
from planner_service.service.http.problems import PROBLEM_CONTENT, ProblemError
from planner_service.service.http.responses import JSON, PLAN_RESPONSE
from planner_service.service.plan_ids import (
    AMBIGUOUS,
    PLAN_ID_DESCRIPTION,
    Where,
    resolve_plan_id,
)
from planner_service.service.store import AliasChange, UnknownPlanError

router = APIRouter(tags=["aliases"])

ALIAS_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
AliasName = Annotated[
    str,
    Path(
        pattern=ALIAS_PATTERN,
        description="letters, digits, '.', '_' and '-', starting with a letter or digit; "
        "at most 128 characters",
    ),
]


class AliasUpdate(BaseModel):
    """Body of PUT /v1/aliases/{name}."""

    model_config = ConfigDict(extra="forbid", strict=True)
    # Checked by resolve_plan_id (its 422 says what is accepted in words); the pattern is
    # here for the OpenAPI document.
    plan_id: str = Field(
        description=f"the plan to point at: {PLAN_ID_DESCRIPTION}",
        json_schema_extra={"pattern": PLAN_ID_OR_PREFIX_PATTERN},
    )
    comment: Annotated[str, FreeText] | None = Field(
        None, max_length=1000, description="why, for the history"
    )


def alias_record(change: AliasChange) -> AliasRecord:
    return AliasRecord(
        name=change.name,
        version=change.version,
        plan_id=change.plan_id,
        previous_plan_id=change.previous_plan_id,
        actor=change.actor,
        comment=change.comment,
        changed_at=change.changed_at,
    )


@router.get(
    "/v1/aliases",
    response_model=AliasPage,
    dependencies=[Depends(reader)],
    responses={422: {"description": "a bad `limit` or `after`", **PROBLEM_CONTENT}},
)
async def list_aliases(
    state: State, limit: Limit = DEFAULT_LIMIT, after: After = None
) -> AliasPage:
    """Every alias by name (bytewise order), each as the change that set it last: the plan
    it points at, who moved it, when and why. Follow ``next`` for the rest."""
    last = None if after is None else decode_cursor(after, 1)[0]
    rows = await run_in_threadpool(lambda: state.store().aliases.page(limit=limit + 1, after=last))
    changes, more = page(rows, limit)
    return AliasPage(
        aliases=[alias_record(change) for change in changes],
        next=encode_cursor(changes[-1].name) if more else None,
    )


@router.put(
    "/v1/aliases/{name}",
    response_model=AliasRecord,
    openapi_extra=json_body(AliasUpdate),
    responses={
        201: {"description": "alias created", "model": AliasRecord},
        409: {"description": AMBIGUOUS, **PROBLEM_CONTENT},
        422: {"description": "bad body, or no such plan", **PROBLEM_CONTENT},
    },
)
async def put_alias(
    name: AliasName, http_request: Request, state: State, actor: Writer
) -> Response:
    """Point ``name`` at a stored plan, named by its id or a unique prefix of it (200; 201
    when the alias is new). Every change is kept in the alias's history with who made it
    and when, under the plan's whole id."""
    body = await http_request.body()
    document = load_json(body, "body")
    try:
        update = AliasUpdate.model_validate(document)
    except ValidationError as error:
        raise InputError("body", problems_from_validation_error(error, AliasUpdate)) from None
    plan = await resolve_plan_id(state, update.plan_id, where=Where.BODY)
    store = state.store()
    try:
        change = await run_in_threadpool(
            lambda: store.aliases.set(name, plan.plan_id, actor=actor, comment=update.comment)
        )
    except UnknownPlanError:
        raise ProblemError(
            422,
            f"body: plan_id = {update.plan_id!r}: no plan with this id is stored here; "
            "POST /v1/plans first",
            errors=[{"path": "plan_id", "message": "no plan with this id is stored here"}],
        ) from None
    record = alias_record(change)
    return Response(
        record.model_dump_json(),
        status_code=201 if change.version == 1 else 200,
        media_type=JSON,
        headers={"Location": f"/v1/aliases/{name}"},
    )


ALIAS_FETCH_RESPONSES: dict[int | str, JsonObject] = {
    200: {
        "description": "the plan the alias points at, zstd- or gzip-encoded when "
        "`Accept-Encoding` allows; HEAD gives the same headers without the body. An "
        "imported plan (PUT): `X-Shardplan-Solver-Report: unverified`",
        **PLAN_RESPONSE,
    },
    304: {"description": "If-None-Match matched the current plan's representation"},
    404: {"description": "no such alias", **PROBLEM_CONTENT},
    406: {
        "description": "`Accept-Encoding` refuses identity and accepts neither zstd nor gzip",
        **PROBLEM_CONTENT,
    },
}


# GET and HEAD as for plans (routes/plans.py): two operations, each with its own id.
@router.head("/v1/aliases/{name}", dependencies=[Depends(reader)], responses=ALIAS_FETCH_RESPONSES)
@router.get("/v1/aliases/{name}", dependencies=[Depends(reader)], responses=ALIAS_FETCH_RESPONSES)
async def get_alias(name: AliasName, http_request: Request, state: State) -> Response:
    """The plan the alias points at now, in the encoding ``Accept-Encoding`` negotiates (as
    ``GET /v1/plans/{plan_id}``); ``X-Shardplan-Plan-Id`` names the plan and ``ETag`` the
    representation (``"<plan_id>"``, ``"<plan_id>-zstd"`` or ``"<plan_id>-gzip"``). Not
    cacheable without revalidation: an alias can move."""
    accept, if_none_match = fetch_headers(http_request.headers.raw)
    encoding = negotiated(accept)
    current = await run_in_threadpool(state.store().aliases.get, name)
    if current is None:
        raise ProblemError(404, f"no alias named {name!r}")
    if encoding is None:
        raise ProblemError(
            406,
            f"Accept-Encoding {accept!r} accepts none of {', '.join(ENCODINGS)}, the "
            "encodings of its plan; accept one of them",
            headers={"Vary": "Accept-Encoding"},
        )
    responses = await state.plan_responses(current.plan_id)
    assert responses is not None  # aliases reference stored plans (foreign key); plans stay
    status, headers, body = responses.answer(encoding, if_none_match)
    version = (b"x-shardplan-alias-version", str(current.version).encode())
    return PreparedResponse(status, revalidated(headers, current.plan_id, version), body)


@router.get(
    "/v1/aliases/{name}/history",
    response_model=AliasHistory,
    dependencies=[Depends(reader)],
    responses={404: {"description": "no such alias", **PROBLEM_CONTENT}},
)
async def alias_history(name: AliasName, state: State) -> AliasHistory:
    """Every change of the alias, newest first (up to 100): to see who moved it and to
    roll back, PUT an earlier plan_id."""
    changes = await run_in_threadpool(lambda: state.store().aliases.history(name, limit=100))
    if not changes:
        raise ProblemError(404, f"no alias named {name!r}")
    return AliasHistory(name=name, changes=[alias_record(change) for change in changes])
