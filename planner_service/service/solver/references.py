"""The stored documents a plan request may name by id instead of carrying them: the
previous plan (``options.previous_plan_id``) and the device profile
(``options.device_profile_id``). ``with_stored_references`` inlines both before a request
is solved, checked or queued, so the solver only ever sees whole requests, a job's stored
request needs nothing else to be solved again, and an unknown id is a 422 at once rather
than a failed job. The request hash is the same either way (``plan.codec``). The store is
read in a thread and the documents are parsed in the CPU lane (``decoded.py``): a stored
plan can be megabytes."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

from planner_service.plan.codec import parse_plan
from planner_service.plan.errors import FieldProblem, InputError
from planner_service.plan.types import PlanRequest
from planner_service.service.solver.decoded import DecodedRequest, decode, inline
from planner_service.service.state import ServiceState

SMALL_BODY_BYTES = 64 * 1024


async def decode_request(state: ServiceState, body: bytes, received_at: float) -> DecodedRequest:
    """A request body decoded within the service's limits; its clock
    (``DecodedRequest.spent_s``) started at ``received_at``. A body of up to
    ``SMALL_BODY_BYTES`` is decoded here on the event loop (8 ms for 64 KiB, a request of
    about 300 tables), so that it never waits for the CPU lane (a fresh service's workers
    took over 2 s to start on a loaded machine, more than a 2 s time limit); a larger one
    in the CPU lane, off the loop."""
    if len(body) <= SMALL_BODY_BYTES:
        return decode(body, state.settings, received_at)
    return await state.cpu.run(decode, body, state.settings, received_at)


async def with_stored_references(state: ServiceState, request: DecodedRequest) -> DecodedRequest:
    """``request`` with what its ids name inlined: the stored plan its
    ``options.previous_plan_id`` names as ``options.previous_plan``, and the stored profile
    its ``options.device_profile_id`` names as ``options.device_profile`` (checked against
    the topology's device as an inline one is). 422 naming the field when no such plan or
    profile is stored, or the profile is for another kind of device."""
    if request.complete:
        return request
    previous_plan = await _previous_plan(state, request.previous_plan_id)
    profile = await _profile(state, request.device_profile_id)
    return await state.cpu.run(inline, request, previous_plan, profile)


async def _previous_plan(state: ServiceState, plan_id: str | None) -> bytes | None:
    if plan_id is None:
        return None
    data = await state.plan_bytes(plan_id)
    if data is None:
        raise unknown_previous_plan(plan_id, "options.previous_plan_id")
    return data


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


async def _profile(state: ServiceState, profile_id: str | None) -> bytes | None:
    if profile_id is None:
        return None
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
    return stored.profile
