"""The stored documents a plan request may name by id instead of carrying them: the
previous plan (``options.previous_plan_id``) and the device profile
(``options.device_profile_id``). ``with_stored_references`` inlines both before a request
is solved, checked or queued, so the solver only ever sees whole requests, a job's stored
request needs nothing else to be solved again, and an unknown id is a 422 at once rather
than a failed job. The request hash is the same either way (``plan.codec``)."""

from __future__ import annotations

from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from planner_service.plan.codec import parse_plan, parse_profile
from planner_service.plan.errors import FieldProblem, InputError, problems_from_validation_error
from planner_service.plan.types import DeviceProfile, PlanOptions, PlanRequest
from planner_service.service.state import ServiceState


async def with_stored_references(state: ServiceState, request: PlanRequest) -> PlanRequest:
    """``request`` with what its ids name inlined: the stored plan its
    ``options.previous_plan_id`` names as ``options.previous_plan``, and the stored profile
    its ``options.device_profile_id`` names as ``options.device_profile`` (checked against
    the topology's device as an inline one is). 422 naming the field when no such plan or
    profile is stored, or the profile is for another kind of device."""
    request = await _with_previous_plan(state, request)
    return await _with_profile(state, request)


async def _with_previous_plan(state: ServiceState, request: PlanRequest) -> PlanRequest:
    options = request.options
    plan_id = options.previous_plan_id
    if plan_id is None or options.previous_plan is not None:
        return request
    data = await state.plan_bytes(plan_id)
    if data is None:
        raise unknown_previous_plan(plan_id, "options.previous_plan_id")
    return with_previous_plan(request, data)


def unknown_previous_plan(plan_id: str, path: str) -> InputError:
    """The 422 for a ``previous_plan_id`` (at ``path`` in the body) that no stored plan has."""
    problem = FieldProblem(
        path,
        f"no plan with plan_id {plan_id} is stored here; give the plan_id of a stored "
        "plan (GET /v1/plans lists them), or the plan itself as options.previous_plan",
        plan_id,
    )
    return InputError("body", [problem])


def with_previous_plan(request: PlanRequest, stored: bytes) -> PlanRequest:
    """``request`` with the stored plan its ``options.previous_plan_id`` names inline (the
    store holds only plans checked when stored: they are not checked again)."""
    options = request.options
    previous = parse_plan(stored, source=f"stored plan {options.previous_plan_id}")
    return request.model_copy(
        update={"options": options.model_copy(update={"previous_plan": previous})}
    )


async def _with_profile(state: ServiceState, request: PlanRequest) -> PlanRequest:
    options = request.options
    profile_id = options.device_profile_id
    if profile_id is None or options.device_profile is not None:
        return request
    stored = await run_in_threadpool(lambda: state.store().profiles.get(profile_id))
    if stored is None:
        problem = FieldProblem(
            "options.device_profile_id",
            f"no device profile with profile_id {profile_id} is stored here; PUT it to "
            f"/v1/profiles/{profile_id} first (shardplan profile put FILE), or give the "
            "profile itself as options.device_profile",
            profile_id,
        )
        raise InputError("body", [problem])
    profile = parse_profile(stored.profile, source=f"stored profile {profile_id}")
    return _with_profile_inline(request, profile)


def _with_profile_inline(request: PlanRequest, profile: DeviceProfile) -> PlanRequest:
    """The request validated again with ``profile`` inline: its checks that need the
    profile itself (the topology's device) run as for a profile sent inline."""
    try:
        options = PlanOptions.model_validate({**dict(request.options), "device_profile": profile})
        return PlanRequest.model_validate({**dict(request), "options": options})
    except ValidationError as error:
        raise InputError("body", problems_from_validation_error(error, PlanRequest)) from None
