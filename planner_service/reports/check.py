"""``shardplan check``'s report (a ``CheckReport``) as text for a terminal, or as markdown
for a pull request comment: the verdict, the predicted step time, where the bytes live
(tables left outside HBM called out), the headroom of each tier and what binds, the
comparison with a baseline and every gate; or why no plan exists and the smallest fixes.

The markdown heading reads ❌ when the check fails, ⚠️ when it passes with tables outside
HBM (a reviewer should not see a plain green check for a model that now reads rows over
the host link), ✅ otherwise."""

from __future__ import annotations

from planner_service.check.gates import change_words
from planner_service.plan.api import (
    BaselineComparison,
    Binding,
    CheckReport,
    GateResult,
    Headroom,
    Placement,
    TierUse,
    Verdict,
)
from planner_service.plan.types import (
    CostModel,
    ExplainCheck,
    Infeasibility,
    PlanRequest,
    SmallestFixes,
    SolverStatus,
)
from planner_service.plan.units import size as gib

OVER_LIMIT_SHOWN = 5
OUTSIDE_HBM_SHOWN = 10  # tables named when tables left HBM
KERNEL_MOVES_SHOWN = 10
MARKDOWN_MARKER = "<!-- shardplan-check -->"  # lets a CI job find its earlier comment


def render_text(report: CheckReport, request: PlanRequest, source: str) -> str:
    """For a terminal: the verdict; the step time, where the bytes live, the headroom and
    what binds, the baseline and the gates; or why there is no plan."""
    lines = [verdict_line(report, source)]
    if report.infeasibility is not None:
        lines += report.infeasibility.render().splitlines()
        return "\n".join(lines + _gates_text(report.gates)) + "\n"
    lines.append(_plan_line(report))
    if report.placement is not None:
        lines += _placement_text(report.placement)
    for headroom in _headrooms(report):
        tier = headroom.tier.upper()
        lines.append(f"{tier} headroom, of each rank's {_usable(report, headroom, request)}:")
        for label, use in _spread(headroom):
            lines.append(
                f"  {label:<6} rank {use.rank}: {gib(use.free_bytes)} free "
                f"({_free_share(use)}), {gib(use.used_bytes)} of {gib(use.usable_bytes)} used"
            )
        lines.append(f"  tightest ranks: {_tightest(headroom)}")
    lines.append(f"binding: {report.binding.message}")
    if report.baseline is not None:
        lines += _baseline_text(report.baseline)
    if report.over_limit:
        lines.append(
            f"over --max-hbm-utilization {report.max_hbm_utilization}: {_over_list(report)}"
        )
    fix = _limit_fix(report, request)
    if fix:
        lines.append(f"fix: {fix}")
    return "\n".join(lines + _gates_text(report.gates)) + "\n"


def render_markdown(report: CheckReport, request: PlanRequest, source: str) -> str:
    """For a pull request comment: a verdict heading, the step time, where the bytes live,
    the headroom tables, the binding constraint, the baseline, the gates, and, when it
    fails, the explanation and the smallest fix."""
    lines = [MARKDOWN_MARKER, f"### {_icon(report)} {verdict_line(report, f'`{source}`')}", ""]
    if report.infeasibility is not None:
        lines += _markdown_no_plan(report.infeasibility, report.binding)
        return "\n".join(lines + _gates_markdown(report.gates)) + "\n"
    lines += [_plan_line(report, "`"), ""]
    if report.placement is not None:
        lines += _placement_markdown(report.placement)
    for headroom in _headrooms(report):
        tier = headroom.tier.upper()
        lines += [
            f"| {tier} headroom | rank | free | used | usable |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for label, use in _spread(headroom):
            lines.append(
                f"| {label} | {use.rank} | {gib(use.free_bytes)} ({_free_share(use)}) | "
                f"{gib(use.used_bytes)} | {gib(use.usable_bytes)} |"
            )
        lines += [
            "",
            f"Of each rank's {_usable(report, headroom, request, '`')}. "
            f"Tightest ranks: {_tightest(headroom)}.",
            "",
        ]
    lines.append(f"**Binding constraint:** {report.binding.message}.")
    if report.baseline is not None:
        lines += ["", *_baseline_markdown(report.baseline)]
    if report.over_limit:
        lines += [
            "",
            f"**Over `--max-hbm-utilization {report.max_hbm_utilization}`:** {_over_list(report)}.",
        ]
    fix = _limit_fix(report, request, "`")
    if fix:
        lines += ["", f"**Smallest fix:** {fix}."]
    return "\n".join(lines + _gates_markdown(report.gates)) + "\n"


def _icon(report: CheckReport) -> str:
    passed = report.fits if report.passed is None else report.passed
    if not passed:
        return "❌"
    if report.placement is not None and report.placement.outside_hbm:
        return "⚠️"
    return "✅"


def _usable(report: CheckReport, headroom: Headroom, request: PlanRequest, quote: str = "") -> str:
    """What a headroom is of: the tables' tier after the reservation, or all of DDR."""
    tier = headroom.tier.upper()
    if headroom is report.ddr_headroom:
        return f"{tier} (host memory, where tables outside HBM live)"
    return f"usable {tier}, after the reservation ({_reservation(request, quote)})"


def _headrooms(report: CheckReport) -> list[Headroom]:
    """The tier tables live in, then DDR on cuda when a rank uses any (where tables that
    left HBM live; the JSON report has it always)."""
    assert report.headroom is not None
    ddr = report.ddr_headroom
    used = any(rank.ddr_used_bytes for rank in report.ranks)
    return [report.headroom] + ([ddr] if ddr is not None and used else [])


def _placement_text(placement: Placement) -> list[str]:
    lines = ["where the bytes live (tables, HBM, DDR per compute kernel):"]
    for k in placement.kernels:
        note = "  <- outside HBM" if k.outside_hbm else ""
        lines.append(
            f"  {k.compute_kernel.value:<18} {k.tables:>6} table(s)  HBM {gib(k.hbm_bytes):>11}"
            f"  DDR {gib(k.ddr_bytes):>11}{note}"
        )
    if placement.outside_hbm:
        lines.append(f"warning: {_outside_hbm(placement, '')}")
    return lines


def _placement_markdown(placement: Placement) -> list[str]:
    lines = [
        "| compute kernel | tables | HBM | DDR |",
        "| --- | ---: | ---: | ---: |",
    ]
    for k in placement.kernels:
        name = f"`{k.compute_kernel.value}`" + (" (outside HBM)" if k.outside_hbm else "")
        lines.append(f"| {name} | {k.tables} | {gib(k.hbm_bytes)} | {gib(k.ddr_bytes)} |")
    lines.append("")
    if placement.outside_hbm:
        lines += [f"**⚠️ {_outside_hbm(placement, '`')}**", ""]
    return lines


def _outside_hbm(placement: Placement, quote: str) -> str:
    tables = placement.outside_hbm
    shown = ", ".join(
        f"{quote}{t.name}{quote} ({t.compute_kernel.value}, {gib(t.ddr_bytes)} in DDR)"
        for t in tables[:OUTSIDE_HBM_SHOWN]
    )
    more = f" and {len(tables) - OUTSIDE_HBM_SHOWN} more" if len(tables) > OUTSIDE_HBM_SHOWN else ""
    return (
        f"{len(tables)} table(s) left HBM: their weights live in host memory and are read "
        f"over the host link: {shown}{more}"
    )


def _baseline_text(baseline: BaselineComparison) -> list[str]:
    return ["baseline:", *(f"  {line}" for line in _baseline_lines(baseline, ""))]


def _baseline_markdown(baseline: BaselineComparison) -> list[str]:
    return [
        "**Against the baseline:**",
        "",
        *(f"- {line}" for line in _baseline_lines(baseline, "`")),
    ]


def _baseline_lines(b: BaselineComparison, quote: str) -> list[str]:
    priced = (
        "both priced under this request's cost model"
        if b.repriced
        else "the baseline's own figures: its tables or world size differ from the request's"
    )
    lines = [
        f"plan {quote}{b.plan_id[:12]}{quote} ({b.source})"
        + ("" if b.still_valid else ", which is no longer a valid plan of this request")
        + (", imported: its solver report is unverified" if b.imported else ""),
        f"predicted step time {b.plan_step_ms:.4g} ms against {b.step_ms:.4g} ms: "
        f"{change_words(b.change)} ({priced})",
        f"fullest rank: HBM {gib(b.max_hbm_bytes)} -> {gib(b.plan_max_hbm_bytes)}, "
        f"DDR {gib(b.max_ddr_bytes)} -> {gib(b.plan_max_ddr_bytes)}",
        f"tables outside HBM: {b.outside_hbm} -> {b.plan_outside_hbm}; "
        f"{b.tables_added} added, {b.tables_removed} removed",
        f"{gib(b.moved_bytes)} of weights and optimizer state would move between ranks",
    ]
    if b.kernel_moves:
        moves = ", ".join(
            f"{quote}{m.name}{quote} {m.baseline.value} -> {m.plan.value}"
            for m in b.kernel_moves[:KERNEL_MOVES_SHOWN]
        )
        more = len(b.kernel_moves) - KERNEL_MOVES_SHOWN
        lines.append(f"change kernel: {moves}" + (f" and {more} more" if more > 0 else ""))
    return lines


def _gates_text(gates: list[GateResult]) -> list[str]:
    if not gates:
        return []
    return ["gates:"] + [
        f"  {'pass' if g.passed else 'FAIL'} --{g.gate.value.replace('_', '-')}: {g.message}"
        for g in gates
    ]


def _gates_markdown(gates: list[GateResult]) -> list[str]:
    if not gates:
        return []
    lines = ["", "| gate | | |", "| --- | --- | --- |"]
    for g in gates:
        mark = "✅ passed" if g.passed else "❌ failed"
        lines.append(f"| `--{g.gate.value.replace('_', '-')}` | {mark} | {g.message} |")
    return lines


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
    if report.verdict is Verdict.GATE_FAILED:
        failed = [f"--{g.gate.value.replace('_', '-')}" for g in report.gates if not g.passed]
        return f"{source} fits but fails {', '.join(failed)}: {what}"
    if report.status is SolverStatus.NO_SOLUTION_IN_TIME:
        return f"{source} does not fit: no plan found within the time limit for {what}"
    return f"{source} does not fit: no plan exists for {what}"


def _plan_line(report: CheckReport, quote: str = "") -> str:
    assert report.plan_id is not None and report.objective is not None
    return (
        f"Plan {quote}{report.plan_id[:12]}{quote}: predicted step time "
        f"{report.objective:.4g} ms (the slowest rank, {_model(report)}; "
        f"{report.status.value}, gap {report.gap or 0.0:.2%})."
    )


def _model(report: CheckReport) -> str:
    if report.cost_model is CostModel.CALIBRATED:
        return f"calibrated cost model, device profile {report.device_profile}"
    if report.cost_model is None:
        return "cost model not reported"
    return f"cost model {report.cost_model.value}, not calibrated to this hardware"


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
    fixes = fix_lines(infeasibility.fixes, unchecked=infeasibility)
    lines += [f"- {fix}" for fix in fixes] or ["- none found"]
    return lines


def fix_lines(
    fixes: SmallestFixes, quote: str = "`", *, unchecked: Infeasibility | None = None
) -> list[str]:
    """The fixes of an infeasibility report, in words (names quoted for markdown), then
    what the time limit left unchecked in ``unchecked``'s explanation."""
    lines = []
    not_checked = unchecked.not_checked or [] if unchecked is not None else []
    cut = ExplainCheck.LARGER_WORLD_SIZES in not_checked
    if fixes.min_world_size is not None:
        lines.append(f"{quote}world_size{quote} {fixes.min_world_size} (same devices) fits")
    elif fixes.min_world_size_searched_up_to is not None and not cut:
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
    return lines + (unchecked.not_checked_lines() if unchecked is not None else [])
