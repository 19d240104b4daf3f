"""What ``shardplan check`` says about one request: whether it fits, how much room each
rank has left, what binds the plan, and, when no plan exists, why and the smallest fixes.
One ``CheckReport`` (its JSON is a stable schema, documented in docs/ci.md), rendered as
text for a terminal or as markdown for a pull request comment.

Headroom is measured in the tier tables live in (HBM on cuda, DDR on cpu) against each
rank's usable capacity: what is left after the reservation (``plan/capacity.py``).
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

from planner_service.costs.estimate import total_components
from planner_service.plan.capacity import rank_capacities
from planner_service.plan.types import (
    ComputeDevice,
    Infeasibility,
    InfeasibilityCode,
    PlanRequest,
    ShardingPlan,
    SmallestFixes,
    SolverStatus,
)
from planner_service.plan.units import gib
from planner_service.plan.variants import with_constraints
from planner_service.reports import RankHeadroom, rank_headroom

# 1.x only adds fields; a field's meaning never changes within a major version.
CHECK_SCHEMA_VERSION = "1.0"
# Memory binds a plan when a rank uses this much of a tier's usable bytes: a little more
# data and the planner has to move something (or fails).
BINDING_UTILIZATION = 0.95
TIGHTEST_SHOWN = 3
OVER_LIMIT_SHOWN = 5
MARKDOWN_MARKER = "<!-- shardplan-check -->"  # lets a CI job find its earlier comment

Tier = Literal["hbm", "ddr"]


class Verdict(StrEnum):
    FITS = "fits"
    OVER_LIMIT = "over_limit"  # a plan exists, but a rank uses more than the limit allows
    NO_PLAN = "no_plan"


class BindingKind(StrEnum):
    HBM = "hbm"
    DDR = "ddr"
    PERF = "perf"
    MAX_HBM_UTILIZATION = "max_hbm_utilization"
    MEMORY = "memory"
    CONSTRAINTS = "constraints"
    TIME_LIMIT = "time_limit"


_REASON_BINDING = {
    InfeasibilityCode.TABLE_DOES_NOT_FIT: BindingKind.MEMORY,
    InfeasibilityCode.TOTAL_MEMORY: BindingKind.MEMORY,
    InfeasibilityCode.PINNED_RANKS_OVERLOADED: BindingKind.MEMORY,
    InfeasibilityCode.NO_ALLOWED_OPTION: BindingKind.CONSTRAINTS,
    InfeasibilityCode.NO_FEASIBLE_COMBINATION: BindingKind.CONSTRAINTS,
    InfeasibilityCode.TIMED_OUT: BindingKind.TIME_LIMIT,
}


class TierUse(BaseModel):
    """One rank's use of one tier."""

    rank: int
    used_bytes: int
    usable_bytes: int
    free_bytes: int
    utilization: float = Field(description="used / usable (0 when nothing is usable)")


class Headroom(BaseModel):
    """The spread of free bytes over the ranks, in the tier tables live in."""

    tier: Tier
    least: TierUse
    median: TierUse
    most: TierUse
    tightest: list[TierUse] = Field(description=f"the {TIGHTEST_SHOWN} least free, least first")


class Binding(BaseModel):
    """What limits the plan, or what stops any plan."""

    kind: BindingKind
    rank: int | None = None
    message: str


class MarginFix(BaseModel):
    """Planning for the margin: the ``hbm_headroom_fraction`` that shrinks every rank's
    usable memory to ``max_hbm_utilization`` of today's, and what the planner makes of the
    request with it: a plan (its max-rank perf), or none (and the fixes it found)."""

    hbm_headroom_fraction: float
    fits: bool
    objective: float | None = None
    fixes: SmallestFixes | None = None


class CheckReport(BaseModel):
    """``shardplan check --format json``."""

    schema_version: str = CHECK_SCHEMA_VERSION
    fits: bool = Field(description="the check passes: a plan, within max_hbm_utilization")
    verdict: Verdict
    status: SolverStatus
    world_size: int
    tables: int
    plan_id: str | None = None
    objective: float | None = Field(None, description="max-rank perf, ms per iteration")
    lower_bound: float | None = None
    gap: float | None = None
    max_hbm_utilization: float | None = None
    headroom: Headroom | None = None
    binding: Binding
    over_limit: list[TierUse] = Field(default_factory=list)
    margin_fix: MarginFix | None = None
    ranks: list[RankHeadroom] = Field(default_factory=list)
    infeasibility: Infeasibility | None = None


# --------------------------------------------------------------------------- building


def check_report(
    request: PlanRequest,
    plan: ShardingPlan | None,
    infeasibility: Infeasibility | None,
    *,
    max_hbm_utilization: float | None = None,
) -> CheckReport:
    """The report on ``request``'s plan (or on why it has none). ``max_hbm_utilization``:
    the most of its usable memory any rank may use before the check fails."""
    if plan is None:
        assert infeasibility is not None
        return _no_plan_report(request, infeasibility, max_hbm_utilization)
    ranks = rank_headroom(request, plan)
    tier = tier_of(request)
    uses = [_use(rank, tier) for rank in ranks]
    over = _over(uses, max_hbm_utilization)
    solver = plan.solver
    return CheckReport(
        fits=not over,
        verdict=Verdict.OVER_LIMIT if over else Verdict.FITS,
        status=solver.status,
        world_size=plan.world_size,
        tables=len(plan.tables),
        plan_id=plan.plan_id,
        objective=solver.objective,
        lower_bound=solver.lower_bound,
        gap=solver.gap,
        max_hbm_utilization=max_hbm_utilization,
        headroom=_headroom(uses, tier),
        binding=_binding(request, plan, ranks, over),
        over_limit=over,
        ranks=ranks,
    )


def tier_of(request: PlanRequest) -> Tier:
    """Where tables live: HBM on cuda, DDR on cpu (which has no HBM)."""
    return "hbm" if request.topology.compute_device is ComputeDevice.CUDA else "ddr"


def _use(rank: RankHeadroom, tier: Tier) -> TierUse:
    used, usable = getattr(rank, f"{tier}_used_bytes"), getattr(rank, f"{tier}_usable_bytes")
    return TierUse(
        rank=rank.rank,
        used_bytes=used,
        usable_bytes=usable,
        free_bytes=usable - used,
        utilization=used / usable if usable else 0.0,
    )


def _over(uses: list[TierUse], limit: float | None) -> list[TierUse]:
    """The ranks over ``limit``, fullest first."""
    if limit is None:
        return []
    return sorted(
        (u for u in uses if u.utilization > limit), key=lambda u: (-u.utilization, u.rank)
    )


def _headroom(uses: list[TierUse], tier: Tier) -> Headroom:
    ordered = sorted(uses, key=lambda u: (u.free_bytes, u.rank))
    return Headroom(
        tier=tier,
        least=ordered[0],
        median=ordered[(len(ordered) - 1) // 2],
        most=ordered[-1],
        tightest=ordered[:TIGHTEST_SHOWN],
    )


def _binding(
    request: PlanRequest, plan: ShardingPlan, ranks: list[RankHeadroom], over: list[TierUse]
) -> Binding:
    """The limit over which a rank goes; else a memory tier some rank has (nearly) filled;
    else perf: the slowest rank, which the planner could not make faster."""
    tier = tier_of(request)
    if over:
        return Binding(
            kind=BindingKind.MAX_HBM_UTILIZATION, rank=over[0].rank, message=_uses(over[0], tier)
        )
    tiers: tuple[Tier, ...] = ("hbm", "ddr") if tier == "hbm" else ("ddr",)
    fullest_tier, fullest = max(
        ((t, _use(rank, t)) for rank in ranks for t in tiers),
        key=lambda item: (item[1].utilization, -item[1].rank),
    )
    if fullest.utilization >= BINDING_UTILIZATION:
        kind = BindingKind.HBM if fullest_tier == "hbm" else BindingKind.DDR
        return Binding(kind=kind, rank=fullest.rank, message=_uses(fullest, fullest_tier))
    return _perf_binding(request, plan, ranks)


def _perf_binding(request: PlanRequest, plan: ShardingPlan, ranks: list[RankHeadroom]) -> Binding:
    """The slowest rank, with the largest part of its time, and how full memory is."""
    tier = tier_of(request)
    slowest = max(plan.rank_stats, key=lambda stats: (stats.perf.total, -stats.rank))
    components = total_components(request.options.cost_model)
    component = max(components, key=lambda name: getattr(slowest.perf, name))
    fullest_primary = max(
        (_use(rank, tier) for rank in ranks), key=lambda u: (u.utilization, -u.rank)
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


def _uses(use: TierUse, tier: Tier) -> str:
    return (
        f"{tier.upper()} on rank {use.rank}: {use.utilization:.1%} of its usable "
        f"{tier.upper()} used ({gib(use.used_bytes)} of {gib(use.usable_bytes)})"
    )


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
        usable = capacity.hbm_bytes if tier_of(request) == "hbm" else capacity.ddr_bytes
        primary = usable + capacity.reserved_bytes
        if primary:
            needed = max(needed, 1 - (limit * usable + capacity.dense_bytes) / primary)
    fraction = math.ceil(needed * 1000) / 1000
    return fraction if fraction < 1 else None


def _no_plan_report(
    request: PlanRequest, infeasibility: Infeasibility, limit: float | None
) -> CheckReport:
    first = infeasibility.reasons[0]
    return CheckReport(
        fits=False,
        verdict=Verdict.NO_PLAN,
        status=infeasibility.status,
        world_size=request.topology.world_size,
        tables=len(request.tables),
        max_hbm_utilization=limit,
        binding=Binding(
            kind=_REASON_BINDING[first.code],
            rank=first.ranks[0] if first.ranks else None,
            message=first.message,
        ),
        infeasibility=infeasibility,
    )


# --------------------------------------------------------------------------- rendering


def render_text(report: CheckReport, request: PlanRequest, source: str) -> str:
    """For a terminal: the verdict, then the headroom and what binds, or why no plan."""
    lines = [verdict_line(report, source)]
    if report.infeasibility is not None:
        lines += report.infeasibility.render().splitlines()
        return "\n".join(lines) + "\n"
    assert report.headroom is not None
    tier = report.headroom.tier.upper()
    lines.append(_plan_line(report))
    lines.append(f"{tier} headroom, of each rank's usable {tier} ({_reservation(request)}):")
    for label, use in _spread(report.headroom):
        lines.append(
            f"  {label:<6} rank {use.rank}: {gib(use.free_bytes)} free "
            f"({_free_share(use)}), {gib(use.used_bytes)} of {gib(use.usable_bytes)} used"
        )
    lines.append(f"  tightest ranks: {_tightest(report.headroom)}")
    lines.append(f"binding: {report.binding.message}")
    if report.over_limit:
        lines.append(
            f"over --max-hbm-utilization {report.max_hbm_utilization}: {_over_list(report)}"
        )
    fix = _limit_fix(report, request)
    if fix:
        lines.append(f"fix: {fix}")
    return "\n".join(lines) + "\n"


def render_markdown(report: CheckReport, request: PlanRequest, source: str) -> str:
    """For a pull request comment: a verdict heading, the headroom table, the binding
    constraint, and, when it fails, the explanation and the smallest fix."""
    icon = "✅" if report.fits else "❌"
    lines = [MARKDOWN_MARKER, f"### {icon} {verdict_line(report, f'`{source}`')}", ""]
    if report.infeasibility is not None:
        return "\n".join(lines + _markdown_no_plan(report.infeasibility, report.binding)) + "\n"
    assert report.headroom is not None
    tier = report.headroom.tier.upper()
    lines += [_plan_line(report, "`"), ""]
    lines += [
        f"| {tier} headroom | rank | free | used | usable |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for label, use in _spread(report.headroom):
        lines.append(
            f"| {label} | {use.rank} | {gib(use.free_bytes)} ({_free_share(use)}) | "
            f"{gib(use.used_bytes)} | {gib(use.usable_bytes)} |"
        )
    lines += [
        "",
        f"Usable: each rank's {tier} after the reservation ({_reservation(request, '`')}). "
        f"Tightest ranks: {_tightest(report.headroom)}.",
        "",
        f"**Binding constraint:** {report.binding.message}.",
    ]
    if report.over_limit:
        lines += [
            "",
            f"**Over `--max-hbm-utilization {report.max_hbm_utilization}`:** {_over_list(report)}.",
        ]
    fix = _limit_fix(report, request, "`")
    if fix:
        lines += ["", f"**Smallest fix:** {fix}."]
    return "\n".join(lines) + "\n"


def verdict_line(report: CheckReport, source: str) -> str:
    what = f"{report.tables} table(s) on {report.world_size} rank(s)"
    if report.verdict is Verdict.FITS:
        return f"{source} fits: {what}"
    if report.verdict is Verdict.OVER_LIMIT:
        worst = report.over_limit[0]
        tier = report.headroom.tier.upper() if report.headroom else "HBM"
        return (
            f"{source} is over the limit: rank {worst.rank} would use "
            f"{worst.utilization:.1%} of its usable {tier} ({gib(worst.used_bytes)} of "
            f"{gib(worst.usable_bytes)}), more than --max-hbm-utilization "
            f"{report.max_hbm_utilization} allows"
        )
    if report.status is SolverStatus.NO_SOLUTION_IN_TIME:
        return f"{source} does not fit: no plan found within the time limit for {what}"
    return f"{source} does not fit: no plan exists for {what}"


def _plan_line(report: CheckReport, quote: str = "") -> str:
    assert report.plan_id is not None and report.objective is not None
    return (
        f"Plan {quote}{report.plan_id[:12]}{quote}: max-rank perf {report.objective:.4g} ms "
        f"per iteration ({report.status.value}, gap {report.gap or 0.0:.2%})."
    )


def _spread(headroom: Headroom) -> list[tuple[str, TierUse]]:
    return [("least", headroom.least), ("median", headroom.median), ("most", headroom.most)]


def _free_share(use: TierUse) -> str:
    return f"{use.free_bytes / use.usable_bytes:.1%}" if use.usable_bytes else "-"


def _tightest(headroom: Headroom) -> str:
    return ", ".join(f"{u.rank} ({gib(u.free_bytes)} free)" for u in headroom.tightest)


def _reservation(request: PlanRequest, quote: str = "") -> str:
    constraints = request.constraints
    return (
        f"{quote}hbm_headroom_fraction{quote} {constraints.hbm_headroom_fraction} and "
        f"{quote}dense_bytes_per_rank{quote} {gib(constraints.dense_bytes_per_rank)} held back"
    )


def _over_list(report: CheckReport) -> str:
    shown = [f"rank {u.rank} ({u.utilization:.1%})" for u in report.over_limit[:OVER_LIMIT_SHOWN]]
    more = len(report.over_limit) - OVER_LIMIT_SHOWN
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _limit_fix(report: CheckReport, request: PlanRequest, quote: str = "") -> str | None:
    fix, limit = report.margin_fix, report.max_hbm_utilization
    if fix is None or limit is None:
        return None
    setting = (
        f"{quote}constraints.hbm_headroom_fraction{quote} {fix.hbm_headroom_fraction} (now "
        f"{request.constraints.hbm_headroom_fraction}), which keeps every rank within "
        f"{limit:.0%} of today's usable memory"
    )
    if fix.fits:
        assert fix.objective is not None
        return (
            f"plan with {setting}: the planner finds a plan, max-rank perf "
            f"{fix.objective:.4g} ms per iteration"
        )
    fixes = fix_lines(fix.fixes or SmallestFixes(), quote)
    return f"with {setting}, no plan exists" + (f"; {'; '.join(fixes)}" if fixes else "")


def _markdown_no_plan(infeasibility: Infeasibility, binding: Binding) -> list[str]:
    lines = [f"**Why** (binding constraint: {binding.kind.value}):", ""]
    lines += [f"- {reason.message}" for reason in infeasibility.reasons]
    lines += ["", "**Smallest fixes**, found by planning changed requests:", ""]
    lines += [f"- {fix}" for fix in fix_lines(infeasibility.fixes)] or ["- none found"]
    return lines


def fix_lines(fixes: SmallestFixes, quote: str = "`") -> list[str]:
    """The fixes of an infeasibility report, in words (names quoted for markdown)."""
    lines = []
    if fixes.min_world_size is not None:
        lines.append(f"{quote}world_size{quote} {fixes.min_world_size} (same devices) fits")
    elif fixes.min_world_size_searched_up_to is not None:
        searched = fixes.min_world_size_searched_up_to
        lines.append(f"no {quote}world_size{quote} up to {searched} fits either")
    if fixes.tables_fit_with_uvm_caching:
        tables = ", ".join(f"{quote}{name}{quote}" for name in fixes.tables_fit_with_uvm_caching)
        then = (
            "then the whole model fits"
            if fixes.uvm_caching_makes_it_fit
            else "then these tables fit, but not the whole model"
        )
        lines.append(f"allow {quote}fused_uvm_caching{quote} for {tables}: {then}")
    return lines
