"""Every rank's room under a plan: what it uses of what it offers after the reservation
(``plan/capacity.py``), in HBM and DDR (``rank_headroom``, POST /v1/check's ``ranks``),
and in the tier tables live in, the spread of free bytes over the ranks and the ranks
over a utilization limit."""

from __future__ import annotations

from planner_service.plan.api import TIGHTEST_SHOWN, Headroom, MemoryTier, RankHeadroom, TierUse
from planner_service.plan.capacity import usable_capacity
from planner_service.plan.types import ComputeDevice, PlanRequest, ShardingPlan


def rank_headroom(request: PlanRequest, plan: ShardingPlan) -> list[RankHeadroom]:
    """Every rank's headroom under ``plan``; usable is what the rank offers after the
    reservation."""
    capacities = usable_capacity(request.topology, request.constraints)
    return [
        RankHeadroom(
            rank=stats.rank,
            hbm_used_bytes=stats.hbm_bytes,
            hbm_usable_bytes=capacity.hbm_bytes,
            hbm_free_bytes=capacity.hbm_bytes - stats.hbm_bytes,
            ddr_used_bytes=stats.ddr_bytes,
            ddr_usable_bytes=capacity.ddr_bytes,
            ddr_free_bytes=capacity.ddr_bytes - stats.ddr_bytes,
            perf_total_ms=stats.perf.total,
        )
        for stats, capacity in zip(plan.rank_stats, capacities, strict=True)
    ]


def tier_of(request: PlanRequest) -> MemoryTier:
    """Where tables live: HBM on cuda, DDR on cpu (which has no HBM)."""
    if request.topology.compute_device is ComputeDevice.CUDA:
        return MemoryTier.HBM
    return MemoryTier.DDR


def tier_use(rank: RankHeadroom, tier: MemoryTier) -> TierUse:
    """``rank``'s use of ``tier``."""
    if tier is MemoryTier.HBM:
        used, usable = rank.hbm_used_bytes, rank.hbm_usable_bytes
    else:
        used, usable = rank.ddr_used_bytes, rank.ddr_usable_bytes
    return TierUse(
        rank=rank.rank,
        used_bytes=used,
        usable_bytes=usable,
        free_bytes=usable - used,
        utilization=used / usable if usable else 0.0,
    )


def spread(uses: list[TierUse], tier: MemoryTier) -> Headroom:
    """The least, median and most free ranks, and the tightest few."""
    ordered = sorted(uses, key=lambda u: (u.free_bytes, u.rank))
    return Headroom(
        tier=tier,
        least=ordered[0],
        median=ordered[(len(ordered) - 1) // 2],
        most=ordered[-1],
        tightest=ordered[:TIGHTEST_SHOWN],
    )


def over_limit(uses: list[TierUse], limit: float | None) -> list[TierUse]:
    """The ranks that use more than ``limit`` of their usable bytes, fullest first."""
    if limit is None:
        return []
    return sorted(
        (u for u in uses if u.utilization > limit), key=lambda u: (-u.utilization, u.rank)
    )
