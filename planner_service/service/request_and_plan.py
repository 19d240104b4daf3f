"""A request and a plan sent in one body (``POST /v1/validate``, ``PUT /v1/plans/{plan_id}``):
decoded within the service's limits, with the stored previous plan the request names by id
alone (``options.previous_plan_id``) inlined, so that the validator recomputes the plan's
migration from that plan's shards instead of comparing ids only (issue 36, item 8).

Which plan to read is known only once the body is decoded, and decoding runs in the CPU
lane; the store is read on the event loop's side. So a check runs twice when the request
names a stored plan: first it answers ``NeedsPreviousPlan`` (nothing validated), then, with
that plan's bytes, its result. A ``previous_plan_id`` that no stored plan has is a 422
naming ``request.options.previous_plan_id`` and its value, as for ``POST /v1/plans``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from planner_service.plan.types import PlanRequest, ShardingPlan
from planner_service.service.http.limits import decode_request_and_plan
from planner_service.service.settings import Settings
from planner_service.service.solver.references import unknown_previous_plan, with_previous_plan
from planner_service.service.state import ServiceState

PREVIOUS_PLAN_ID_PATH = "request.options.previous_plan_id"

T = TypeVar("T")


@dataclass(frozen=True)
class NeedsPreviousPlan:
    """A check's answer when its request names a stored previous plan by id alone and it
    was not given that plan: read ``plan_id`` from the store and run the check again."""

    plan_id: str


@dataclass(frozen=True)
class DecodedPair:
    """Both documents, the request with its previous plan inline when it had one or was
    given the stored one; ``missing`` says which stored plan is still to be read."""

    request: PlanRequest
    plan: ShardingPlan
    missing: NeedsPreviousPlan | None


def decode_pair(body: bytes, settings: Settings, previous_plan: bytes | None) -> DecodedPair:
    """Runs in a CPU-lane worker: ``body`` decoded within ``settings``' limits, with
    ``previous_plan`` (the stored plan's bytes, when read) inline in the request."""
    request, plan = decode_request_and_plan(body, settings)
    options = request.options
    wanted = options.previous_plan_id if options.previous_plan is None else None
    if wanted is None:
        return DecodedPair(request, plan, None)
    if previous_plan is None:
        return DecodedPair(request, plan, NeedsPreviousPlan(wanted))
    return DecodedPair(with_previous_plan(request, previous_plan), plan, None)


async def checked_with_previous_plan(
    state: ServiceState, check: Callable[..., T | NeedsPreviousPlan], *args: object
) -> T:
    """``check(*args, previous_plan)`` in the CPU lane: first with no previous plan, then,
    when it answers ``NeedsPreviousPlan``, with the stored plan's bytes (422 naming
    ``request.options.previous_plan_id`` when no such plan is stored)."""
    checked = await state.cpu.run(check, *args, None)
    if not isinstance(checked, NeedsPreviousPlan):
        return checked
    previous_plan = await state.plan_bytes(checked.plan_id)
    if previous_plan is None:
        raise unknown_previous_plan(checked.plan_id, PREVIOUS_PLAN_ID_PATH)
    again = await state.cpu.run(check, *args, previous_plan)
    if isinstance(again, NeedsPreviousPlan):  # decode_pair inlines what it is given
        raise AssertionError(f"check {check.__name__} asked again for plan {again.plan_id}")
    return again
