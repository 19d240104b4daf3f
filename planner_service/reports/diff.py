"""``shardplan diff`` as text or markdown: a verdict, the tables placed differently, the
totals before and after, and the ranks whose estimates change most."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from planner_service.plan.diff import PlanDiff, RankChange, TableChange, TableStatus, diff_totals
from planner_service.plan.types import RankStats, ShardingPlan, TableShardingModel
from planner_service.plan.units import size
from planner_service.reports.tables import markdown_table, rank_ranges, text_table


def diff_report(diff: PlanDiff, *, top: int, markdown: bool) -> str:
    """``shardplan diff`` as text or markdown: a verdict, the tables placed differently,
    the totals before and after, and the ``top`` ranks whose estimates change most."""
    table = markdown_table if markdown else text_table
    sections = ["\n".join(_diff_summary(diff, markdown))]
    if diff.tables:
        sections.append(table(*_diff_tables(diff)))
    sections.append(table(*_diff_totals(diff)))
    changed = [rank for rank in diff.ranks if rank.changed]
    if changed:
        shown = _top_ranks(changed, top)
        section = table(*_diff_ranks(shown))
        if len(shown) < len(changed):
            section += f"\n{len(changed) - len(shown)} more rank(s) changed (--top N shows N)"
        sections.append(section)
    return "\n\n".join(sections) + "\n"


def _diff_summary(diff: PlanDiff, markdown: bool) -> list[str]:
    verdict = (
        "plans are identical: every table placed the same way, every rank estimated the same"
        if diff.identical
        else "plans differ"
    )
    counts = Counter(change.status for change in diff.tables)
    assumed = "" if diff.element_bytes_from_request else " (4-byte elements; --request: exact)"
    details = [
        f"old {_plan_line(diff.old)}",
        f"new {_plan_line(diff.new)}",
        f"tables: {counts[TableStatus.CHANGED]} changed, {counts[TableStatus.ADDED]} added, "
        f"{counts[TableStatus.REMOVED]} removed, {diff.unchanged_tables} unchanged",
        f"moved: {size(diff.moved_bytes)} of "
        f"{'weights and optimizer state' if diff.element_bytes_from_request else 'weights'} "
        f"to ranks that did not hold them{assumed}",
    ]
    if markdown:
        return [f"**{verdict}**", "", *(f"- {line}" for line in details)]
    return [verdict, *details]


def _plan_line(plan: ShardingPlan) -> str:
    return (
        f"{plan.plan_id[:12]} ({plan.planner_version}, {plan.world_size} ranks, "
        f"{len(plan.tables)} tables, {plan.solver.status.value})"
    )


def _diff_tables(diff: PlanDiff) -> tuple[list[str], list[list[str]]]:
    header = ["table", "status", "sharding type", "kernel", "ranks", "shards", "moved"]
    rows = [
        [
            change.name,
            change.status,
            _old_to_new(change, lambda s: s.sharding_type.value),
            _old_to_new(change, lambda s: s.compute_kernel.value),
            _old_to_new(change, lambda s: rank_ranges(sorted(set(s.ranks)))),
            _old_to_new(change, lambda s: str(len(s.shards))),
            size(change.moved_bytes),
        ]
        for change in diff.tables
    ]
    return header, rows


def _old_to_new(change: TableChange, show: Callable[[TableShardingModel], str]) -> str:
    """ "old -> new" where they differ, the value alone where not, "-" for no table."""
    before = show(change.old) if change.old is not None else "-"
    after = show(change.new) if change.new is not None else "-"
    return before if before == after else f"{before} -> {after}"


def _diff_totals(diff: PlanDiff) -> tuple[list[str], list[list[str]]]:
    totals = diff_totals(diff)
    rows = []
    for label, key in [
        ("HBM, all ranks", "hbm_bytes"),
        ("DDR, all ranks", "ddr_bytes"),
        ("max rank perf ms", "max_rank_perf_ms"),
        ("critical path ms", "critical_path_ms"),
    ]:
        show, signed = (size, _signed_size) if key.endswith("bytes") else (_ms, _signed_ms)
        entry = getattr(totals, key)
        rows.append([label, show(entry.old), show(entry.new), signed(entry.delta)])
    return ["total", "old", "new", "change"], rows


def _top_ranks(changed: list[RankChange], top: int) -> list[RankChange]:
    """The ``top`` ranks whose time changes most, then whose HBM does, in rank order."""
    ordered = sorted(
        changed, key=lambda r: (-abs(r.perf_delta), -abs(r.hbm_delta), -r.bytes_in, r.rank)
    )
    return sorted(ordered[:top], key=lambda r: r.rank)


def _diff_ranks(ranks: list[RankChange]) -> tuple[list[str], list[list[str]]]:
    header = [
        "rank",
        "HBM",
        "HBM change",
        "perf ms",
        "perf change",
        "in",
        "sent",
        "out",
    ]
    rows = [
        [
            str(rank.rank),
            f"{_stat(rank.old, size, 'hbm_bytes')} -> {_stat(rank.new, size, 'hbm_bytes')}",
            _signed_size(rank.hbm_delta),
            f"{_stat(rank.old, _ms, 'perf')} -> {_stat(rank.new, _ms, 'perf')}",
            _signed_ms(rank.perf_delta),
            size(rank.bytes_in),
            size(rank.bytes_sent),
            size(rank.bytes_out),
        ]
        for rank in ranks
    ]
    return header, rows


def _stat(stats: RankStats | None, show: Callable[[float], str], name: str) -> str:
    """A rank's ``hbm_bytes`` or ``perf`` total as shown, "-" for a rank the plan lacks."""
    if stats is None:
        return "-"
    return show(stats.perf.total if name == "perf" else getattr(stats, name))


def _signed_size(num_bytes: float) -> str:
    return "+" + size(num_bytes) if num_bytes > 0 else size(num_bytes)


def _ms(value: float) -> str:
    return f"{value:.4f}"


def _signed_ms(value: float) -> str:
    return f"{value:+.4f}" if value else "0.0000"
