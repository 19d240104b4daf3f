"""A plan request as the event loop holds it: decoded, checked against the service's
limits, hashed and made canonical in a CPU-lane worker (``cpu.py``), so the loop keeps
only bytes, the hash and the few fields it routes on.

Decoding is about 1 s per MiB of request (a 200,000-shard ``previous_plan``: 9 s), and
hashing and canonical bytes as much again; on the event loop that stalled every other
request, /healthz and the job leases with it (issue 36). The worker's answer crosses a
pipe as bytes, which costs a copy, not a decode.

``received_at`` starts the request's clock: decoding, inlining what it names and parsing
it in the solver process all count against ``options.time_limit_s`` (``spent_s``), so a
solve's answer comes within the time limit and its finishing slack however large the
request (``solve/deadline.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from pydantic import ValidationError

from planner_service.plan.canonical import canonical_bytes
from planner_service.plan.codec import parse_plan, parse_profile, request_hash
from planner_service.plan.errors import InputError, problems_from_validation_error
from planner_service.plan.types import DeviceProfile, PlanOptions, PlanRequest
from planner_service.service.http.limits import decode_plan_request
from planner_service.service.settings import Settings


@dataclass(frozen=True)
class DecodedRequest:
    """A request within the limits, as canonical bytes with what routes and the pool need.
    ``previous_plan_id`` and ``device_profile_id`` are set while what they name is still to
    be inlined (``references.py``)."""

    document: bytes
    request_hash: str
    time_limit_s: float
    received_at: float  # time.monotonic() when the body was whole (or the job resumed)
    previous_plan_id: str | None = None
    device_profile_id: str | None = None
    wait_counts: bool = True  # waiting for a solver process counts against the limit

    @classmethod
    def stored(cls, document: bytes, key: str, time_limit_s: float) -> DecodedRequest:
        """A request stored whole (a job's): canonical, its references inlined already."""
        return cls(document, key, time_limit_s, time.monotonic())

    def restarted(self) -> DecodedRequest:
        """The request with its clock started now: an async job's time limit bounds its
        solve from when the job starts, not the 202 that accepted it (nor its wait for a
        solver process)."""
        return replace(self, received_at=time.monotonic(), wait_counts=False)

    @property
    def spent_s(self) -> float:
        """How much of the time limit this request has used so far."""
        return time.monotonic() - self.received_at

    @property
    def complete(self) -> bool:
        """Whether nothing it names by id is still to be inlined."""
        return self.previous_plan_id is None and self.device_profile_id is None


def decode(body: bytes, settings: Settings, received_at: float) -> DecodedRequest:
    """Runs in a CPU-lane worker: a request body decoded within ``settings``' limits."""
    request = decode_plan_request(body, settings)
    return _decoded(request, request_hash(request), received_at)


def parse(decoded: DecodedRequest) -> PlanRequest:
    """Runs in a CPU-lane worker: the request itself, for work that needs more than bytes."""
    return request_of(decoded.document)


def request_of(document: bytes) -> PlanRequest:
    """The request in canonical bytes this service made from one it decoded and checked
    (``decode``; a job's stored request), read in one pass: ``parse_request``'s first pass
    looks for duplicate keys and deep nesting, which canonical bytes cannot have, and took
    a quarter of the 2.0 s that reading a 19 MiB request of 100,000 tables took."""
    return PlanRequest.model_validate_json(document)


def inline(
    decoded: DecodedRequest, previous_plan: bytes | None, profile: bytes | None
) -> DecodedRequest:
    """Runs in a CPU-lane worker: ``decoded`` with the stored plan and profile its ids name
    inlined (the bytes ``references.py`` read), the profile checked against the topology's
    device as an inline one is. The hash stays: it is the same either way."""
    request = parse(decoded)
    options = request.options
    if previous_plan is not None:
        plan = parse_plan(previous_plan, source=f"stored plan {options.previous_plan_id}")
        options = options.model_copy(update={"previous_plan": plan})
        request = request.model_copy(update={"options": options})
    if profile is not None:
        stored = parse_profile(profile, source=f"stored profile {options.device_profile_id}")
        request = _with_profile(request, stored)
    inlined = _decoded(request, decoded.request_hash, decoded.received_at)
    return replace(inlined, wait_counts=decoded.wait_counts)


def _with_profile(request: PlanRequest, profile: DeviceProfile) -> PlanRequest:
    """The request validated again with ``profile`` inline: its checks that need the
    profile itself (the topology's device) run as for a profile sent inline."""
    try:
        options = PlanOptions.model_validate({**dict(request.options), "device_profile": profile})
        return PlanRequest.model_validate({**dict(request), "options": options})
    except ValidationError as error:
        raise InputError("body", problems_from_validation_error(error, PlanRequest)) from None


def _decoded(request: PlanRequest, key: str, received_at: float) -> DecodedRequest:
    options = request.options
    named_plan = options.previous_plan_id if options.previous_plan is None else None
    named_profile = options.device_profile_id if options.device_profile is None else None
    return DecodedRequest(
        canonical_bytes(request),
        key,
        options.time_limit_s,
        received_at,
        previous_plan_id=named_plan,
        device_profile_id=named_profile,
    )
