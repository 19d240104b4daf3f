"""A stored plan as the client hands it out, with what the service says of its solver
report (status, lower bound, gap): the planner's own, or the word of whoever imported the
plan (``PUT /v1/plans/{plan_id}``), which the service recomputed the costs of but could not
verify the bound and gap of. The service says the latter with
``X-Shardplan-Solver-Report: unverified`` on every answer that serves an imported plan
(200, 304, by id, prefix or alias, and the PUT itself); the disk cache keeps the mark beside
the plan (``cache.py``), so a plan read back from it is said unverified as when fetched.

Imports no httpx: the cache, which reads plans without the network, uses it too.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from planner_service.plan.types import ShardingPlan

SOLVER_REPORT_HEADER = "x-shardplan-solver-report"
UNVERIFIED = "unverified"


class FetchedPlan(BaseModel):
    """A plan from the service (verified: it hashes to its id) and whether the service
    vouches for its solver report."""

    model_config = ConfigDict(frozen=True)

    plan: ShardingPlan
    solver_report_verified: bool = Field(
        description="False for a plan imported into the service: its solver status, lower "
        "bound and gap are the importer's word, unverified (its costs were recomputed when "
        "it was stored); True for the service's planner's own plan"
    )


def solver_report_verified(headers: Mapping[str, str]) -> bool:
    """What an answer's headers say of its plan's solver report: unverified only when the
    service says so (an answer about the planner's own plan carries no such header)."""
    return headers.get(SOLVER_REPORT_HEADER, "").strip().lower() != UNVERIFIED
