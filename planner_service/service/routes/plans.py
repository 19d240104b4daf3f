"""Plans: POST /v1/plans (solve or return the stored plan), GET /v1/plans/{plan_id} (the
stored bytes, immutable and cacheable), its request, and its HTML view."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import HTMLResponse, Response

from planner_service import PLANNER_VERSION
from planner_service.plan.codec import canonical_bytes, parse_plan, parse_request, request_hash
from planner_service.plan.types import Infeasibility, PlanRequest, ShardingPlan
from planner_service.service import metrics
from planner_service.service.limits import decode_plan_request
from planner_service.service.problems import PROBLEM_CONTENT, ProblemError
from planner_service.service.schemas import json_body, schema_ref
from planner_service.service.solving import (
    PoolFullError,
    ShuttingDownError,
    SolveResult,
    SolveUnavailableError,
    T,
)
from planner_service.service.state import ServiceState, reader, state_of, writer
from planner_service.service.view import render_plan_page

router = APIRouter(tags=["plans"])

PLAN_ID_PATTERN = r"^[0-9a-f]{64}$"
REQUEST_EXAMPLE = {
    "topology": {"world_size": 2, "hbm_bytes": 16 * 2**30},
    "tables": [
        {"name": "user_id", "num_embeddings": 1_000_000, "embedding_dim": 128},
        {"name": "item_id", "num_embeddings": 200_000, "embedding_dim": 64},
    ],
    "options": {"time_limit_s": 2.0},
}
PlanId = Annotated[
    str, Path(pattern=PLAN_ID_PATTERN, description="a plan's content address (sha256, hex)")
]
IMMUTABLE = "public, max-age=31536000, immutable"
JSON = "application/json"

SOLVE_UNAVAILABLE = (
    "no answer for now, see Retry-After: the solver pool and its queue are full, the "
    "solve overran options.time_limit_s plus SHARDPLAN_SOLVE_GRACE_S (its process was "
    "killed), its solver process died, or the store is down"
)
_PLAN_RESPONSE: dict[str, Any] = {"content": {JSON: {"schema": schema_ref(ShardingPlan)}}}


@router.post(
    "/v1/plans",
    status_code=201,
    openapi_extra=json_body(PlanRequest, REQUEST_EXAMPLE),
    responses={
        200: {"description": "a plan for this request was already stored", **_PLAN_RESPONSE},
        201: {"description": "solved and stored", **_PLAN_RESPONSE},
        422: {"description": "invalid request, or no plan exists (explained)", **PROBLEM_CONTENT},
        503: {"description": SOLVE_UNAVAILABLE, **PROBLEM_CONTENT},
    },
)
async def create_plan(http_request: Request, actor: Annotated[str, Depends(writer)]) -> Response:
    """Solve a PlanRequest and store the plan, or answer with the plan already stored for
    the same request (same ``request_hash`` and planner version). The body is the plan;
    ``Location`` names it; ``X-Shardplan-Cache`` says ``hit`` or ``miss``."""
    del actor
    state = state_of(http_request)
    request = decode_plan_request(await http_request.body(), state.settings)
    key = request_hash(request)
    existing = await state.plan_for_request(key)
    if existing is not None:
        return _plan_response(*existing, status=200, cache="hit")

    store = state.store()
    request_document = canonical_bytes(request)

    def finish(result: SolveResult) -> tuple[SolveResult, bool]:
        if result.plan is None or result.plan_id is None:
            return result, False
        inserted = store.put_plan(
            plan_id=result.plan_id,
            request_hash=key,
            planner_version=PLANNER_VERSION,
            request=request_document,
            plan=result.plan,
        )
        state.cache.put(result.plan_id, result.plan)
        return result, inserted

    (result, inserted), shared = await _solve(
        state, "plan:" + key, request, request_document, finish
    )
    metrics.CACHE.labels("shared" if shared else "miss").inc()
    if result.plan is None or result.plan_id is None:
        raise _no_plan(result)
    fresh = inserted and not shared
    response = _plan_response(
        result.plan_id, result.plan, status=201 if fresh else 200, cache="miss" if fresh else "hit"
    )
    response.headers["X-Shardplan-Solve-Seconds"] = f"{result.wall_time_s:.3f}"
    return response


async def _solve(
    state: ServiceState,
    key: str,
    request: PlanRequest,
    request_document: bytes,
    finish: Callable[[SolveResult], T],
) -> tuple[T, bool]:
    """Solve in the pool (timing every solve once), or 503 when the pool is full, the
    solve overran its time limit, its solver process died or the service is stopping."""

    def timed(result: SolveResult) -> T:
        outcome = "plan" if result.plan is not None else "no_plan"
        metrics.SOLVE_SECONDS.labels(outcome).observe(result.wall_time_s)
        return finish(result)

    try:
        return await state.pool.solve(key, request_document, request.options.time_limit_s, timed)
    except SolveUnavailableError as error:
        if isinstance(error, PoolFullError):
            metrics.REJECTED.inc()
        raise _unavailable(error) from None
    except asyncio.CancelledError:
        # uvicorn cancels the requests still running when its graceful shutdown period
        # ends, and the pool kills their solves next: say so, rather than uvicorn's bare 500.
        raise _unavailable(ShuttingDownError()) from None


def _unavailable(error: SolveUnavailableError) -> ProblemError:
    return ProblemError(
        503,
        f"{error}; retry in {error.retry_after_s} s",
        title=error.title,
        headers={"Retry-After": str(error.retry_after_s)},
        **error.extensions,
    )


def _no_plan(result: SolveResult) -> ProblemError:
    assert result.infeasibility is not None
    infeasibility = Infeasibility.model_validate_json(result.infeasibility)
    return ProblemError(
        422,
        infeasibility.render(),
        title="No plan exists" if infeasibility.status.value == "infeasible" else "No plan found",
        infeasibility=json.loads(result.infeasibility),
    )


def _plan_response(plan_id: str, data: bytes, *, status: int, cache: str) -> Response:
    headers = {
        "Location": f"/v1/plans/{plan_id}",
        "ETag": f'"{plan_id}"',
        "X-Shardplan-Plan-Id": plan_id,
        "X-Shardplan-Cache": cache,
    }
    return Response(data, status_code=status, media_type=JSON, headers=headers)


def etag_matches(if_none_match: str | None, plan_id: str) -> bool:
    """RFC 9110 If-None-Match: ``*`` or any listed entity tag (weak or strong) equal to ours."""
    if not if_none_match:
        return False
    for tag in if_none_match.split(","):
        tag = tag.strip()
        if tag == "*" or tag.removeprefix("W/").strip('"') == plan_id:
            return True
    return False


@router.get(
    "/v1/plans/{plan_id}",
    dependencies=[Depends(reader)],
    responses={
        200: {"description": "the plan's stored bytes", **_PLAN_RESPONSE},
        304: {"description": "If-None-Match matched: the client's copy is current"},
        404: {"description": "no such plan", **PROBLEM_CONTENT},
    },
)
async def get_plan(plan_id: PlanId, http_request: Request) -> Response:
    """The stored plan, byte for byte. Plans never change: ``ETag`` is the plan_id,
    ``If-None-Match`` gives 304, and responses may be cached forever."""
    headers = {"ETag": f'"{plan_id}"', "Cache-Control": IMMUTABLE}
    state = state_of(http_request)
    data = await state.plan_bytes(plan_id)
    if data is None:
        raise _not_found(plan_id)
    if etag_matches(http_request.headers.get("if-none-match"), plan_id):
        return Response(status_code=304, headers=headers)
    return Response(data, media_type=JSON, headers=headers)


def _not_found(plan_id: str) -> ProblemError:
    return ProblemError(404, f"no plan with plan_id {plan_id} is stored here")


@router.get(
    "/v1/plans/{plan_id}/request",
    dependencies=[Depends(reader)],
    responses={
        200: {
            "description": "the request the plan was made for",
            "content": {JSON: {"schema": schema_ref(PlanRequest)}},
        },
        404: {"description": "no such plan", **PROBLEM_CONTENT},
    },
)
async def get_plan_request(plan_id: PlanId, http_request: Request) -> Response:
    """The PlanRequest stored beside the plan (canonical JSON)."""
    stored = await state_of(http_request).stored(plan_id)
    if stored is None:
        raise _not_found(plan_id)
    return Response(stored.request, media_type=JSON, headers={"Cache-Control": IMMUTABLE})


@router.get(
    "/v1/plans/{plan_id}/view",
    dependencies=[Depends(reader)],
    response_class=HTMLResponse,
    responses={404: {"description": "no such plan", **PROBLEM_CONTENT}},
)
async def view_plan(plan_id: PlanId, http_request: Request) -> HTMLResponse:
    """A page for people: per-rank memory and perf bars, the tables, the solver report."""
    state = state_of(http_request)
    stored = await state.stored(plan_id)
    if stored is None:
        raise _not_found(plan_id)
    # Parsing and rendering take time in proportion to the plan: off the event loop.
    page = await state.cpu.run(_plan_page, stored.request, stored.plan)
    return HTMLResponse(page, headers={"Cache-Control": IMMUTABLE})


def _plan_page(request_document: bytes, plan_document: bytes) -> str:
    request = parse_request(request_document, source="stored request")
    plan = parse_plan(plan_document, source="stored plan")
    return render_plan_page(request, plan)
