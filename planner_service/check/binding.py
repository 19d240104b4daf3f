"""What binds: for a plan, the utilization limit a rank goes over, else a memory tier some
rank has (nearly) filled, else perf (the slowest rank, which the planner could not make
faster); without a plan, the kind of the first reason none exists."""

from __future__ import annotations

from planner_service.check.headroom import tier_of, tier_use
from planner_service.costs.estimate import total_components
from planner_service.plan.api import Binding, BindingKind, MemoryTier, RankHeadroom, TierUse
from planner_service.plan.types import (
    Infeasibility,
    InfeasibilityCode,
    PlanRequest,
    ShardingPlan,
)
from planner_service.plan.units import size

# Memory binds a plan when a rank uses this much of a tier's usable bytes: a little more
# data and the planner has to move something (or fails).
BINDING_UTILIZATION = 0.95

_REASON_BINDING = {
    InfeasibilityCode.TABLE_DOES_NOT_FIT: BindingKind.MEMORY,
    InfeasibilityCode.TOTAL_MEMORY: BindingKind.MEMORY,
    InfeasibilityCode.PINNED_RANKS_OVERLOADED: BindingKind.MEMORY,
    InfeasibilityCode.NO_ALLOWED_OPTION: BindingKind.CONSTRAINTS,
    InfeasibilityCode.NO_FEASIBLE_COMBINATION: BindingKind.CONSTRAINTS,
    InfeasibilityCode.TIMED_OUT: BindingKind.TIME_LIMIT,
}
_TIER_BINDING = {MemoryTier.HBM: BindingKind.HBM, MemoryTier.DDR: BindingKind.DDR}


def plan_binding(
    request: PlanRequest, plan: ShardingPlan, ranks: list[RankHeadroom], over: list[TierUse]
) -> Binding:
    """What limits ``plan``: ``over`` (the ranks over the limit, fullest first), else the
    fullest tier at ``BINDING_UTILIZATION`` or more, else perf."""
    tier = tier_of(request)
    if over:
        return Binding(
            kind=BindingKind.MAX_HBM_UTILIZATION, rank=over[0].rank, message=_uses(over[0], tier)
        )
    tiers = (MemoryTier.HBM, MemoryTier.DDR) if tier is MemoryTier.HBM else (MemoryTier.DDR,)
    fullest_tier, fullest = max(
        ((t, tier_use(rank, t)) for rank in ranks for t in tiers),
        key=lambda item: (item[1].utilization, -item[1].rank),
    )
    if fullest.utilization >= BINDING_UTILIZATION:
        return Binding(
            kind=_TIER_BINDING[fullest_tier],
            rank=fullest.rank,
            message=_uses(fullest, fullest_tier),
        )
    return _perf_binding(request, plan, ranks)


def no_plan_binding(infeasibility: Infeasibility) -> Binding:
    """What stops any plan: the first reason the planner gives."""
    first = infeasibility.reasons[0]
    return Binding(
        kind=_REASON_BINDING[first.code],
        rank=first.ranks[0] if first.ranks else None,
        message=first.message,
    )


def _perf_binding(request: PlanRequest, plan: ShardingPlan, ranks: list[RankHeadroom]) -> Binding:
    """The slowest rank, with the largest part of its time, and how full memory is."""
    tier = tier_of(request)
    slowest = max(plan.rank_stats, key=lambda stats: (stats.perf.total, -stats.rank))
    components = total_components(request.options.cost_model)
    component = max(components, key=lambda name: getattr(slowest.perf, name))
    fullest_primary = max(
        (tier_use(rank, tier) for rank in ranks), key=lambda u: (u.utilization, -u.rank)
    )
    return Binding(
        kind=BindingKind.PERF,
        rank=slowest.rank,
        message=(
            f"perf: rank {slowest.rank} is the slowest at {slowest.perf.total:.4g} ms per "
            f"iteration ({component} {getattr(slowest.perf, component):.4g} ms of it); memory "
            f"is not what binds: the fullest rank, {fullest_primary.rank}, uses "
            f"{fullest_primary.utilization:.1%} of its usable {tier.upper()}"
        ),
    )


def _uses(use: TierUse, tier: MemoryTier) -> str:
    return (
        f"{tier.upper()} on rank {use.rank}: {use.utilization:.1%} of its usable "
        f"{tier.upper()} used ({size(use.used_bytes)} of {size(use.usable_bytes)})"
    )
