"""The plan page (GET /v1/plans/{plan_id}/view) and an async solve's page
(GET /v1/solves/{job_id}/view): server-rendered HTML, no scripts, no front-end build.
Bars are plain ``div``s sized in percent."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from html import escape

from planner_service.costs.estimate import total_components
from planner_service.plan.api import SolveJob
from planner_service.plan.capacity import Capacity, usable_capacity
from planner_service.plan.order import natural_sorted
from planner_service.plan.types import PlanRequest, RankStats, ShardingPlan
from planner_service.reports.plan_table import USABLE_NOTE, perf_rule
from planner_service.reports.tables import rank_ranges, usage_cell

PERF_COLOURS = {
    "fwd_compute": "#4e79a7",
    "fwd_comms": "#f28e2b",
    "bwd_compute": "#59a14f",
    "bwd_comms": "#e15759",
    "prefetch": "#b07aa1",
    "input_dist": "#9c755f",
}

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px}
code{font-size:12px} table{border-collapse:collapse}
td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left;vertical-align:middle}
th{background:#f6f6f6} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.bar{position:relative;width:220px;height:14px;background:#f0f0f0;display:flex}
.bar>div{height:14px} .hbm{background:#76b7b2} .ddr{background:#edc948}
.legend span{display:inline-block;margin-right:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
.note{color:#555;font-size:12px}
"""


def _rank_runs(
    rank_stats: list[RankStats], capacities: list[Capacity]
) -> Iterator[tuple[str, RankStats, Capacity]]:
    """Consecutive ranks with the same row, as one row labelled "first-last": the page of
    a plan over 65,536 ranks that each hold the same has one row for them, not 65,536."""
    rows = enumerate(zip(rank_stats, capacities, strict=True))
    for _, run in itertools.groupby(rows, key=_row_key):
        members = [row for _, row in run]
        (stats, capacity), last = members[0], members[-1][0].rank
        yield (str(stats.rank) if stats.rank == last else f"{stats.rank}-{last}"), stats, capacity


def _row_key(item: tuple[int, tuple[RankStats, Capacity]]) -> tuple[object, ...]:
    """Equal for neighbours that show the same; ``rank - position`` keeps runs consecutive."""
    position, (stats, capacity) = item
    return (
        stats.rank - position,
        stats.hbm_bytes,
        stats.ddr_bytes,
        capacity.hbm_bytes,
        capacity.ddr_bytes,
        stats.perf,
    )


def _rank_row(
    label: str, stats: RankStats, capacity: Capacity, worst: float, summed: tuple[str, ...]
) -> str:
    """One row: HBM and DDR bars and numbers (GiB, % of usable), and the perf bar stacked
    from the components that make up ``perf.total`` (``summed``), so that it adds up."""
    segments = "".join(
        f'<div title="{name} {getattr(stats.perf, name):.4g} ms" '
        f'style="width:{100 * getattr(stats.perf, name) / worst:.2f}%;'
        f'background:{colour}"></div>'
        for name, colour in PERF_COLOURS.items()
        if name in summed and getattr(stats.perf, name) > 0
    )
    return (
        f"<tr><td class=num>{label}</td>"
        f"<td>{_bar('hbm', stats.hbm_bytes, capacity.hbm_bytes)}</td>"
        f"<td class=num>{usage_cell(stats.hbm_bytes, capacity.hbm_bytes)}</td>"
        f"<td>{_bar('ddr', stats.ddr_bytes, capacity.ddr_bytes)}</td>"
        f"<td class=num>{usage_cell(stats.ddr_bytes, capacity.ddr_bytes)}</td>"
        f"<td><div class=bar>{segments}</div></td>"
        f"<td class=num>{stats.perf.total:.4f}</td></tr>"
    )


def _bar(tier: str, used_bytes: int, usable_bytes: int) -> str:
    width = min(100.0, 100 * used_bytes / usable_bytes) if usable_bytes else 0.0
    return f'<div class=bar><div class={tier} style="width:{width:.2f}%"></div></div>'


def render_plan_page(request: PlanRequest, plan: ShardingPlan) -> str:
    capacities = usable_capacity(request.topology, request.constraints)
    report = plan.solver
    worst = max((stats.perf.total for stats in plan.rank_stats), default=0.0) or 1.0
    cost_model = request.options.cost_model
    summed = total_components(cost_model)
    rows = [
        _rank_row(label, stats, capacity, worst, summed)
        for label, stats, capacity in _rank_runs(plan.rank_stats, capacities)
    ]
    tables = "".join(
        f"<tr><td>{escape(name)}</td><td>{plan.tables[name].sharding_type.value}</td>"
        f"<td>{plan.tables[name].compute_kernel.value}</td>"
        f"<td>{escape(rank_ranges(sorted(set(plan.tables[name].ranks))))}</td>"
        f"<td class=num>{len(plan.tables[name].shards)}</td></tr>"
        for name in natural_sorted(plan.tables)
    )
    legend = "".join(
        f'<span><i style="background:{colour}"></i>{name}</span>'
        for name, colour in PERF_COLOURS.items()
        if name in summed
    )
    solver_rows = [
        ("status", report.status.value),
        ("objective (max rank perf)", f"{report.objective:.6g} ms"),
        ("lower bound", f"{report.lower_bound:.6g} ms ({report.lower_bound_source or '-'})"),
        ("gap", f"{report.gap:.2%}"),
        ("critical path", f"{report.critical_path:.6g} ms"),
        ("planner", plan.planner_version),
        ("request_hash", plan.request_hash),
    ]
    solver_table = "".join(
        f"<tr><th>{escape(key)}</th><td><code>{escape(value)}</code></td></tr>"
        for key, value in solver_rows
    )
    return f"""<!doctype html>
<html lang=en><head><meta charset=utf-8>
<title>shardplan plan {plan.plan_id[:12]}</title><style>{_STYLE}</style></head>
<body>
<h1>Sharding plan <code>{plan.plan_id}</code></h1>
<div>{len(plan.tables)} tables on {plan.world_size} ranks
({request.topology.compute_device.value}, {request.topology.local_world_size} per host),
cost model <code>{request.options.cost_model.value}</code></div>
<h2>Solver report</h2><table>{solver_table}</table>
<h2>Ranks</h2>
<div class=legend>perf (ms, bar relative to the most loaded rank): {legend}</div>
<div>consecutive ranks with identical rows share one row (<code>first-last</code>)</div>
<table><tr><th>ranks</th><th colspan=2>HBM GiB (% of usable)</th>
<th colspan=2>DDR GiB (% of usable)</th><th>perf by component</th><th>perf ms</th></tr>
{"".join(rows)}</table>
<p class=note>{escape(USABLE_NOTE)}.<br>{escape(perf_rule(cost_model))}.</p>
<h2>Tables</h2>
<table><tr><th>table</th><th>sharding type</th><th>compute kernel</th><th>ranks</th>
<th>shards</th></tr>{tables}</table>
</body></html>
"""


JOB_REFRESH_S = 2  # a job's page reloads itself this often while the job runs


def render_job_page(job: SolveJob) -> str:
    """An async solve's page (GET /v1/solves/{job_id}/view): its status and progress,
    reloaded every ``JOB_REFRESH_S`` by the browser while it runs (no scripts), and sent
    on to the plan's page once it is done."""
    refresh = ""
    if job.plan_id is not None:
        refresh = f'<meta http-equiv="refresh" content="0; url=/v1/plans/{job.plan_id}/view">'
    elif not job.status.ended:
        refresh = f'<meta http-equiv="refresh" content="{JOB_REFRESH_S}">'

    def number(value: float | None, unit: str) -> str:
        return "" if value is None else f"{value:.6g}{unit}"

    rows = [
        ("status", job.status.value),
        ("stage", job.stage or ""),
        ("objective", number(job.objective, " ms")),
        ("lower bound", number(job.lower_bound, " ms")),
        ("gap", "" if job.gap is None else f"{job.gap:.2%}"),
        ("elapsed", number(job.elapsed_s, " s")),
        ("time limit", number(job.time_limit_s, " s")),
        ("attempts", str(job.attempts)),
    ]
    table = "".join(f"<tr><th>{name}</th><td>{escape(value)}</td></tr>" for name, value in rows)
    outcome = ""
    if job.plan_id is not None:
        outcome = f'<p><a href="/v1/plans/{job.plan_id}/view">the plan</a></p>'
    elif job.problem is not None:
        title = escape(str(job.problem.get("title", "")))
        outcome = f"<h2>{title}</h2><pre>{escape(str(job.problem.get('detail', '')))}</pre>"
    return (
        f'<!doctype html><html><head><meta charset="utf-8">{refresh}'
        f"<title>solve {job.job_id[:12]}</title><style>{_STYLE}</style></head><body>"
        f"<h1>Solve <code>{job.job_id}</code></h1>"
        f'<p class="note">request {job.request_hash}, {escape(job.planner_version)}</p>'
        f"<table>{table}</table>{outcome}</body></html>"
    )
