"""Responses the routes build themselves: plans (stored bytes, sent as they are) with their
media type, caching and conditional requests; solve jobs with their ``Location`` and poll
interval; and how the OpenAPI document describes both."""

from __future__ import annotations

import re

from starlette.responses import Response

from planner_service.plan.api import SolveJob
from planner_service.plan.encodings import CODINGS, GZIP, IDENTITY
from planner_service.plan.types import ShardingPlan
from planner_service.service.http.openapi import JsonObject, schema_ref

JSON = "application/json"
IMMUTABLE = "public, max-age=31536000, immutable"
NO_CACHE = "no-cache"  # may be stored, but revalidated before each use
# On every answer that serves an imported plan (PUT, fetches by id, prefix or alias): its
# solver report (status, lower bound, gap) is the importer's word, unverified here.
SOLVER_REPORT_HEADER = "X-Shardplan-Solver-Report"
UNVERIFIED = "unverified"
PLAN_RESPONSE: JsonObject = {"content": {JSON: {"schema": schema_ref(ShardingPlan)}}}


def job_content() -> JsonObject:
    """How the OpenAPI document describes a response that is a solve job. Registered when
    a route first asks (not on import, as ``PLAN_RESPONSE``), so ``SolveJob`` keeps its
    place among the document's schemas, which follow the order of registration."""
    return {"content": {JSON: {"schema": schema_ref(SolveJob)}}}


def job_response(job: SolveJob, *, status: int, headers: dict[str, str] | None = None) -> Response:
    """A solve job as JSON, with its ``Location`` and, until it ends, ``Retry-After: 1``
    (RFC 9110: a poll interval for the job)."""
    headers = {"Location": f"/v1/solves/{job.job_id}", **(headers or {})}
    if not job.status.ended:
        headers["Retry-After"] = "1"
    return Response(job.model_dump_json(), status_code=status, media_type=JSON, headers=headers)


# RFC 9110 §12.4.2: a qvalue is 0 to 1 with at most three decimals.
_QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?")


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """RFC 9110 If-None-Match: ``*`` or any listed entity tag (weak or strong) whose
    opaque tag is ``etag`` (given without its quotes)."""
    if not if_none_match:
        return False
    for tag in if_none_match.split(","):
        tag = tag.strip()
        if tag == "*" or tag.removeprefix("W/").strip('"') == etag:
            return True
    return False


def negotiate_encoding(accept_encoding: str | None) -> str | None:
    """The content coding to send for RFC 9110 §12.5.3's ``Accept-Encoding``: the stored
    coding (zstd, gzip) the client weighs highest, zstd on a tie, when it is acceptable
    (q > 0) and weighed at least as high as identity (identity named by neither itself
    nor ``*`` is the last resort); else ``identity`` unless that is refused
    (``identity;q=0``, or ``*;q=0`` without an ``identity`` entry); None when nothing is
    acceptable. No header: identity. Codings are compared case-insensitively; ``x-gzip``
    is ``gzip``; unknown codings and entries with an unreadable qvalue are ignored."""
    if accept_encoding is None:
        return IDENTITY
    weights: dict[str, float] = {}
    for entry in accept_encoding.split(","):
        coding, *parameters = (part.strip() for part in entry.split(";"))
        coding = coding.lower()
        if not coding:
            continue
        weight: float | None = 1.0
        for parameter in parameters:
            name, _, value = parameter.partition("=")
            if name.strip().lower() == "q":
                value = value.strip()
                weight = float(value) if _QVALUE.fullmatch(value) else None
        if weight is not None:
            coding = GZIP if coding == "x-gzip" else coding
            weights[coding] = max(weight, weights.get(coding, 0.0))
    anything = weights.get("*")
    best, best_weight = None, 0.0
    for coding in CODINGS:
        weight = weights.get(coding, anything if anything is not None else 0.0)
        if weight > best_weight:
            best, best_weight = coding, weight
    identity = weights.get(IDENTITY, anything)
    if identity is None:  # not named: acceptable, but only when nothing better is
        return best or IDENTITY
    if best is not None and best_weight >= identity:
        return best
    if identity > 0:
        return IDENTITY
    return None
