"""Text and markdown tables, and the cells every rendered table shares: rank lists
("0-2,5"), a rank's use of a tier ("12.00 GiB (15.0%)"), and the short names of sharding
types ("TW")."""

from __future__ import annotations

from planner_service.plan.types import ShardingType
from planner_service.plan.units import percent, size

# How tables and pages name a sharding type where space is short.
SHARDING_TYPE_SHORT = {
    ShardingType.TABLE_WISE: "TW",
    ShardingType.ROW_WISE: "RW",
    ShardingType.COLUMN_WISE: "CW",
    ShardingType.TABLE_ROW_WISE: "TWRW",
    ShardingType.TABLE_COLUMN_WISE: "TWCW",
    ShardingType.DATA_PARALLEL: "DP",
}


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


def usage_cell(used_bytes: int, usable_bytes: int) -> str:
    """ "12.00 GiB (15.0%)": the bytes used, in the unit that shows them (``units.size``:
    a 1 MiB shard reads "1.00 MiB", not "0.00"), and the share of the usable capacity."""
    return f"{size(used_bytes)} ({percent(used_bytes, usable_bytes)})"
