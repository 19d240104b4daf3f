"""The fix for a plan over its utilization limit: plan for the margin. The
``hbm_headroom_fraction`` that shrinks every rank's usable memory to the limit of today's
makes the planner keep the margin itself; what it makes of the request with that fraction
(a plan, or none and its fixes) is the smallest fix."""

from __future__ import annotations

import math

from planner_service.check.headroom import tier_of
from planner_service.plan.api import CheckReport, MarginFix, MemoryTier, Verdict
from planner_service.plan.capacity import rank_capacities
from planner_service.plan.types import Infeasibility, PlanRequest, ShardingPlan
from planner_service.plan.variants import with_constraints


def margin_request(request: PlanRequest, report: CheckReport) -> PlanRequest | None:
    """For a report over its limit: ``request`` with the ``hbm_headroom_fraction`` that
    makes the planner itself keep the margin (None: within the limit, or no fraction
    below 1 keeps it)."""
    limit = report.max_hbm_utilization
    if report.verdict is not Verdict.OVER_LIMIT or limit is None:
        return None
    fraction = _headroom_fraction_for(request, limit)
    if fraction is None:
        return None
    return with_constraints(request, hbm_headroom_fraction=fraction)


def with_margin_fix(
    report: CheckReport,
    tightened: PlanRequest,
    plan: ShardingPlan | None,
    infeasibility: Infeasibility | None,
) -> CheckReport:
    """``report`` with what the planner made of the tightened request (``margin_request``)."""
    fix = MarginFix(
        hbm_headroom_fraction=tightened.constraints.hbm_headroom_fraction,
        fits=plan is not None,
        objective=plan.solver.objective if plan is not None else None,
        fixes=infeasibility.fixes if infeasibility is not None else None,
    )
    return report.model_copy(update={"margin_fix": fix})


def _headroom_fraction_for(request: PlanRequest, limit: float) -> float | None:
    """The ``hbm_headroom_fraction`` that shrinks every rank's usable memory to at most
    ``limit`` of today's (None: no fraction below 1 does)."""
    topology = request.topology
    capacities = rank_capacities(topology, request.constraints)
    kinds = list(capacities.overridden.values())
    if len(kinds) < topology.world_size:
        kinds.append(capacities.default)
    needed = 0.0
    for capacity in kinds:
        usable = capacity.hbm_bytes if tier_of(request) is MemoryTier.HBM else capacity.ddr_bytes
        primary = usable + capacity.reserved_bytes
        if primary:
            needed = max(needed, 1 - (limit * usable + capacity.dense_bytes) / primary)
    fraction = math.ceil(needed * 1000) / 1000
    return fraction if fraction < 1 else None
