"""POST /v1/validate: a request and a plan in, every violation out."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from planner_service.plan.api import ValidateResult
from planner_service.service.deps import State, reader
from planner_service.service.http.openapi import RequestAndPlan, json_body
from planner_service.service.request_and_plan import (
    NeedsPreviousPlan,
    checked_with_previous_plan,
    decode_pair,
)
from planner_service.service.settings import Settings
from planner_service.validate.validator import validate_plan

router = APIRouter(tags=["plans"])


@router.post(
    "/v1/validate",
    response_model=ValidateResult,
    dependencies=[Depends(reader)],
    openapi_extra=json_body(RequestAndPlan),
)
async def validate(http_request: Request, state: State) -> JSONResponse:
    """Check ``plan`` against ``request``; 200 with every violation (empty when valid). A
    request that names its previous plan by id alone is checked against the stored plan
    (422 naming ``request.options.previous_plan_id`` when none is stored)."""
    body = await http_request.body()
    # Decoding and checking take time in proportion to the plan: off the event loop.
    result = await checked_with_previous_plan(state, _validate_body, body, state.settings)
    return JSONResponse(result.model_dump(mode="json"))


def _validate_body(
    body: bytes, settings: Settings, previous_plan: bytes | None
) -> ValidateResult | NeedsPreviousPlan:
    pair = decode_pair(body, settings, previous_plan)
    if pair.missing is not None:
        return pair.missing
    violations = validate_plan(pair.request, pair.plan)
    return ValidateResult(valid=not violations, violations=violations)
