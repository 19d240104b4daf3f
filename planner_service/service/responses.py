"""Plan responses the routes build themselves (stored bytes, sent as they are): the media
type, caching and conditional requests, and how the OpenAPI document describes them."""

from __future__ import annotations

from typing import Any

from planner_service.plan.types import ShardingPlan
from planner_service.service.schemas import schema_ref

JSON = "application/json"
IMMUTABLE = "public, max-age=31536000, immutable"
PLAN_RESPONSE: dict[str, Any] = {"content": {JSON: {"schema": schema_ref(ShardingPlan)}}}


def etag_matches(if_none_match: str | None, plan_id: str) -> bool:
    """RFC 9110 If-None-Match: ``*`` or any listed entity tag (weak or strong) equal to ours."""
    if not if_none_match:
        return False
    for tag in if_none_match.split(","):
        tag = tag.strip()
        if tag == "*" or tag.removeprefix("W/").strip('"') == plan_id:
            return True
    return False
