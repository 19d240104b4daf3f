"""POST /v1/validate: a request and a plan in, every violation out."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from planner_service.plan.codec import load_json, parse_plan, parse_request
from planner_service.plan.errors import FieldProblem, InputError
from planner_service.plan.types import PlanRequest, ShardingPlan, Violation
from planner_service.service.deps import State, reader
from planner_service.service.limits import tables_limit, world_size_limit
from planner_service.service.schemas import json_body
from planner_service.service.settings import Settings
from planner_service.validate.validator import validate_plan

router = APIRouter(tags=["plans"])

M = TypeVar("M")


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
async def validate(http_request: Request, state: State) -> Any:
    """Check ``plan`` against ``request``; 200 with every violation (empty when valid)."""
    body = await http_request.body()
    # Decoding and checking take time in proportion to the plan: off the event loop.
    return JSONResponse(await state.cpu.run(_validate_body, body, state.settings))


def _validate_body(body: bytes, settings: Settings) -> dict[str, Any]:
    request, plan = _decode(body, settings)
    violations = validate_plan(request, plan)
    return ValidateResult(valid=not violations, violations=violations).model_dump(mode="json")


def _decode(body: bytes, settings: Settings) -> tuple[PlanRequest, ShardingPlan]:
    """Both documents, within the service's limits; every problem in either is reported at
    once, by its path in the body (``request.tables[0].name``, ``plan.world_size``)."""
    document = load_json(body, source="body")
    if not isinstance(document, dict) or set(document) != {"request", "plan"}:
        problem = FieldProblem(
            "", 'expected a JSON object with exactly the keys "request" and "plan"'
        )
        raise InputError("body", [problem])
    raw_request = document["request"]
    raw_tables = raw_request.get("tables") if isinstance(raw_request, dict) else None
    too_many = tables_limit(raw_tables, settings, path="request.tables")
    if too_many is not None:
        raise InputError("body", [too_many])
    problems: list[FieldProblem] = []
    request = _part(parse_request, document, "request", problems)
    plan = _part(parse_plan, document, "plan", problems)
    if request is not None:
        world = request.topology.world_size
        problems += world_size_limit("request.topology.world_size", world, settings)
    if plan is not None:
        problems += world_size_limit("plan.world_size", plan.world_size, settings)
    if problems or request is None or plan is None:
        raise InputError("body", problems)
    return request, plan


def _part(
    parse: Callable[..., M], document: dict[str, Any], key: str, problems: list[FieldProblem]
) -> M | None:
    """``document[key]`` parsed, or None with its problems added under ``key``."""
    try:
        return parse(json.dumps(document[key]), source=key)
    except InputError as error:
        problems += [
            dataclasses.replace(problem, path=_under(key, problem.path))
            for problem in error.problems
        ]
        return None


def _under(key: str, path: str) -> str:
    if not path:
        return key
    return f"{key}{path}" if path.startswith("[") else f"{key}.{path}"
