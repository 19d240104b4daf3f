"""``shardplan migrate`` as text: the two plans, what an element weighs, the bytes that
move, the pairs of ranks that move most, and every rank's bytes sent and received."""

from __future__ import annotations

from planner_service.plan.migrate import Migration, Pair
from planner_service.plan.units import size
from planner_service.reports.tables import text_table

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
            f"moved: {size(migration.moved_bytes)} ({migration.moved_bytes} bytes), "
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
    header = ["from -> to", "size", "bytes", "tables"]
    rows = [
        [
            f"{pair.src} -> {pair.dst}",
            size(pair.bytes),
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
    header = ["rank", "sent", "received", "sent bytes", "received bytes"]
    rows = []
    sent_by_rank, received_by_rank = migration.sent(), migration.received()
    for rank in range(migration.world_size):
        sent, received = sent_by_rank.get(rank, 0), received_by_rank.get(rank, 0)
        if sent or received:
            rows.append([str(rank), size(sent), size(received), str(sent), str(received)])
    return header, rows
