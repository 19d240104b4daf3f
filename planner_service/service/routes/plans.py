"""Plans: POST /v1/plans (solve or return the stored plan), PUT /v1/plans/{plan_id} (store
a plan solved elsewhere), GET /v1/plans (the list), GET /v1/plans/{plan_id} (the stored
bytes, immutable and cacheable), its request, and its HTML view. The GETs take a plan's id
or a unique prefix of it (``deps.PlanInPath``); PUT, which names a plan not stored yet, its
whole id."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, Response
from starlette.concurrency import run_in_threadpool

from planner_service.plan.api import PlanPage
from planner_service.plan.codec import parse_plan, parse_request
from planner_service.plan.encodings import ENCODINGS
from planner_service.plan.types import PlanRequest
from planner_service.service.deps import (
    Jobs,
    PlanId,
    PlanInPath,
    RespondAsync,
    State,
    Writer,
    reader,
)
from planner_service.service.http.clock import received_at
from planner_service.service.http.fetch import (
    PLAN_ROUTE,
    PreparedResponse,
    fetch_headers,
    negotiated,
    revalidated,
)
from planner_service.service.http.openapi import (
    REQUEST_EXAMPLE,
    JsonObject,
    RequestAndPlan,
    json_body,
    schema_ref,
)
from planner_service.service.http.paging import (
    DEFAULT_LIMIT,
    After,
    Limit,
    decode_cursor,
    encode_cursor,
    page,
)
from planner_service.service.http.problems import PROBLEM_CONTENT, SOLVE_UNAVAILABLE, ProblemError
from planner_service.service.http.responses import (
    JSON,
    PLAN_RESPONSE,
    SOLVER_REPORT_HEADER,
    UNVERIFIED,
    job_content,
    job_response,
)
from planner_service.service.importing import import_plan
from planner_service.service.pages.plan import render_plan_page
from planner_service.service.plan_ids import AMBIGUOUS
from planner_service.service.solver.references import decode_request, with_stored_references
from planner_service.service.solver.run import no_plan, solve_and_store

router = APIRouter(tags=["plans"])


@router.post(
    "/v1/plans",
    status_code=201,
    openapi_extra=json_body(PlanRequest, REQUEST_EXAMPLE),
    responses={
        200: {"description": "a plan for this request was already stored", **PLAN_RESPONSE},
        201: {"description": "solved and stored", **PLAN_RESPONSE},
        202: {"description": "`Prefer: respond-async`: the solve's job", **job_content()},
        422: {"description": "invalid request, or no plan exists (explained)", **PROBLEM_CONTENT},
        503: {"description": SOLVE_UNAVAILABLE, **PROBLEM_CONTENT},
    },
)
async def create_plan(
    http_request: Request, state: State, jobs: Jobs, actor: Writer, respond_async: RespondAsync
) -> Response:
    """Solve a PlanRequest and store the plan, or answer with the plan already stored for
    the same request (same ``request_hash`` and planner version). The body is the plan;
    ``Location`` names it; ``X-Shardplan-Cache`` says ``hit`` or ``miss``.

    With ``Prefer: respond-async`` (RFC 7240): **202** at once with the solve's job
    (``Location: /v1/solves/{job_id}``, ``Preference-Applied: respond-async``); follow
    it with GET /v1/solves/{job_id} or its event stream. A job whose plan is stored
    already is done in that answer."""
    del actor
    request = await decode_request(state, await http_request.body(), received_at(http_request))
    if respond_async:
        # An unknown previous plan or profile is a 422 now, not a failed job; and the job's
        # stored request holds them itself, so a restarted solve needs nothing else.
        request = await with_stored_references(state, request)
        job = await jobs.submit(request)
        return job_response(job, status=202, headers={"Preference-Applied": "respond-async"})
    existing = await state.plan_for_request(request.request_hash)
    if existing is not None:
        return _plan_response(*existing, status=200, solved_now=False)
    result, fresh = await solve_and_store(state, request)
    if result.plan is None or result.plan_id is None:
        raise no_plan(result)
    response = _plan_response(
        result.plan_id, result.plan, status=201 if fresh else 200, solved_now=fresh
    )
    response.headers["X-Shardplan-Solve-Seconds"] = f"{result.wall_time_s:.3f}"
    return response


def _plan_response(
    plan_id: str, data: bytes, *, status: int, solved_now: bool | None = None
) -> Response:
    """The plan's bytes; ``X-Shardplan-Cache`` says ``miss`` when this request solved it,
    ``hit`` when it was stored already or another request's solve made it (absent: a PUT,
    which solves nothing)."""
    headers = {
        "Location": f"/v1/plans/{plan_id}",
        "ETag": f'"{plan_id}"',
        "X-Shardplan-Plan-Id": plan_id,
    }
    if solved_now is not None:
        headers["X-Shardplan-Cache"] = "miss" if solved_now else "hit"
    return Response(data, status_code=status, media_type=JSON, headers=headers)


@router.put(
    "/v1/plans/{plan_id}",
    status_code=201,
    openapi_extra=json_body(RequestAndPlan),
    responses={
        200: {"description": "this plan was already stored", **PLAN_RESPONSE},
        201: {"description": "checked and stored", **PLAN_RESPONSE},
        409: {
            "description": "the plan's content address is not the path's plan_id or the "
            "plan's own plan_id",
            **PROBLEM_CONTENT,
        },
        422: {
            "description": "invalid body, or the plan breaks its request (`violations`)",
            **PROBLEM_CONTENT,
        },
    },
)
async def put_plan(plan_id: PlanId, http_request: Request, state: State, actor: Writer) -> Response:
    """Store a plan solved elsewhere, with the request it was made for: its content address
    is computed again and the validator checks it against the request first. Stored under
    its own ``planner_version``, so a POST of the same request gets it only from a service
    of that planner version. The body is the stored plan, as from POST."""
    del actor
    checked, inserted = await import_plan(state, plan_id, await http_request.body())
    response = _plan_response(checked.plan_id, checked.plan, status=201 if inserted else 200)
    response.headers[SOLVER_REPORT_HEADER] = UNVERIFIED  # the importer's word (importing.py)
    return response


@router.get(
    "/v1/plans",
    response_model=PlanPage,
    dependencies=[Depends(reader)],
    responses={422: {"description": "a bad `limit` or `after`", **PROBLEM_CONTENT}},
)
async def list_plans(state: State, limit: Limit = DEFAULT_LIMIT, after: After = None) -> PlanPage:
    """Stored plans, newest first, each with its planner version, when it was stored and a
    summary (world size, tables, objective, solver status). Follow ``next`` for more."""
    before = None if after is None else decode_cursor(after, 2)
    store = state.store()
    rows = await run_in_threadpool(lambda: store.plans.page(limit=limit + 1, before=before))
    plans, more = page(rows, limit)
    last = plans[-1] if more else None
    return PlanPage(
        plans=list(plans), next=encode_cursor(last.created_at, last.plan_id) if last else None
    )


PLAN_FETCH_RESPONSES: dict[int | str, JsonObject] = {
    200: {
        "description": "the plan's stored bytes, zstd- or gzip-encoded when "
        "`Accept-Encoding` allows (`Content-Encoding`); HEAD gives the same headers "
        "without a body. Named by a prefix of its id: `Cache-Control: no-cache`, "
        "`X-Shardplan-Plan-Id` and `Content-Location` name the plan. An imported plan "
        "(PUT): `X-Shardplan-Solver-Report: unverified`",
        **PLAN_RESPONSE,
    },
    304: {"description": "If-None-Match matched: the client's copy is current"},
    404: {"description": "no such plan, or no plan id starts with the prefix", **PROBLEM_CONTENT},
    406: {
        "description": "`Accept-Encoding` refuses identity and accepts neither zstd nor gzip",
        **PROBLEM_CONTENT,
    },
    409: {"description": AMBIGUOUS, **PROBLEM_CONTENT},
}


# GET and HEAD are two operations of the OpenAPI document, each with its own id (one route
# with both methods gave both the same id).
@router.head(PLAN_ROUTE, dependencies=[Depends(reader)], responses=PLAN_FETCH_RESPONSES)
@router.get(PLAN_ROUTE, dependencies=[Depends(reader)], responses=PLAN_FETCH_RESPONSES)
async def get_plan(plan: PlanInPath, http_request: Request, state: State) -> Response:
    """The stored plan, byte for byte, or its zstd or gzip encoding (stored beside it) as
    ``Accept-Encoding`` asks. Plans never change: ``ETag`` is the plan_id for the identity
    bytes and ``<plan_id>-zstd`` / ``<plan_id>-gzip`` for the encodings, ``If-None-Match``
    with the negotiated representation's tag gives 304, and responses may be cached
    forever (``Vary: Accept-Encoding``). A cached plan is answered before routing, from
    the same prepared responses (``fetch.py``): this route serves the first fetch and the
    rest. Named by a unique prefix of its id, the same plan, not cached without
    revalidation (a plan stored later may share the prefix). A plan stored by PUT (made
    elsewhere) is answered with ``X-Shardplan-Solver-Report: unverified``: its status,
    bound and gap are the importer's word."""
    accept, if_none_match = fetch_headers(http_request.headers.raw)
    encoding = negotiated(accept)
    responses = await state.plan_responses(plan.plan_id)
    if responses is None:
        raise _not_found(plan.plan_id)
    if encoding is None:
        raise ProblemError(
            406,
            f"Accept-Encoding {accept!r} accepts none of {', '.join(ENCODINGS)}, the "
            "encodings of this plan; accept one of them",
            headers={"Vary": "Accept-Encoding"},
        )
    status, headers, body = responses.answer(encoding, if_none_match)
    if plan.by_prefix:
        location = (b"content-location", f"/v1/plans/{plan.plan_id}".encode())
        headers = revalidated(headers, plan.plan_id, location)
    return PreparedResponse(status, headers, body)


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
        409: {"description": AMBIGUOUS, **PROBLEM_CONTENT},
    },
)
async def get_plan_request(plan: PlanInPath, state: State) -> Response:
    """The PlanRequest stored beside the plan (canonical JSON)."""
    stored = await state.stored(plan.plan_id)
    if stored is None:
        raise _not_found(plan.plan_id)
    return Response(stored.request, media_type=JSON, headers=plan.headers("/request"))


@router.get(
    "/v1/plans/{plan_id}/view",
    dependencies=[Depends(reader)],
    response_class=HTMLResponse,
    responses={
        404: {"description": "no such plan", **PROBLEM_CONTENT},
        409: {"description": AMBIGUOUS, **PROBLEM_CONTENT},
    },
)
async def view_plan(plan: PlanInPath, state: State) -> HTMLResponse:
    """A page for people: per-rank memory and perf bars, the tables, the solver report
    (an imported plan's said to be unverified, on the page and in
    ``X-Shardplan-Solver-Report``)."""
    stored = await state.stored(plan.plan_id)
    if stored is None:
        raise _not_found(plan.plan_id)
    # Parsing and rendering take time in proportion to the plan: off the event loop.
    page = await state.cpu.run(_plan_page, stored.request, stored.plan, stored.imported)
    headers = plan.headers("/view")
    if stored.imported:
        headers[SOLVER_REPORT_HEADER] = UNVERIFIED
    return HTMLResponse(page, headers=headers)


def _plan_page(request_document: bytes, plan_document: bytes, imported: bool) -> str:
    request = parse_request(request_document, source="stored request")
    plan = parse_plan(plan_document, source="stored plan")
    return render_plan_page(request, plan, imported=imported)
