"""POST /v1/check: does this request fit? A capacity check for CI that stores nothing."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from planner_service.plan.api import CheckResult
from planner_service.plan.codec import parse_plan, request_hash
from planner_service.plan.types import Infeasibility, PlanRequest
from planner_service.reports import rank_headroom
from planner_service.service.deps import State, reader
from planner_service.service.http.limits import decode_plan_request
from planner_service.service.http.openapi import REQUEST_EXAMPLE, json_body
from planner_service.service.http.problems import PROBLEM_CONTENT, SOLVE_UNAVAILABLE
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
    """Solve without storing and report whether it fits, each rank's free memory, and,
    when it does not fit, why and the smallest fixes. 200 either way."""
    request = decode_plan_request(await http_request.body(), state.settings)
    key = request_hash(request)
    existing = await state.plan_for_request(key)
    if existing is not None:
        return await state.cpu.run(_fits, request, existing[1], stored=True)
    result = await solve_only(state, request, key)
    if result.plan is None:
        assert result.infeasibility is not None
        infeasibility = Infeasibility.model_validate_json(result.infeasibility)
        return CheckResult(
            fits=False,
            status=infeasibility.status,
            plan_id=None,
            stored=False,
            infeasibility=infeasibility,
        )
    return await state.cpu.run(_fits, request, result.plan, stored=False)


def _fits(request: PlanRequest, plan_document: bytes, *, stored: bool) -> CheckResult:
    """Per-rank headroom: work in proportion to world_size, run in a worker process."""
    plan = parse_plan(plan_document)
    ranks = rank_headroom(request, plan)
    report = plan.solver
    return CheckResult(
        fits=True,
        status=report.status,
        plan_id=plan.plan_id,
        stored=stored,
        objective=report.objective,
        lower_bound=report.lower_bound,
        gap=report.gap,
        min_hbm_free_bytes=min(rank.hbm_free_bytes for rank in ranks),
        ranks=ranks,
    )
