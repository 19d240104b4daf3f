"""``shardplan check``'s report (a ``CheckReport``) as text for a terminal, or as markdown
for a pull request comment: the verdict, the headroom and what binds, or why no plan
exists and the smallest fixes."""

from __future__ import annotations

from planner_service.plan.api import Binding, CheckReport, Headroom, TierUse, Verdict
from planner_service.plan.types import (
    Infeasibility,
    PlanRequest,
    SmallestFixes,
    SolverStatus,
)
from planner_service.plan.units import gib

OVER_LIMIT_SHOWN = 5
MARKDOWN_MARKER = "<!-- shardplan-check -->"  # lets a CI job find its earlier comment


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
