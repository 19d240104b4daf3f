"""A fetched plan must be what its id names: the sha256 of its content is computed again
and compared with the plan's own ``plan_id`` and with the id that was asked for (asked for
by a prefix, the plan's id must start with it). So must a
fetched device profile (``verified_profile``): its content address (the sha256 of its
canonical JSON) is computed again and compared with the ``profile_id`` asked for.

A plan as the service sends it is the planner's canonical JSON: the sealed content with
one ``"plan_id":"<id>"`` member put in. Cutting that member out and hashing what is left
checks such bytes in one pass over them (sha256 at C speed, no parsing): if the hash is the
id, the rest is byte for byte what the planner sealed (so no duplicate keys, no deep
nesting), and only the model needs reading. Bytes that are not so, from another writer or
damaged, take the general path: parse with every guard, hash the parsed content.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import re
from collections.abc import Iterator

from pydantic import ValidationError

from clients.http.errors import IntegrityError
from planner_service.plan.canonical import plan_id_of
from planner_service.plan.codec import parse_plan_document, parse_profile, remember_plan_bytes
from planner_service.plan.errors import InputError
from planner_service.plan.plan_ids import is_full_plan_id
from planner_service.plan.schema_version import check_schema_version
from planner_service.plan.types import DeviceProfile, ShardingPlan, profile_id_of

PLAN_ID = re.compile(r"[0-9a-f]{64}")
# A member named plan_id: a key's opening quote is never escaped, one inside a string is.
_PLAN_ID_MEMBER = re.compile(rb'"plan_id":"([0-9a-f]{64})"')


def content_address(plan: ShardingPlan) -> str:
    """What ``plan_id`` must be: the sha256 of the plan's canonical content."""
    return plan_id_of(plan.model_dump(mode="json"))


def sealed_plan(data: bytes) -> ShardingPlan | None:
    """The plan in ``data`` when ``data`` is the planner's canonical JSON of it: one
    ``plan_id`` member, the rest hashing to that id, and a readable plan of that id; None
    otherwise (the caller checks such bytes the general way)."""
    members = _PLAN_ID_MEMBER.findall(data)
    if len(members) != 1:
        return None
    match = _PLAN_ID_MEMBER.search(data)
    assert match is not None
    start, end = match.span()
    if data[end : end + 1] != b",":  # sorted keys put plan_id before planner_version
        return None
    end += 1
    claimed = members[0].decode()
    if hashlib.sha256(data[:start] + data[end:]).hexdigest() != claimed:
        return None
    try:
        with _no_cyclic_gc():
            plan = ShardingPlan.model_validate_json(data)
        check_schema_version(plan.schema_version)
    except (ValidationError, InputError):
        return None  # the general path says what is wrong
    if plan.plan_id != claimed:  # the member was not the plan's own
        return None
    # These are the canonical bytes (what the id hashes, the id in front): storing or
    # passing the plan on (load_plan broadcasts it) need not serialise it again.
    remember_plan_bytes(plan, data)
    return plan


def verified_plan(data: bytes, *, source: str, expected_plan_id: str | None) -> ShardingPlan:
    """The plan in ``data``, or IntegrityError when it cannot be read, its content does not
    hash to its ``plan_id``, or that is not ``expected_plan_id`` (a whole id, or a prefix
    the plan's id must start with)."""
    plan = sealed_plan(data)
    if plan is not None:
        _check_expected(plan, source, expected_plan_id)
        return plan
    try:
        with _no_cyclic_gc():
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
    _check_expected(plan, source, expected_plan_id)
    return plan


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Python's cyclic garbage collector paused while a plan is read: reading one makes
    tens of thousands of objects, none of them garbage, and each collection they set off
    walks every object the process holds. Measured on the 1 MB plan with eight plans
    already held: 94 ms to read it with collections, 29 ms without. Left paused if the
    process had paused it; another thread reading at the same time may resume it early,
    which costs time, not correctness."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _check_expected(plan: ShardingPlan, source: str, expected_plan_id: str | None) -> None:
    """The plan is the one asked for: its id is ``expected_plan_id``, or starts with it when
    that is a prefix (a whole id starts only with itself)."""
    if expected_plan_id is not None and not plan.plan_id.startswith(expected_plan_id):
        asked = (
            f"plan {expected_plan_id}"
            if is_full_plan_id(expected_plan_id)
            else f"a plan whose id starts with {expected_plan_id}"
        )
        raise IntegrityError(
            f"{source}: asked for {asked}, got plan {plan.plan_id}",
            expected_plan_id=expected_plan_id,
            plan_id=plan.plan_id,
        )


def verified_profile(data: bytes, *, source: str, expected_profile_id: str) -> DeviceProfile:
    """The device profile in ``data``, or IntegrityError when it cannot be read (every
    guard of ``parse_profile``) or its content address is not ``expected_profile_id``."""
    try:
        profile = parse_profile(data, source=source)
    except InputError as error:
        raise IntegrityError(
            f"{source}: the answer is not a readable device profile: {error}",
            expected_plan_id=None,
            plan_id=None,
            expected_profile_id=expected_profile_id,
        ) from None
    computed = profile_id_of(profile)
    if computed != expected_profile_id:
        raise IntegrityError(
            f"{source}: asked for profile {expected_profile_id}, but the content received "
            f"hashes to {computed}: it was changed or damaged on the way or in the store",
            expected_plan_id=None,
            plan_id=None,
            expected_profile_id=expected_profile_id,
            profile_id=computed,
        )
    return profile
