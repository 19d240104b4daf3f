"""``shardplan check``'s what-if answers as text or markdown tables: the sweep's matrix
(each cell a check in a few words) and the least world size per HBM size."""

from __future__ import annotations

from planner_service.check.what_if import LeastWorldSize, LeastWorldSizes, Sweep
from planner_service.plan.api import CheckReport, Verdict
from planner_service.plan.units import size
from planner_service.reports.tables import markdown_table, text_table


def cell_summary(report: CheckReport) -> str:
    """A check in a few words: max-rank perf and the least headroom, or why it fails."""
    if report.verdict is Verdict.NO_PLAN:
        assert report.infeasibility is not None
        fix = report.infeasibility.fixes.min_world_size
        return f"no plan (world_size {fix} fits)" if fix is not None else "no plan"
    assert report.headroom is not None and report.objective is not None
    least = report.headroom.least
    if report.verdict is Verdict.OVER_LIMIT:
        worst = report.over_limit[0]
        return f"over: rank {worst.rank} at {worst.utilization:.1%}, {report.objective:.4g} ms"
    share = least.free_bytes / least.usable_bytes if least.usable_bytes else 0.0
    return f"{report.objective:.4g} ms, {size(least.free_bytes)} free ({share:.0%})"


def least_summary(row: LeastWorldSize) -> str:
    """A least world size in a few words: the size and its check, or how far none was."""
    if row.min_world_size is None:
        return f"none up to {row.searched_up_to}"
    assert row.check is not None
    return f"world_size {row.min_world_size}: {cell_summary(row.check)}"


def outcome_summary(outcome: CheckReport | LeastWorldSize) -> str:
    """A finished what-if cell in a few words, for a progress line."""
    if isinstance(outcome, LeastWorldSize):
        return least_summary(outcome)
    return cell_summary(outcome)


def sweep_table(result: Sweep, markdown: bool) -> str:
    header = ["world size", *(f"HBM {size(hbm)}" for hbm in result.hbm_bytes)]
    by_cell = {(c.world_size, c.hbm_bytes): c.check for c in result.cells}
    rows = [
        [str(size), *(cell_summary(by_cell[size, hbm]) for hbm in result.hbm_bytes)]
        for size in result.world_sizes
    ]
    legend = (
        f"world sizes in hosts of {result.local_world_size} ranks, as the request's; each "
        "cell: max-rank perf (ms per iteration) and the least headroom (free of a rank's "
        "usable memory), or why the check fails; "
        f"each a solve of up to {result.time_limit_s:g} s"
    )
    return _table(header, rows, legend, markdown)


def least_table(result: LeastWorldSizes, markdown: bool) -> str:
    header = ["HBM per rank", "least world size", "there: max-rank perf, least headroom"]
    rows = []
    for row in result.rows:
        if row.min_world_size is None:
            rows.append([size(row.hbm_bytes), f"none up to {row.searched_up_to}", "-"])
        else:
            assert row.check is not None
            rows.append([size(row.hbm_bytes), str(row.min_world_size), cell_summary(row.check)])
    legend = "the fewest ranks at which the planner found a plan"
    return _table(header, rows, legend, markdown)


def _table(header: list[str], rows: list[list[str]], legend: str, markdown: bool) -> str:
    if not markdown:
        return text_table(header, rows) + f"\n({legend})\n"
    return markdown_table(header, rows) + f"\n\n{legend[0].upper()}{legend[1:]}.\n"
