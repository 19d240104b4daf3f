"""POST /v1/check: does this request fit? A capacity check for CI that stores nothing."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from planner_service.check.report import check_report, check_result
from planner_service.plan.api import CheckResult
from planner_service.plan.codec import parse_plan, request_hash
from planner_service.plan.types import Infeasibility, PlanRequest
from planner_service.service.deps import State, reader
from planner_service.service.http.limits import decode_plan_request
from planner_service.service.http.openapi import REQUEST_EXAMPLE, json_body
from planner_service.service.http.problems import PROBLEM_CONTENT, SOLVE_UNAVAILABLE
from planner_service.service.solver.references import with_stored_references
from planner_service.service.solver.run import solve_only

router = APIRouter(tags=["plans"])


@router.post(
    "/v1/check",
    response_model=CheckResult,
    dependencies=[Depends(reader)],
    openapi_extra=json_body(PlanRequest, REQUEST_EXAMPLE),
    responses={503: {"description": SOLVE_UNAVAILABLE, **PROBLEM_CONTENT}},
)
async def check(http_request: Request, state: State) -> CheckResult:
    """Solve without storing and report whether it fits, each rank's free memory and what
    binds the plan, or, when it does not fit, why and the smallest fixes: the report
    ``shardplan check --format json`` prints, and whether the plan is stored. 200 either
    way."""
    request = decode_plan_request(await http_request.body(), state.settings)
    # The report prices the plan, so it needs the profile a request names by id.
    request = await with_stored_references(state, request)
    key = request_hash(request)
    existing = await state.plan_for_request(key)
    if existing is not None:
        return await state.cpu.run(_check_plan, request, existing[1], stored=True)
    result = await solve_only(state, request, key)
    if result.plan is None:
        assert result.infeasibility is not None
        infeasibility = Infeasibility.model_validate_json(result.infeasibility)
        return check_result(check_report(request, None, infeasibility), stored=False)
    return await state.cpu.run(_check_plan, request, result.plan, stored=False)


def _check_plan(request: PlanRequest, plan_document: bytes, *, stored: bool) -> CheckResult:
    """The check of a plan: work in proportion to world_size, run in a worker process."""
    plan = parse_plan(plan_document)
    return check_result(check_report(request, plan, None), stored=stored)
