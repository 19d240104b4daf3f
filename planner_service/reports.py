"""Documents and text rendered from planner results, for the CLI and the service.

Every place a plan is shown (``shardplan plan --format table``, ``options --format
table``, ``diff``, the plan page) prints it the same way: bytes in GiB (2^30, one helper,
``plan.units``), shares in percent of the rank's *usable* capacity (after the
reservation), every perf component with the rule that sums them into ``perf.total``
(``perf_rule``), and tables in natural order (``plan.order``: ``t2`` before ``t10``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from planner_service.costs.estimate import total_components
from planner_service.costs.options import DeviceClasses, Placement, ShardingOption, TableOptions
from planner_service.plan.api import RankHeadroom
from planner_service.plan.capacity import Capacity, usable_capacity
from planner_service.plan.diff import PlanDiff, RankChange, TableChange, TableStatus, diff_totals
from planner_service.plan.migrate import Migration, Pair
from planner_service.plan.order import natural_sorted
from planner_service.plan.types import (
    PERF_COMPONENTS,
    ComputeDevice,
    CostModel,
    ParameterSharding,
    PlanRequest,
    RankStats,
    ShardingPlan,
    TableProblem,
)
from planner_service.plan.units import MiB, gib_number, percent


def options_document(
    request: PlanRequest,
    tables: list[TableOptions],
    problems: list[TableProblem],
    capacities: list[Capacity],
) -> dict[str, Any]:
    """The JSON of ``shardplan options``: every table's options with per-shard estimates."""
    classes = DeviceClasses.of(request.topology)
    document: dict[str, Any] = {
        "cost_model": request.options.cost_model.value,
        "reservation": reservation_document(request, capacities),
        "tables": {
            entry.table.name: [_option_document(option, classes) for option in entry.options]
            for entry in tables
        },
        "problems": [problem.model_dump(mode="json") for problem in problems],
    }
    if len(classes.specs) > 1:
        document["device_classes"] = [
            {
                "ranks": rank_ranges(
                    [r for r, c in enumerate(classes.class_of_rank) if c == index]
                ),
                "hbm_bw_bytes_per_s": spec.hbm_bw_bytes_per_s,
                "ddr_bw_bytes_per_s": spec.ddr_bw_bytes_per_s,
            }
            for index, spec in enumerate(classes.specs)
        ]
    return document


def reservation_document(request: PlanRequest, capacities: list[Capacity]) -> dict[str, Any]:
    """What is held back on each rank and why, grouped by identical capacities."""
    tier = "HBM" if request.topology.compute_device is ComputeDevice.CUDA else "DDR"
    constraints = request.constraints
    groups: dict[tuple[int, int, int, int], list[int]] = {}
    for capacity in capacities:
        key = (
            capacity.hbm_bytes,
            capacity.ddr_bytes,
            capacity.headroom_bytes,
            capacity.dense_bytes,
        )
        groups.setdefault(key, []).append(capacity.rank)
    return {
        "tier": tier,
        "why": (
            f"hbm_headroom_fraction {constraints.hbm_headroom_fraction} of each rank's {tier} "
            "is kept free for allocator fragmentation, caches and estimate error; "
            f"dense_bytes_per_rank {constraints.dense_bytes_per_rank} is kept for the dense "
            "model (parameters, activations, optimizer state)"
        ),
        "ranks": [
            {
                "ranks": rank_ranges(ranks),
                "headroom_bytes": headroom,
                "dense_bytes": dense,
                "usable_hbm_bytes": hbm,
                "usable_ddr_bytes": ddr,
            }
            for (hbm, ddr, headroom, dense), ranks in groups.items()
        ],
    }


def _option_document(option: ShardingOption, classes: DeviceClasses) -> dict[str, Any]:
    fixed = option.placement is Placement.FIXED
    shards = []
    offsets = option.offsets()
    for index, shard in enumerate(option.shards):
        device_class = classes.class_of_rank[index] if fixed else 0
        entry: dict[str, Any] = {
            "offsets": list(offsets[index]),
            "sizes": list(shard.sizes),
            "perf": shard.perf[device_class].model_dump(mode="json"),
            "storage": {"hbm_bytes": shard.storage.hbm_bytes, "ddr_bytes": shard.storage.ddr_bytes},
        }
        if len(shard.perf) > 1 and not fixed:
            entry["perf_by_device_class"] = [perf.model_dump(mode="json") for perf in shard.perf]
        shards.append(entry)
    return {
        "sharding_type": option.sharding_type.value,
        "compute_kernel": option.compute_kernel.value,
        "cache_load_factor": option.cache_load_factor,
        "shards": shards,
    }


def rank_ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    parts: list[str] = []
    start = previous = None
    for rank in sorted(ranks):
        if previous is not None and rank == previous + 1:
            previous = rank
            continue
        if start is not None:
            parts.append(f"{start}" if start == previous else f"{start}-{previous}")
        start = previous = rank
    if start is not None:
        parts.append(f"{start}" if start == previous else f"{start}-{previous}")
    return ",".join(parts)


OPTION_COLUMNS = (
    "sharding type",
    "kernel",
    "shards",
    "shard rows x cols",
    "perf ms",
    "HBM GiB",
    "DDR GiB",
)


def options_table(request: PlanRequest, document: dict[str, Any]) -> str:
    """``shardplan options --format table``: the options document (``options_document``)
    as one table per table, in natural order, after what each rank offers."""
    sections = [_reservation_section(document["reservation"])]
    described = {table.name: table for table in request.tables}
    for name in natural_sorted(document["tables"]):
        table = described[name]
        title = (
            f"{name}: {table.num_embeddings:,} x {table.embedding_dim} {table.data_type.value}, "
            f"{len(document['tables'][name])} option(s)"
        )
        rows = [_option_row(option) for option in document["tables"][name]]
        sections.append(title + "\n" + text_table(list(OPTION_COLUMNS), rows))
    note = (
        "per option, its largest shard: the perf ms, HBM GiB and DDR GiB that the rank "
        "holding it bears (--format json: every shard, with perf components); shard rows x "
        "cols as count x rows x cols"
    )
    return "\n\n".join(sections) + "\n\n" + note + "\n"


def _reservation_section(reservation: dict[str, Any]) -> str:
    header = ["ranks", "usable HBM GiB", "usable DDR GiB", "headroom GiB", "dense GiB"]
    rows = [
        [
            group["ranks"],
            gib_number(group["usable_hbm_bytes"]),
            gib_number(group["usable_ddr_bytes"]),
            gib_number(group["headroom_bytes"]),
            gib_number(group["dense_bytes"]),
        ]
        for group in reservation["ranks"]
    ]
    return f"usable capacity per rank ({reservation['why']})\n" + text_table(header, rows)


def _option_row(option: dict[str, Any]) -> list[str]:
    shards = option["shards"]
    largest = max(shards, key=lambda shard: (shard["perf"]["total"], shard["sizes"]))
    sizes = Counter(tuple(shard["sizes"]) for shard in shards)
    kernel = option["compute_kernel"]
    if option["cache_load_factor"] is not None:
        kernel += f" (cache {option['cache_load_factor']:g})"
    return [
        option["sharding_type"],
        kernel,
        str(len(shards)),
        ", ".join(f"{count} x {rows} x {cols}" for (rows, cols), count in sizes.items()),
        f"{largest['perf']['total']:.4f}",
        gib_number(max(shard["storage"]["hbm_bytes"] for shard in shards)),
        gib_number(max(shard["storage"]["ddr_bytes"] for shard in shards)),
    ]


# --------------------------------------------------------------------------- plan tables

_TYPE_ABBREVIATIONS = {
    "table_wise": "TW",
    "row_wise": "RW",
    "column_wise": "CW",
    "table_row_wise": "TWRW",
    "table_column_wise": "TWCW",
    "data_parallel": "DP",
}
USABLE_NOTE = (
    "% of usable: of what the rank offers to tables after the reservation "
    "(hbm_headroom_fraction, dense_bytes_per_rank); GiB = 2^30 bytes"
)


def perf_rule(cost_model: CostModel) -> str:
    """How the perf components add up to ``perf.total`` under ``cost_model``, as a line
    printed under every table that shows them."""
    summed = total_components(cost_model)
    rule = f"perf ms = {' + '.join(summed)}"
    left_out = [name for name in PERF_COMPONENTS if name not in summed]
    if left_out:
        rule += f" ({', '.join(left_out)} is shown but not summed under cost model "
        rule += f"{cost_model.value}, as TorchRec does)"
    return rule


def plan_table(
    request: PlanRequest,
    plan: ShardingPlan,
    capacities: list[Capacity],
    rank_io_bytes: list[tuple[int, int]],
    wall_time_s: float,
) -> str:
    """A stats table like TorchRec's: per rank, per table, then the solver report."""
    sections = [
        _rank_section(request, plan, capacities, rank_io_bytes),
        _table_section(plan),
        _report_section(plan, wall_time_s),
    ]
    return "\n\n".join(sections) + "\n"


def _rank_section(
    request: PlanRequest,
    plan: ShardingPlan,
    capacities: list[Capacity],
    rank_io_bytes: list[tuple[int, int]],
) -> str:
    shard_counts: list[dict[str, int]] = [{} for _ in plan.rank_stats]
    for sharding in plan.tables.values():
        label = _TYPE_ABBREVIATIONS[sharding.sharding_type.value]
        for shard in sharding.shards:
            counts = shard_counts[shard.rank]
            counts[label] = counts.get(label, 0) + 1
    header = [
        "rank",
        "HBM GiB (% of usable)",
        "DDR GiB (% of usable)",
        "perf ms",
        *PERF_COMPONENTS,
        "input MiB",
        "output MiB",
        "shards",
    ]
    rows = []
    for stats in plan.rank_stats:
        capacity = capacities[stats.rank]
        io = rank_io_bytes[stats.rank] if stats.rank < len(rank_io_bytes) else (0, 0)
        rows.append(
            [
                str(stats.rank),
                usage_cell(stats.hbm_bytes, capacity.hbm_bytes),
                usage_cell(stats.ddr_bytes, capacity.ddr_bytes),
                f"{stats.perf.total:.4f}",
                *(f"{getattr(stats.perf, name):.4f}" for name in PERF_COMPONENTS),
                f"{io[0] / MiB:.2f}",
                f"{io[1] / MiB:.2f}",
                " ".join(f"{k}:{v}" for k, v in sorted(shard_counts[stats.rank].items())) or "-",
            ]
        )
    notes = [USABLE_NOTE, perf_rule(request.options.cost_model)]
    return text_table(header, rows) + "\n" + "\n".join(notes)


def usage_cell(used_bytes: int, usable_bytes: int) -> str:
    """ "12.00 (15.0%)": GiB used, and the share of the usable capacity."""
    return f"{gib_number(used_bytes)} ({percent(used_bytes, usable_bytes)})"


def _table_section(plan: ShardingPlan) -> str:
    header = ["table", "sharding type", "kernel", "shards", "ranks"]
    rows = []
    for name in natural_sorted(plan.tables):
        sharding = plan.tables[name]
        rows.append(
            [
                name,
                sharding.sharding_type.value,
                sharding.compute_kernel.value,
                str(len(sharding.shards)),
                rank_ranges(sorted(set(sharding.ranks))),
            ]
        )
    return text_table(header, rows)


def _report_section(plan: ShardingPlan, wall_time_s: float) -> str:
    report = plan.solver
    return "\n".join(
        [
            f"status        {report.status.value}",
            f"objective     {report.objective:.6f} ms (max over ranks of perf total)",
            f"lower bound   {report.lower_bound:.6f} ms ({report.lower_bound_source})",
            f"gap           {report.gap:.4%}",
            f"critical path {report.critical_path:.6f} ms",
            f"wall time     {wall_time_s:.2f} s",
            f"plan_id       {plan.plan_id}",
        ]
    )


# --------------------------------------------------------------------------- renderers


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell, `` | `` between them, a rule under the header."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in [header, *rows]
    ]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table (``|`` in cells escaped)."""

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *(line(row) for row in rows)])


# --------------------------------------------------------------------------- plan diffs


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
        f"moved: {gib_number(diff.moved_bytes)} GiB of "
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
    header = ["table", "status", "sharding type", "kernel", "ranks", "shards", "moved GiB"]
    rows = [
        [
            change.name,
            change.status,
            _old_to_new(change, lambda s: s.sharding_type.value),
            _old_to_new(change, lambda s: s.compute_kernel.value),
            _old_to_new(change, lambda s: rank_ranges(sorted(set(s.ranks)))),
            _old_to_new(change, lambda s: str(len(s.shards))),
            gib_number(change.moved_bytes),
        ]
        for change in diff.tables
    ]
    return header, rows


def _old_to_new(change: TableChange, show: Callable[[ParameterSharding], str]) -> str:
    """ "old -> new" where they differ, the value alone where not, "-" for no table."""
    before = show(change.old) if change.old is not None else "-"
    after = show(change.new) if change.new is not None else "-"
    return before if before == after else f"{before} -> {after}"


def _diff_totals(diff: PlanDiff) -> tuple[list[str], list[list[str]]]:
    totals = diff_totals(diff)
    rows = []
    for label, key in [
        ("HBM GiB, all ranks", "hbm_bytes"),
        ("DDR GiB, all ranks", "ddr_bytes"),
        ("max rank perf ms", "max_rank_perf_ms"),
        ("critical path ms", "critical_path_ms"),
    ]:
        show, signed = (_gib, _signed_gib) if key.endswith("bytes") else (_ms, _signed_ms)
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
        "HBM GiB",
        "HBM change",
        "perf ms",
        "perf change",
        "in GiB",
        "sent GiB",
        "out GiB",
    ]
    rows = [
        [
            str(rank.rank),
            f"{_stat(rank.old, _gib, 'hbm_bytes')} -> {_stat(rank.new, _gib, 'hbm_bytes')}",
            _signed_gib(rank.hbm_delta),
            f"{_stat(rank.old, _ms, 'perf')} -> {_stat(rank.new, _ms, 'perf')}",
            _signed_ms(rank.perf_delta),
            _gib(rank.bytes_in),
            _gib(rank.bytes_sent),
            _gib(rank.bytes_out),
        ]
        for rank in ranks
    ]
    return header, rows


def _stat(stats: RankStats | None, show: Callable[[float], str], name: str) -> str:
    """A rank's ``hbm_bytes`` or ``perf`` total as shown, "-" for a rank the plan lacks."""
    if stats is None:
        return "-"
    return show(stats.perf.total if name == "perf" else getattr(stats, name))


def _gib(num_bytes: float) -> str:
    return gib_number(int(num_bytes))


def _signed_gib(num_bytes: float) -> str:
    return "+" + _gib(num_bytes) if num_bytes > 0 else _gib(num_bytes)


def _ms(value: float) -> str:
    return f"{value:.4f}"


def _signed_ms(value: float) -> str:
    return f"{value:+.4f}" if value else "0.0000"


# --------------------------------------------------------------------------- migrations

MAX_TABLE_NAMES = 3  # a pair's tables shown by name; the rest counted


def migrate_report(migration: Migration, *, top: int) -> str:
    """``shardplan migrate`` as text: the two plans, what an element weighs, the bytes
    that move, the ``top`` pairs of ranks by bytes, and every rank's bytes sent and
    received."""
    old, new = migration.old, migration.new
    lines = [
        f"old {old.plan_id[:12]} ({old.world_size} ranks, {len(old.tables)} tables)",
        f"new {new.plan_id[:12]} ({new.world_size} ranks, {len(new.tables)} tables)",
    ]
    if old.world_size != new.world_size:
        lines.append(f"world size changes: {old.world_size} -> {new.world_size} ranks")
    lines.append(f"bytes: {_element_line(migration)}")
    if not migration.transfers:
        lines.append("nothing moves: every rank already holds what the new plan places on it")
    else:
        pairs = migration.pairs()
        lines.append(
            f"moved: {gib_number(migration.moved_bytes)} GiB ({migration.moved_bytes} bytes), "
            f"{len(migration.transfers)} region(s) of {len(migration.tables_moved)} table(s) "
            f"between {len(pairs)} pair(s) of ranks"
        )
    added, removed = migration.tables_added, migration.tables_removed
    if added or removed:
        lines.append(
            f"tables: {len(added)} added (made new, not moved), {len(removed)} removed (dropped)"
        )
    sections = ["\n".join(lines)]
    if migration.transfers:
        sections.append(_pairs_section(migration.pairs(), top))
        sections.append(text_table(*_migrate_ranks(migration)))
    return "\n\n".join(sections) + "\n"


def _element_line(migration: Migration) -> str:
    if migration.from_request:
        weights = "the tables' data types (--request)"
        state = "their optimizers' state"
    else:
        weights = "4 bytes (fp32)"
        state = "no optimizer state (sgd)"
    if migration.optimizer is not None:
        state = f"{migration.optimizer.value} state (--optimizer)"
    hints = []
    if not migration.from_request:
        hints.append("--request: the tables' data types and optimizers")
    if migration.optimizer is None:
        hints.append("--optimizer: another optimizer's state")
    return "; ".join([f"weights at {weights}, {state}", *hints])


def _pairs_section(pairs: list[Pair], top: int) -> str:
    shown = pairs[:top]
    header = ["from -> to", "GiB", "bytes", "tables"]
    rows = [
        [
            f"{pair.src} -> {pair.dst}",
            gib_number(pair.bytes),
            str(pair.bytes),
            _names(pair.tables),
        ]
        for pair in shown
    ]
    section = text_table(header, rows)
    if len(shown) < len(pairs):
        section += f"\n{len(pairs) - len(shown)} more pair(s) (--top N shows N)"
    return section


def _names(names: list[str]) -> str:
    if len(names) <= MAX_TABLE_NAMES:
        return ", ".join(names)
    return ", ".join(names[:MAX_TABLE_NAMES]) + f" and {len(names) - MAX_TABLE_NAMES} more"


def _migrate_ranks(migration: Migration) -> tuple[list[str], list[list[str]]]:
    header = ["rank", "sent GiB", "received GiB", "sent bytes", "received bytes"]
    rows = []
    sent_by_rank, received_by_rank = migration.sent(), migration.received()
    for rank in range(migration.world_size):
        sent, received = sent_by_rank.get(rank, 0), received_by_rank.get(rank, 0)
        if sent or received:
            rows.append(
                [str(rank), gib_number(sent), gib_number(received), str(sent), str(received)]
            )
    return header, rows


# --------------------------------------------------------------------------- headroom


def rank_headroom(request: PlanRequest, plan: ShardingPlan) -> list[RankHeadroom]:
    """Every rank's headroom under ``plan`` (``POST /v1/check`` and ``shardplan check``);
    usable is what the rank offers after the reservation (``plan/capacity.py``)."""
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
