"""Device profiles: PUT /v1/profiles/{profile_id} (store a profile ``shardplan calibrate``
measured, at its content address) and GET /v1/profiles/{profile_id} (its stored bytes,
immutable and cacheable), so that plan requests can name a profile by
``options.device_profile_id`` instead of carrying it."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from planner_service.plan.canonical import canonical_bytes
from planner_service.plan.codec import parse_profile
from planner_service.plan.errors import FieldProblem, InputError
from planner_service.plan.types import DeviceProfile, profile_id_of
from planner_service.service.deps import ProfileId, State, Writer, reader
from planner_service.service.http.openapi import JsonObject, json_body, schema_ref
from planner_service.service.http.problems import PROBLEM_CONTENT, ProblemError
from planner_service.service.http.responses import IMMUTABLE, JSON, etag_matches

router = APIRouter(tags=["profiles"])

PROFILE_RESPONSE: JsonObject = {"content": {JSON: {"schema": schema_ref(DeviceProfile)}}}


@router.put(
    "/v1/profiles/{profile_id}",
    status_code=201,
    openapi_extra=json_body(DeviceProfile),
    responses={
        200: {"description": "this profile was already stored", **PROFILE_RESPONSE},
        201: {"description": "checked and stored", **PROFILE_RESPONSE},
        422: {
            "description": "not a valid profile (every bad field named, with its value and "
            "bound), or its content address is not the path's profile_id",
            **PROBLEM_CONTENT,
        },
    },
)
async def put_profile(
    profile_id: ProfileId, http_request: Request, state: State, actor: Writer
) -> Response:
    """Store a device profile at its content address: the sha256 of its canonical JSON,
    computed again here, must be the path's ``profile_id``. The body is read as plan
    requests are (no duplicate keys, NaN or infinite numbers, deep nesting), and every
    coefficient must lie within its bound. Storing is idempotent: 201 the first time, 200
    after; the body is the stored canonical bytes either way. Nothing is stored on a
    refusal."""
    del actor
    profile = parse_profile(await http_request.body(), source="body")
    actual = profile_id_of(profile)
    if actual != profile_id:
        raise _not_its_address(profile_id, actual)
    data = canonical_bytes(profile)
    store = state.store()
    inserted = await run_in_threadpool(
        lambda: store.profiles.put(
            profile_id=actual, compute_device=profile.compute_device, profile=data
        )
    )
    return _profile_response(actual, data, status=201 if inserted else 200)


@router.get(
    "/v1/profiles/{profile_id}",
    dependencies=[Depends(reader)],
    responses={
        200: {"description": "the profile's stored canonical bytes", **PROFILE_RESPONSE},
        304: {"description": "If-None-Match matched: the client's copy is current"},
        404: {"description": "no such profile", **PROBLEM_CONTENT},
    },
)
async def get_profile(profile_id: ProfileId, http_request: Request, state: State) -> Response:
    """The stored profile, byte for byte (canonical JSON: its sha256 is the
    ``profile_id``). Profiles never change: ``ETag`` is the profile_id, ``If-None-Match``
    with it gives 304, and responses may be cached forever."""
    stored = await run_in_threadpool(lambda: state.store().profiles.get(profile_id))
    if stored is None:
        raise ProblemError(
            404,
            f"no device profile with profile_id {profile_id} is stored here; PUT it first "
            "(shardplan profile put FILE)",
        )
    if etag_matches(http_request.headers.get("if-none-match"), profile_id):
        return Response(status_code=304, headers=_headers(profile_id))
    return _profile_response(profile_id, stored.profile, status=200)


def _profile_response(profile_id: str, data: bytes, *, status: int) -> Response:
    headers = {"Location": f"/v1/profiles/{profile_id}", **_headers(profile_id)}
    return Response(data, status_code=status, media_type=JSON, headers=headers)


def _headers(profile_id: str) -> dict[str, str]:
    return {"ETag": f'"{profile_id}"', "Cache-Control": IMMUTABLE}


def _not_its_address(path_id: str, actual: str) -> InputError:
    message = (
        f"the path names profile {path_id}, but this profile's content address (the sha256 "
        f"of its canonical JSON) is {actual}; PUT it at /v1/profiles/{actual}"
    )
    return InputError("body", [FieldProblem("profile_id", message, path_id)])
