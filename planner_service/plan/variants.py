"""The same request on another cluster: the what-if variants that capacity planning asks
about (``shardplan check``'s sweep and least world size) and that the planner's own fix
search tries (``solve/explain.py``)."""

from __future__ import annotations

import json

from planner_service.plan.canonical import canonical_bytes
from planner_service.plan.codec import parse_request
from planner_service.plan.types import PlanRequest


def with_topology(request: PlanRequest, **fields: object) -> PlanRequest:
    """``request`` with these topology fields replaced (``world_size=16``,
    ``hbm_bytes=...``), validated as a user's file is: a combination the format refuses is
    an ``InputError`` naming the field. Everything else, rank overrides included, stays."""
    return _changed(request, "topology", fields)


def with_constraints(request: PlanRequest, **fields: object) -> PlanRequest:
    """``request`` with these constraints replaced (``hbm_headroom_fraction=0.2``)."""
    return _changed(request, "constraints", fields)


def _changed(request: PlanRequest, section: str, fields: dict[str, object]) -> PlanRequest:
    data = json.loads(request.model_dump_json())
    data[section].update(fields)
    return parse_request(canonical_bytes(data), source="what-if request")


def resized(request: PlanRequest, world_size: int) -> PlanRequest:
    """``request`` on ``world_size`` ranks of the same devices: whole hosts of its
    ``local_world_size`` (ranks per host), or, below that, one host of ``world_size``."""
    local = min(request.topology.num_local_ranks, world_size)
    return with_topology(request, world_size=world_size, local_world_size=local)
