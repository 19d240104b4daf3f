"""POST /v1/validate: a request and a plan in, every violation out."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from planner_service.api.schemas import json_body
from planner_service.api.state import reader
from planner_service.codec import load_json, parse_plan, parse_request
from planner_service.errors import FieldProblem, InputError
from planner_service.types import PlanRequest, ShardingPlan, Violation
from planner_service.validator import validate_plan

router = APIRouter(tags=["plans"])


class ValidateBody(BaseModel):
    request: PlanRequest
    plan: ShardingPlan


class ValidateResult(BaseModel):
    valid: bool
    violations: list[Violation]


@router.post(
    "/v1/validate",
    response_model=ValidateResult,
    dependencies=[Depends(reader)],
    openapi_extra=json_body(ValidateBody),
)
async def validate(http_request: Request) -> Any:
    """Check ``plan`` against ``request``; 200 with every violation (empty when valid)."""
    request, plan = _decode(await http_request.body())
    violations = validate_plan(request, plan)
    result = ValidateResult(valid=not violations, violations=violations)
    return JSONResponse(result.model_dump(mode="json"))


def _decode(body: bytes) -> tuple[PlanRequest, ShardingPlan]:
    document = load_json(body, source="body")
    if not isinstance(document, dict) or set(document) != {"request", "plan"}:
        problem = FieldProblem(
            "", 'expected a JSON object with exactly the keys "request" and "plan"'
        )
        raise InputError("body", [problem])
    request = parse_request(json.dumps(document["request"]), source="request")
    plan = parse_plan(json.dumps(document["plan"]), source="plan")
    return request, plan
