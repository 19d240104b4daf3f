"""Plan responses the routes build themselves (stored bytes, sent as they are): the media
type, caching and conditional requests, and how the OpenAPI document describes them."""

from __future__ import annotations

import re
from typing import Any

from planner_service.plan.types import ShardingPlan
from planner_service.service.schemas import schema_ref

JSON = "application/json"
IMMUTABLE = "public, max-age=31536000, immutable"
PLAN_RESPONSE: dict[str, Any] = {"content": {JSON: {"schema": schema_ref(ShardingPlan)}}}


IDENTITY = "identity"
GZIP = "gzip"
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


def plan_etag(plan_id: str, encoding: str) -> str:
    """The opaque tag of one representation of a plan: the plan_id for its identity bytes,
    ``<plan_id>-gzip`` for their gzip encoding (RFC 9110 §8.8.3: a strong tag differs
    between representations)."""
    return plan_id if encoding == IDENTITY else f"{plan_id}-{encoding}"


def negotiate_encoding(accept_encoding: str | None) -> str | None:
    """The content coding to send for RFC 9110 §12.5.3's ``Accept-Encoding``: ``gzip`` when
    it is acceptable (q > 0) and weighed at least as high as identity (it is the smaller
    body; identity named by neither itself nor ``*`` is the last resort), else
    ``identity`` unless that is refused (``identity;q=0``, or ``*;q=0`` without an
    ``identity`` entry); None when neither is acceptable. No header: identity. Codings are
    compared case-insensitively; ``x-gzip`` is ``gzip``; unknown codings and entries with
    an unreadable qvalue are ignored."""
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
    gzip = weights.get(GZIP, anything if anything is not None else 0.0)
    identity = weights.get(IDENTITY, anything)
    if identity is None:  # not named: acceptable, but only when nothing better is
        return GZIP if gzip > 0 else IDENTITY
    if gzip > 0 and gzip >= identity:
        return GZIP
    if identity > 0:
        return IDENTITY
    return None
