"""The plan page (GET /v1/plans/{plan_id}/view): a plan for people, as server-rendered HTML
that fetches nothing and runs no script, so that it can be saved and opened offline.

It answers at a glance what ``glance.py`` computes: the solver's outcome and why it
stopped, the bottleneck rank and its largest perf component, the fullest rank of each
memory tier the tables live in, what moved from the previous plan, and the fixed costs;
then one row per run of alike ranks with what the ranks hold, bars of memory (at least
``MIN_BAR_PX`` wide when not empty, the number beside them) and of time, and every perf
component as a number. Bars are plain ``div``s sized in percent."""

from __future__ import annotations

from html import escape

from planner_service.plan.diff import TableChange, TableStatus
from planner_service.plan.order import natural_sorted
from planner_service.plan.types import (
    ComputeDevice,
    Perf,
    PlanRequest,
    ShardingPlan,
    SolverReport,
    StopReason,
    TableShardingModel,
)
from planner_service.plan.units import size
from planner_service.reports.plan_table import perf_rule
from planner_service.reports.tables import SHARDING_TYPE_SHORT, rank_ranges
from planner_service.service.pages.glance import (
    HELD_NAMES_SHOWN,
    TIGHT_FRACTION,
    Bottleneck,
    Fullest,
    Held,
    Moved,
    PlanGlance,
    RankRow,
    Tier,
    TierUse,
    plan_glance,
)
from planner_service.service.pages.style import BASE_STYLE

PERF_COLOURS = {
    "fwd_compute": "#4e79a7",
    "fwd_comms": "#f28e2b",
    "bwd_compute": "#59a14f",
    "bwd_comms": "#e15759",
    "prefetch": "#b07aa1",
    "input_dist": "#9c755f",
}
MIN_BAR_PX = 3  # a bar of any use at all is this wide, however little of the whole it is

_STYLE = (
    BASE_STYLE
    + f"""
.bar{{width:100px}} .bar>div.fill{{min-width:{MIN_BAR_PX}px}} .bar>div.seg{{min-width:2px}}
.bar>div.tight{{background:#d62728}} .bar.perf{{width:140px}}
th.comp{{font-size:12px;font-weight:600}} .t{{white-space:nowrap}} small{{color:#666}}
table.glance{{border:1px solid #ddd;margin-bottom:8px}}
table.glance th{{background:#fafafa;vertical-align:top;white-space:nowrap}}
tr.bottleneck>td{{background:#fff1c9}} tr.fixed>td{{color:#555;font-style:italic}}
tr.gap>td{{color:#777;text-align:center;font-size:12px}}
td.dominant{{font-weight:700;text-decoration:underline 3px var(--colour)}}
.tag{{font-size:11px;background:#d62728;color:#fff;border-radius:3px;padding:0 4px;margin-left:4px}}
.warn{{color:#b3261e;font-weight:600}} .held{{min-width:160px;max-width:320px;font-size:13px}}
.more{{color:#666;white-space:nowrap}}
th i{{display:inline-block;width:10px;height:10px;margin-right:4px}}
"""
)

_STOP_REASONS = {
    StopReason.OPTIMAL: "proven optimal",
    StopReason.GAP_LIMIT: "proven within options.gap_limit",
    StopReason.WORK_BUDGET: "the deterministic search budget was spent "
    "(the same request gives the same plan)",
    StopReason.TIME_LIMIT: "options.time_limit_s ran out (another run may get further: "
    "give the solve more time)",
}


def render_plan_page(request: PlanRequest, plan: ShardingPlan, *, imported: bool = False) -> str:
    """The page; ``imported``: the plan was stored by PUT, so its solver report is shown as
    the importer's word, which this service did not verify."""
    glance = plan_glance(request, plan)
    sections = [
        _glance_section(request, plan, glance, imported),
        _ranks_section(request, plan, glance),
        _moved_section(glance.moved) if glance.moved else "",
        _tables_section(plan),
        _solver_section(plan, imported),
    ]
    return f"""<!doctype html>
<html lang=en><head><meta charset=utf-8>
<title>shardplan plan {plan.plan_id[:12]}</title><style>{_STYLE}</style></head>
<body>
<h1>Sharding plan <code>{plan.plan_id}</code></h1>
<div>{len(plan.tables)} tables on {plan.world_size} ranks
({request.topology.compute_device.value}, {request.topology.local_world_size} per host),
cost model <code>{request.options.cost_model.value}</code>;
tables live in {_tiers_text(request, glance.tiers)}</div>
{"".join(sections)}</body></html>
"""


def _tiers_text(request: PlanRequest, tiers: tuple[Tier, ...]) -> str:
    if request.topology.compute_device is ComputeDevice.CPU:
        return " and ".join(tiers) + " (host memory: the ranks compute on cpu)"
    if len(tiers) > 1:
        return "HBM and DDR (the DDR part: UVM tables, in host memory)"
    return "HBM"


# --------------------------------------------------------------------------- at a glance


# What an imported plan's page says of its solver report (PUT /v1/plans/{plan_id}).
UNVERIFIED_REPORT = (
    "imported: this plan was made elsewhere and stored by PUT; its status, lower bound and "
    "gap are the importer's word, not verified by this service (its objective and critical "
    "path were recomputed here)"
)


def _glance_section(
    request: PlanRequest, plan: ShardingPlan, glance: PlanGlance, imported: bool
) -> str:
    solver = _solver_line(plan.solver, request.options.gap_limit)
    if imported:
        solver += f"<br><span class=warn>{escape(UNVERIFIED_REPORT)}</span>"
    lines = [("solver", solver)]
    if glance.bottleneck is not None:
        lines.append(("bottleneck", _bottleneck_line(glance.bottleneck, glance)))
    lines += [(fullest.tier.value, _memory_line(fullest)) for fullest in glance.fullest]
    if glance.moved is not None:
        lines.append(("moved", _moved_line(glance.moved)))
    if glance.fixed is not None:
        lines.append(("fixed costs", _fixed_line(glance.fixed, glance.summed)))
    body = "".join(f"<tr><th>{name}</th><td>{text}</td></tr>" for name, text in lines)
    return f"<h2>At a glance</h2><table class=glance>{body}</table>"


def _solver_line(report: SolverReport, gap_limit: float) -> str:
    reason = report.stop_reason
    stopped = "stop reason not recorded"
    if reason is not None:
        stopped = f"stopped on {reason.value}: {_STOP_REASONS[reason]}"
    if reason is StopReason.GAP_LIMIT:
        stopped += f" ({gap_limit:.2%})"
    text = (
        f"<b>{report.status.value}</b>, {escape(stopped)}; objective "
        f"{_ms(report.objective)} ms, lower bound {_ms(report.lower_bound)} ms, gap "
        f"{report.gap:.2%}"
    )
    return f"<span class=warn>{text}</span>" if reason is StopReason.TIME_LIMIT else text


def _bottleneck_line(bottleneck: Bottleneck, glance: PlanGlance) -> str:
    perf = bottleneck.perf
    ties = f" (and {bottleneck.tied_ranks} more at the same time)" if bottleneck.tied_ranks else ""
    ratio = perf.total / bottleneck.mean_total_ms if bottleneck.mean_total_ms else 1.0
    share = bottleneck.component_ms / perf.total if perf.total else 0.0
    fixed_ms = 0.0 if glance.fixed is None else getattr(glance.fixed, bottleneck.component)
    fixed = f", of which {_ms(fixed_ms)} ms fixed costs" if fixed_ms else ""
    row = next((row for row in glance.rows if row.holds(bottleneck.rank)), None)
    holds = "" if row is None else f"; it holds {_held_text(row.held)}"
    return (
        f"<b>rank {bottleneck.rank}</b>{ties}: {_ms(perf.total)} ms per step, "
        f"{ratio:.2f}× the mean rank's {_ms(bottleneck.mean_total_ms)} ms; most of it is "
        f"<b>{bottleneck.component}</b>, {_ms(bottleneck.component_ms)} ms ({share:.0%}"
        f"{fixed}){holds}"
    )


def _memory_line(fullest: Fullest) -> str:
    use = fullest.use
    if not use.used_bytes:
        return f"no rank holds anything in {fullest.tier.value}"
    text = (
        f"fullest rank {fullest.rank}: {size(use.used_bytes)} of {size(use.usable_bytes)} "
        f"usable ({_share(use)})"
    )
    if not fullest.tight_ranks:
        return f"{text}; no rank at {TIGHT_FRACTION:.0%} or more"
    tight = f"{fullest.tight_ranks} rank(s) at {TIGHT_FRACTION:.0%} or more of usable"
    return f"{text}; <span class=warn>{tight}</span>"


def _moved_line(moved: Moved) -> str:
    migration = moved.migration
    limit = ""
    if migration.max_moved_bytes is not None:
        limit = f" (limit max_moved_bytes {size(migration.max_moved_bytes)})"
    return (
        f"{size(migration.moved_bytes)} of weights and optimizer state move between ranks "
        f"from plan <code>{migration.previous_plan_id[:12]}</code>{limit}, in "
        f"{migration.tables_moved} table(s); {len(migration.ranks)} rank(s) send or receive "
        f'(<a href="#moved">what moved</a>)'
    )


def _fixed_line(fixed: Perf, summed: tuple[str, ...]) -> str:
    parts = ", ".join(
        f"{name} {_ms(getattr(fixed, name))}" for name in summed if getattr(fixed, name)
    )
    return (
        f"{_ms(fixed.total)} ms of every rank's time is paid whatever it holds (the step's "
        f"own work, kernel calls and collective latencies): {parts}"
    )


# --------------------------------------------------------------------------- ranks


def _ranks_section(request: PlanRequest, plan: ShardingPlan, glance: PlanGlance) -> str:
    worst = max((stats.perf.total for stats in plan.rank_stats), default=0.0) or 1.0
    header = _ranks_header(glance)
    body = [_fixed_row(glance)] if glance.fixed else []
    previous: RankRow | None = None
    for row in glance.rows:
        if previous is not None and row.first > previous.last + 1:
            body.append(_gap_row(previous.last + 1, row.first - 1, glance))
        body.append(_rank_row(row, glance, worst))
        previous = row
    return (
        f"<h2>Ranks</h2>{_rows_note(glance)}<table class=ranks>{header}{''.join(body)}</table>"
        f"<p class=note>{escape(_usable_note(glance))}<br>"
        f"{escape(perf_rule(request.options.cost_model))}.</p>"
    )


def _ranks_header(glance: PlanGlance) -> str:
    """Two rows: the columns, and under "perf components, ms" one per component (names
    may break after an underscore, so that the numbers set the width)."""
    tiers = "".join(f"<th rowspan=2 colspan=2>{tier.value} used</th>" for tier in glance.tiers)
    moved = "<th rowspan=2>moved</th>" if glance.moved else ""
    components = "".join(_component_header(name, glance.summed) for name in glance.components)
    return (
        f"<tr><th rowspan=2>ranks</th><th rowspan=2>holds</th>{tiers}"
        "<th rowspan=2>time per step</th><th rowspan=2>total ms</th>"
        f"<th colspan={len(glance.components)}>perf components, ms</th>{moved}</tr>"
        f"<tr>{components}</tr>"
    )


def _component_header(name: str, summed: tuple[str, ...]) -> str:
    mark = "" if name in summed else " (not summed)"
    label = name.replace("_", "_<wbr>")
    return f'<th class=comp><i style="background:{PERF_COLOURS[name]}"></i>{label}{mark}</th>'


def _rows_note(glance: PlanGlance) -> str:
    note = "Consecutive ranks that hold and use the same share one row (<code>first-last</code>)."
    if glance.rows_total > len(glance.rows):
        note += (
            f" Shown: {len(glance.rows)} of {glance.rows_total} rows, the most loaded and the "
            "fullest; the plan document has every rank."
        )
    return f"<p class=note>{note}</p>"


def _usable_note(glance: PlanGlance) -> str:
    return (
        "Used: what the rank's shards occupy (weights, optimizer state, buffers, caches); "
        "% of usable: of what the rank offers to tables after the reservation "
        f"(hbm_headroom_fraction, dense_bytes_per_rank); red at {TIGHT_FRACTION:.0%} or more. "
        "Time per step: the bar is stacked by component, against the most loaded rank."
    )


def _columns(glance: PlanGlance) -> int:
    return 4 + 2 * len(glance.tiers) + len(glance.components) + (1 if glance.moved else 0)


def _fixed_row(glance: PlanGlance) -> str:
    fixed = glance.fixed
    assert fixed is not None
    cells = "".join(f"<td class=num>{_ms(getattr(fixed, name))}</td>" for name in glance.components)
    tiers = "<td></td><td></td>" * len(glance.tiers)
    moved = "<td></td>" if glance.moved else ""
    return (
        f"<tr class=fixed><td colspan=2>fixed: part of every rank's time</td>{tiers}<td></td>"
        f"<td class=num>{_ms(fixed.total)}</td>{cells}{moved}</tr>"
    )


def _gap_row(first: int, last: int, glance: PlanGlance) -> str:
    ranks = str(first) if first == last else f"{first}-{last}"
    return f"<tr class=gap><td colspan={_columns(glance)}>ranks {ranks} not shown</td></tr>"


def _rank_row(row: RankRow, glance: PlanGlance, worst: float) -> str:
    """A row of ranks; those as loaded as the bottleneck are highlighted, the bottleneck's
    own row is tagged, and its largest component is marked."""
    bottleneck = glance.bottleneck
    is_bottleneck = bottleneck is not None and row.stats.perf.total == bottleneck.perf.total
    tagged = bottleneck is not None and row.holds(bottleneck.rank)
    tag = " <span class=tag>bottleneck</span>" if tagged else ""
    dominant = bottleneck.component if (bottleneck and is_bottleneck) else None
    cells = [
        f"<td class=num>{row.label}{tag}</td>",
        f"<td class=held>{_held_text(row.held)}</td>",
        *(_tier_cells(row.use(tier), tier) for tier in glance.tiers),
        f"<td>{_perf_bar(row.stats.perf, glance.summed, worst)}</td>",
        f"<td class=num>{_ms(row.stats.perf.total)}</td>",
        *(_component_cell(row.stats.perf, name, name == dominant) for name in glance.components),
    ]
    if glance.moved:
        cells.append(f"<td class=num>{_moves_text(row)}</td>")
    classes = ' class="bottleneck"' if is_bottleneck else ""
    return f'<tr data-ranks="{row.label}"{classes}>{"".join(cells)}</tr>'


def _held_text(held: tuple[Held, ...]) -> str:
    if not held:
        return "<span class=more>nothing</span>"
    shown = [
        f"<span class=t>{escape(each.table)} <small>{SHARDING_TYPE_SHORT[each.sharding_type]}"
        f"{f' ×{each.shards}' if each.shards > 1 else ''}</small></span>"
        for each in held[:HELD_NAMES_SHOWN]
    ]
    more = len(held) - HELD_NAMES_SHOWN
    if more > 0:
        shown.append(f"<span class=more>+{more} more</span>")
    return ", ".join(shown)


def _tier_cells(use: TierUse, tier: Tier) -> str:
    width = min(100.0, 100 * use.fraction)
    fill = ""
    if use.used_bytes:
        tight = " tight" if use.tight else ""
        fill = f'<div class="fill {tier.value.lower()}{tight}" style="width:{width:.2f}%"></div>'
    return (
        f"<td><div class=bar>{fill}</div></td>"
        f"<td class=num>{size(use.used_bytes)} <span class=note>{_share(use)}</span></td>"
    )


def _perf_bar(perf: Perf, summed: tuple[str, ...], worst: float) -> str:
    segments = "".join(
        f'<div class=seg data-component="{name}" style="width:'
        f'{100 * getattr(perf, name) / worst:.2f}%;background:{colour}"></div>'
        for name, colour in PERF_COLOURS.items()
        if name in summed and getattr(perf, name) > 0
    )
    return f"<div class='bar perf'>{segments}</div>"


def _component_cell(perf: Perf, name: str, dominant: bool) -> str:
    value = _ms(getattr(perf, name))
    if not dominant:
        return f"<td class=num>{value}</td>"
    return f'<td class="num dominant" style="--colour:{PERF_COLOURS[name]}">{value}</td>'


def _moves_text(row: RankRow) -> str:
    moves = row.moves
    if moves is None:
        return "-"
    return f"{size(moves.received_bytes)} in<br>{size(moves.sent_bytes)} out"


# --------------------------------------------------------------------------- the rest


def _moved_section(moved: Moved) -> str:
    migration = moved.migration
    intro = (
        f"From plan <code>{migration.previous_plan_id}</code>: {size(migration.moved_bytes)} "
        f"of weights and optimizer state move, in {migration.tables_moved} table(s)."
    )
    if not moved.previous_known:
        return f"<h2 id=moved>What moved</h2><p>{intro}</p>"
    rows = "".join(_moved_row(change) for change in moved.tables)
    more = ""
    if moved.tables_not_shown:
        more = f"<p class=note>+{moved.tables_not_shown} more tables placed differently</p>"
    return (
        f"<h2 id=moved>What moved</h2><p>{intro}</p>"
        "<table><tr><th>table</th><th>change</th><th>before</th><th>after</th>"
        f"<th>moved</th></tr>{rows}</table>{more}"
    )


def _moved_row(change: TableChange) -> str:
    if change.status is TableStatus.CHANGED:
        what = ", ".join(aspect.value for aspect in change.changes)
    else:
        what = change.status.value
    return (
        f"<tr class=moved><td>{escape(change.name)}</td><td>{what}</td>"
        f"<td>{_placement(change.old)}</td><td>{_placement(change.new)}</td>"
        f"<td class=num>{size(change.moved_bytes)}</td></tr>"
    )


def _placement(sharding: TableShardingModel | None) -> str:
    if sharding is None:
        return "-"
    ranks = rank_ranges(sorted(set(sharding.ranks)))
    return f"{sharding.sharding_type.value}, {sharding.compute_kernel.value}, ranks {escape(ranks)}"


def _tables_section(plan: ShardingPlan) -> str:
    rows = "".join(
        f"<tr><td>{escape(name)}</td><td>{plan.tables[name].sharding_type.value}</td>"
        f"<td>{plan.tables[name].compute_kernel.value}</td>"
        f"<td>{escape(rank_ranges(sorted(set(plan.tables[name].ranks))))}</td>"
        f"<td class=num>{plan.tables[name].num_shards}</td></tr>"
        for name in natural_sorted(plan.tables)
    )
    return (
        "<h2>Tables</h2><table><tr><th>table</th><th>sharding type</th><th>compute kernel</th>"
        f"<th>ranks</th><th>shards</th></tr>{rows}</table>"
    )


def _solver_section(plan: ShardingPlan, imported: bool) -> str:
    report = plan.solver
    reason = report.stop_reason
    rows = [("verified", f"no: {UNVERIFIED_REPORT}")] if imported else []
    rows += [
        ("status", report.status.value),
        ("stop_reason", "-" if reason is None else f"{reason.value} ({_STOP_REASONS[reason]})"),
        ("objective (max rank perf)", f"{report.objective:.6g} ms"),
        ("lower bound", f"{report.lower_bound:.6g} ms ({report.lower_bound_source or '-'})"),
        ("gap", f"{report.gap:.2%}"),
        ("critical path", f"{report.critical_path:.6g} ms"),
        ("planner", plan.planner_version),
        ("request_hash", plan.request_hash),
    ]
    table = "".join(
        f"<tr><th>{escape(key)}</th><td><code>{escape(value)}</code></td></tr>"
        for key, value in rows
    )
    return f"<h2>Solver report</h2><table>{table}</table>"


def _ms(value: float) -> str:
    """Milliseconds as the page's columns print them: four decimals, and "<0.0001" for
    what is not zero but would read as zero."""
    if 0 < value < 0.00005:
        return "&lt;0.0001"
    return f"{value:.4f}"


def _share(use: TierUse) -> str:
    """The share of usable, "<0.1%" for a use that is not zero but would read as 0.0%."""
    if not use.usable_bytes:
        return "of none usable" if use.used_bytes else "-"
    percent = 100 * use.fraction
    return "&lt;0.1%" if 0 < percent < 0.05 else f"{percent:.1f}%"
