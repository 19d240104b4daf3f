"""A fetched plan must be what its id names: the sha256 of its content is computed again
and compared with the plan's own ``plan_id`` and with the id that was asked for."""

from __future__ import annotations

import re

from clients.http.errors import IntegrityError
from planner_service.plan.codec import parse_plan_document, plan_id_of
from planner_service.plan.errors import InputError
from planner_service.plan.types import ShardingPlan

PLAN_ID = re.compile(r"[0-9a-f]{64}")


def content_address(plan: ShardingPlan) -> str:
    """What ``plan_id`` must be: the sha256 of the plan's canonical content."""
    return plan_id_of(plan.model_dump(mode="json"))


def verified_plan(data: bytes, *, source: str, expected_plan_id: str | None) -> ShardingPlan:
    """The plan in ``data``, or IntegrityError when it cannot be read, its content does not
    hash to its ``plan_id``, or that is not ``expected_plan_id``."""
    try:
        plan, document = parse_plan_document(data, source=source)
    except InputError as error:
        raise IntegrityError(
            f"{source}: the answer is not a readable plan: {error}",
            expected_plan_id=expected_plan_id,
            plan_id=None,
        ) from None
    computed = plan_id_of(document)  # the content as received, not as the model reads it
    if computed != plan.plan_id:
        raise IntegrityError(
            f"{source}: the plan says plan_id {plan.plan_id} but its content hashes to "
            f"{computed}: it was changed or damaged after the planner sealed it",
            expected_plan_id=expected_plan_id,
            plan_id=plan.plan_id,
        )
    if expected_plan_id is not None and plan.plan_id != expected_plan_id:
        raise IntegrityError(
            f"{source}: asked for plan {expected_plan_id}, got plan {plan.plan_id}",
            expected_plan_id=expected_plan_id,
            plan_id=plan.plan_id,
        )
    return plan
