"""What changes between two plans: the tables placed differently, the bytes that move
between ranks to get from one to the other, and every rank's memory and time before and
after.

Moved bytes (``table_moves``, ``plan_moves``: the one definition that the solver's
``migration`` report, ``shardplan diff`` and re-sharding use) are counted region by
region. For every shard of the new plan, each part of it (rows x columns of its table)
that its rank did not hold in the old plan, but some other rank did, is sent by that rank
and received by this one; what a rank held and still holds does not move. So a shard that
moves from rank 2 to rank 5 moves all its bytes once, a row-wise table re-split over more
ranks moves only the rows whose rank changes, and a table-wise table that becomes
data-parallel on 4 ranks moves three copies. Where the old plan replicates a table
(data-parallel), a rank without a replica receives from replica ``rank mod replicas`` (in
rank order), which spreads the sending. Parts of a new shard that no rank held (rows or
columns a grown table gained) are new, not moved; tables added or removed are listed, not
counted. A moved region of r rows and c columns counts ``r * c * element bytes`` of
weights plus the optimizer state of those rows and columns (``OptimizerType.state_bytes``:
4 bytes per row for rowwise_adagrad, 4 per element for adagrad, 8 for adam) where the
request is known; without it, 4-byte weights and no state. ``bytes_out`` of a rank is
what it held before and no longer holds (memory freed, weights only).

The regions themselves are ``table_transfers`` and ``plan_transfers``: one ``Transfer``
(table, sending rank, receiving rank, rows and columns of the table, bytes) per new shard
and source shard that overlap; ``table_moves`` sums them, and ``shardplan migrate`` and the
runtime's re-sharding in place move exactly them. ``table_kept`` lists the regions a rank
keeps.

The JSON form (``diff_document``) is documented in docs/reading-plans.md, "Comparing two
plans"; its ``version`` changes when a field changes meaning or goes away.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from planner_service.plan.order import natural_sorted
from planner_service.plan.types import (
    OptimizerType,
    ParameterSharding,
    PlanRequest,
    RankStats,
    Shard,
    ShardingPlan,
    ShardingType,
)

# 2: moved bytes count optimizer state (with --request), exclude rows no rank held, and
# ranks report bytes_sent.
DIFF_VERSION = 2
ASSUMED_ELEMENT_BYTES = 4  # fp32, the request format's default data type


@dataclass(frozen=True)
class TableChange:
    """One table placed differently: which aspects changed, and the weights that move."""

    name: str
    status: str  # "changed", "added" or "removed"
    changes: tuple[str, ...]  # of sharding_type, compute_kernel, ranks, shards, cache_load_factor
    old: ParameterSharding | None
    new: ParameterSharding | None
    moved_elements: int = 0
    moved_bytes: int = 0


@dataclass(frozen=True)
class RankChange:
    """One rank's estimates in both plans (None where the plan has no such rank), the
    bytes it receives and sends, and the weight bytes it gives up."""

    rank: int
    old: RankStats | None
    new: RankStats | None
    bytes_in: int = 0
    bytes_out: int = 0
    bytes_sent: int = 0

    @property
    def hbm_delta(self) -> int:
        return _hbm(self.new) - _hbm(self.old)

    @property
    def ddr_delta(self) -> int:
        return _ddr(self.new) - _ddr(self.old)

    @property
    def perf_delta(self) -> float:
        return _perf(self.new) - _perf(self.old)

    @property
    def changed(self) -> bool:
        return (
            self.old != self.new or self.bytes_in > 0 or self.bytes_out > 0 or self.bytes_sent > 0
        )


@dataclass(frozen=True)
class PlanDiff:
    old: ShardingPlan
    new: ShardingPlan
    tables: list[TableChange]  # changed, added and removed tables, in natural order
    unchanged_tables: int
    ranks: list[RankChange]  # every rank of either plan, in rank order
    element_bytes_from_request: bool

    @property
    def identical(self) -> bool:
        """Every table placed the same way and every rank estimated the same. The solver
        report and planner version may still differ (shown, not counted)."""
        return not self.tables and not any(rank.changed for rank in self.ranks)

    @property
    def moved_bytes(self) -> int:
        return sum(table.moved_bytes for table in self.tables)

    @property
    def moved_elements(self) -> int:
        return sum(table.moved_elements for table in self.tables)


def diff_plans(
    old: ShardingPlan, new: ShardingPlan, request: PlanRequest | None = None
) -> PlanDiff:
    """Compare ``old`` with ``new``; ``request`` (the new plan's) gives element sizes."""
    elements = elements_of(request)
    bytes_in: dict[int, int] = defaultdict(int)
    bytes_out: dict[int, int] = defaultdict(int)
    bytes_sent: dict[int, int] = defaultdict(int)
    tables: list[TableChange] = []
    unchanged = 0
    for name in natural_sorted(old.tables.keys() | new.tables.keys()):
        before, after = old.tables.get(name), new.tables.get(name)
        if before is None or after is None:
            status = "added" if before is None else "removed"
            tables.append(TableChange(name, status, (), before, after))
            continue
        changes = _changes(before, after)
        if not changes:
            unchanged += 1
            continue
        element = elements.get(name, Element())
        moves = sharding_moves(before, after, element)
        for rank, count in moves.received.items():
            bytes_in[rank] += count
        for rank, count in moves.sent.items():
            bytes_sent[rank] += count
        for rank, count in _missing(before.shards, after.shards).items():
            bytes_out[rank] += count * element.weight_bytes
        tables.append(
            TableChange(name, "changed", changes, before, after, moves.elements, moves.moved_bytes)
        )
    ranks = _ranks(old, new, bytes_in, bytes_out, bytes_sent)
    return PlanDiff(old, new, tables, unchanged, ranks, bool(request))


# --------------------------------------------------------------------------- moved bytes

# A shard as (row offset, column offset, rows, columns, rank).
Box = tuple[int, int, int, int, int]


@dataclass(frozen=True)
class Element:
    """What one element of a table weighs when it moves: its weight's bytes, and the
    optimizer whose state moves with it."""

    weight_bytes: int = ASSUMED_ELEMENT_BYTES
    optimizer: OptimizerType = OptimizerType.SGD

    def region_bytes(self, rows: int, cols: int) -> int:
        return rows * cols * self.weight_bytes + self.optimizer.state_bytes(rows, cols)


@dataclass(frozen=True)
class TableMoves:
    """The bytes each rank sends and receives for one table, and the elements moved."""

    sent: dict[int, int] = field(default_factory=dict)
    received: dict[int, int] = field(default_factory=dict)
    elements: int = 0

    @property
    def moved_bytes(self) -> int:
        return sum(self.received.values())


NO_MOVES = TableMoves()


def boxes(sharding: ParameterSharding) -> list[Box]:
    return [(*shard.offsets, *shard.sizes, shard.rank) for shard in sharding.shards]


@dataclass(frozen=True)
class Transfer:
    """One rectangle of a table that one rank sends another: rows ``[start, end)`` by
    columns ``[start, end)`` of the full table, and its bytes (weights plus optimizer
    state, ``Element.region_bytes``)."""

    table: str
    src: int  # the rank sending it (it held the region in the old plan)
    dst: int  # the rank receiving it (it holds the region in the new plan)
    rows: tuple[int, int]
    cols: tuple[int, int]
    bytes: int

    @property
    def elements(self) -> int:
        return (self.rows[1] - self.rows[0]) * (self.cols[1] - self.cols[0])


def table_transfers(
    table: str,
    old: Sequence[Box],
    new: Sequence[Box],
    *,
    old_replicated: bool,
    element: Element,
) -> list[Transfer]:
    """The regions that move to turn table shards ``old`` into ``new`` (module docstring),
    one per new shard and source shard that overlap: new shards in the order given, then
    sources in old order. ``old_replicated``: every old shard is a whole replica
    (data-parallel)."""
    transfers = []
    for src, dst, rows, cols in _regions(old, new, old_replicated):
        size = element.region_bytes(rows[1] - rows[0], cols[1] - cols[0])
        transfers.append(Transfer(table, src, dst, rows, cols, size))
    return transfers


def _regions(
    old: Sequence[Box], new: Sequence[Box], old_replicated: bool
) -> Iterator[tuple[int, int, tuple[int, int], tuple[int, int]]]:
    """``table_transfers``' regions as (sending rank, receiving rank, rows, columns): the
    one definition of what moves, which ``table_moves`` sums without making objects."""
    if sorted(old) == sorted(new):
        return
    held = {box[4] for box in old}
    replicas = sorted(old, key=lambda box: box[4]) if old_replicated else []
    index = _RowIndex(old)
    for box in new:
        rank = box[4]
        if old_replicated:
            sources = [] if rank in held else [replicas[rank % len(replicas)]]
        else:
            sources = [other for other in index.overlapping(box) if other[4] != rank]
        for source in sources:
            region = _overlap_region(box, source)
            if region is not None:
                yield source[4], rank, *region


class _RowIndex:
    """A table's shards by first row, to find those whose rows can meet a box's without
    trying every shard (row-wise on 128 ranks: 2 or 3 of 128); a few shards are all
    tried, which is quicker than searching."""

    SEARCHED_FROM = 16  # shards

    def __init__(self, shards: Sequence[Box]) -> None:
        self.shards = shards
        self.searched = len(shards) >= self.SEARCHED_FROM
        self.order = sorted(range(len(shards)), key=lambda i: shards[i][0]) if self.searched else []
        self.starts = [shards[i][0] for i in self.order]
        self.tallest = max((box[2] for box in shards), default=0)

    def overlapping(self, box: Box) -> Sequence[Box]:
        """The shards whose rows may meet ``box``'s, in the order given (a shard that
        starts ``tallest`` rows or more before ``box`` ends before it)."""
        if not self.searched:
            return self.shards
        first = bisect_right(self.starts, box[0] - self.tallest)
        last = bisect_left(self.starts, box[0] + box[2])
        return [self.shards[i] for i in sorted(self.order[first:last])]


def table_kept(
    old: Sequence[Box], new: Sequence[Box]
) -> list[tuple[int, tuple[int, int], tuple[int, int]]]:
    """The regions each new shard's rank already holds, as ``(rank, rows, columns)``
    (ranges ``[start, end)`` of the full table): its overlap with every old shard on the
    same rank, new shards in the order given, then old shards in old order. With
    ``table_transfers``, and the parts no rank held, these cover every new shard."""
    kept: list[tuple[int, tuple[int, int], tuple[int, int]]] = []
    index = _RowIndex(old)
    for box in new:
        for other in index.overlapping(box):
            if other[4] == box[4]:
                region = _overlap_region(box, other)
                if region is not None:
                    kept.append((box[4], *region))
    return kept


def table_moves(
    old: Sequence[Box], new: Sequence[Box], *, old_replicated: bool, element: Element
) -> TableMoves:
    """The bytes each rank sends and receives to turn ``old`` into ``new``: the sums of
    ``table_transfers`` (the same regions)."""
    sent: dict[int, int] = defaultdict(int)
    received: dict[int, int] = defaultdict(int)
    elements = 0
    for src, dst, rows, cols in _regions(old, new, old_replicated):
        size = element.region_bytes(rows[1] - rows[0], cols[1] - cols[0])
        sent[src] += size
        received[dst] += size
        elements += (rows[1] - rows[0]) * (cols[1] - cols[0])
    if not elements:
        return NO_MOVES
    return TableMoves(dict(sent), dict(received), elements)


def _overlap_region(a: Box, b: Box) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The rows and columns (``[start, end)`` of the table) two boxes of one table have
    in common, or None."""
    rows = (max(a[0], b[0]), min(a[0] + a[2], b[0] + b[2]))
    cols = (max(a[1], b[1]), min(a[1] + a[3], b[1] + b[3]))
    if rows[1] <= rows[0] or cols[1] <= cols[0]:
        return None
    return rows, cols


@dataclass(frozen=True)
class PlanMoves:
    """Every table's moves from an old plan to new tables, and their sums per rank."""

    tables: dict[str, TableMoves]
    sent: dict[int, int]
    received: dict[int, int]

    @property
    def moved_bytes(self) -> int:
        return sum(self.received.values())

    @property
    def tables_moved(self) -> int:
        return sum(1 for moves in self.tables.values() if moves.elements)


def elements_of(request: PlanRequest | None) -> dict[str, Element]:
    """Each table's ``Element`` from the request (none without one: 4-byte weights)."""
    if request is None:
        return {}
    return {t.name: Element(t.data_type.size_bytes, t.optimizer) for t in request.tables}


def sharding_moves(
    before: ParameterSharding, after: ParameterSharding, element: Element
) -> TableMoves:
    replicated = before.sharding_type is ShardingType.DATA_PARALLEL
    return table_moves(boxes(before), boxes(after), old_replicated=replicated, element=element)


def plan_moves(
    old: ShardingPlan,
    new_tables: Mapping[str, ParameterSharding],
    request: PlanRequest | None = None,
) -> PlanMoves:
    """The moves from ``old`` to ``new_tables`` (a plan's tables) for tables in both."""
    elements = elements_of(request)
    tables: dict[str, TableMoves] = {}
    sent: dict[int, int] = defaultdict(int)
    received: dict[int, int] = defaultdict(int)
    for name, after in new_tables.items():
        before = old.tables.get(name)
        if before is None:
            continue
        moves = sharding_moves(before, after, elements.get(name, Element()))
        tables[name] = moves
        for rank, count in moves.sent.items():
            sent[rank] += count
        for rank, count in moves.received.items():
            received[rank] += count
    return PlanMoves(tables, dict(sent), dict(received))


def plan_transfers(
    old: ShardingPlan,
    new_tables: Mapping[str, ParameterSharding],
    request: PlanRequest | None = None,
    *,
    elements: Mapping[str, Element] | None = None,
) -> list[Transfer]:
    """Every region that moves from ``old`` to ``new_tables`` (a plan's tables), for tables
    in both: tables in ``new_tables`` order, each as ``table_transfers`` orders it. Element
    sizes from ``elements`` when given, else from ``request`` (the new plan's), else 4-byte
    weights and no optimizer state; ``plan_moves`` sums the same regions."""
    sizes = elements_of(request) if elements is None else elements
    transfers: list[Transfer] = []
    for name, after in new_tables.items():
        before = old.tables.get(name)
        if before is not None:
            transfers += sharding_transfers(name, before, after, sizes.get(name, Element()))
    return transfers


def sharding_transfers(
    name: str, before: ParameterSharding, after: ParameterSharding, element: Element
) -> list[Transfer]:
    replicated = before.sharding_type is ShardingType.DATA_PARALLEL
    return table_transfers(
        name, boxes(before), boxes(after), old_replicated=replicated, element=element
    )


def migration_data(
    moves: PlanMoves,
    previous_plan_id: str,
    max_moved_bytes: int | None,
    move_cost_ms_per_gib: float | None,
) -> dict[str, Any]:
    """A plan's ``migration`` section (``types.Migration``) as JSON data."""
    ranks = sorted(moves.sent.keys() | moves.received.keys())
    return {
        "previous_plan_id": previous_plan_id,
        "moved_bytes": moves.moved_bytes,
        "tables_moved": moves.tables_moved,
        "ranks": [
            {
                "rank": rank,
                "sent_bytes": moves.sent.get(rank, 0),
                "received_bytes": moves.received.get(rank, 0),
            }
            for rank in ranks
        ],
        "max_moved_bytes": max_moved_bytes,
        "move_cost_ms_per_gib": move_cost_ms_per_gib,
    }


def _changes(before: ParameterSharding, after: ParameterSharding) -> tuple[str, ...]:
    aspects = ("sharding_type", "compute_kernel", "ranks", "shards", "cache_load_factor")
    return tuple(aspect for aspect in aspects if getattr(before, aspect) != getattr(after, aspect))


def _missing(shards: list[Shard], held: list[Shard]) -> dict[int, int]:
    """Per rank, the elements of ``shards`` that the same rank does not hold in ``held``."""
    held_by_rank: dict[int, list[Shard]] = defaultdict(list)
    for shard in held:
        held_by_rank[shard.rank].append(shard)
    missing: dict[int, int] = defaultdict(int)
    for shard in shards:
        kept = sum(_overlap(shard, other) for other in held_by_rank.get(shard.rank, ()))
        if _area(shard) > kept:
            missing[shard.rank] += _area(shard) - kept
    return missing


def _area(shard: Shard) -> int:
    return shard.sizes[0] * shard.sizes[1]


def _overlap(a: Shard, b: Shard) -> int:
    """Elements two shards of one table have in common (shards are rectangles)."""
    extents = []
    for axis in (0, 1):
        start = max(a.offsets[axis], b.offsets[axis])
        end = min(a.offsets[axis] + a.sizes[axis], b.offsets[axis] + b.sizes[axis])
        extents.append(max(0, end - start))
    return extents[0] * extents[1]


def _ranks(
    old: ShardingPlan,
    new: ShardingPlan,
    bytes_in: dict[int, int],
    bytes_out: dict[int, int],
    bytes_sent: dict[int, int],
) -> list[RankChange]:
    before = {stats.rank: stats for stats in old.rank_stats}
    after = {stats.rank: stats for stats in new.rank_stats}
    return [
        RankChange(
            rank,
            before.get(rank),
            after.get(rank),
            bytes_in[rank],
            bytes_out[rank],
            bytes_sent[rank],
        )
        for rank in range(max(old.world_size, new.world_size))
    ]


def _hbm(stats: RankStats | None) -> int:
    return stats.hbm_bytes if stats else 0


def _ddr(stats: RankStats | None) -> int:
    return stats.ddr_bytes if stats else 0


def _perf(stats: RankStats | None) -> float:
    return stats.perf.total if stats else 0.0


# --------------------------------------------------------------------------- JSON


def diff_document(diff: PlanDiff) -> dict[str, Any]:
    """The stable JSON form of a diff (docs/reading-plans.md, "Comparing two plans")."""
    return {
        "version": DIFF_VERSION,
        "identical": diff.identical,
        "old": _plan_summary(diff.old),
        "new": _plan_summary(diff.new),
        "element_bytes": "request" if diff.element_bytes_from_request else "assumed_fp32",
        "moved_bytes": diff.moved_bytes,
        "moved_elements": diff.moved_elements,
        "unchanged_tables": diff.unchanged_tables,
        "tables": [_table_document(table) for table in diff.tables],
        "ranks": [_rank_document(rank) for rank in diff.ranks if rank.changed],
        "totals": diff_totals(diff),
    }


def _plan_summary(plan: ShardingPlan) -> dict[str, Any]:
    return {
        "plan_id": plan.plan_id,
        "request_hash": plan.request_hash,
        "planner_version": plan.planner_version,
        "world_size": plan.world_size,
        "tables": len(plan.tables),
        "objective_ms": plan.solver.objective,
        "critical_path_ms": plan.solver.critical_path,
    }


def _table_document(table: TableChange) -> dict[str, Any]:
    return {
        "table": table.name,
        "status": table.status,
        "changes": list(table.changes),
        "old": _sharding_summary(table.old),
        "new": _sharding_summary(table.new),
        "moved_elements": table.moved_elements,
        "moved_bytes": table.moved_bytes,
    }


def _sharding_summary(sharding: ParameterSharding | None) -> dict[str, Any] | None:
    if sharding is None:
        return None
    return {
        "sharding_type": sharding.sharding_type.value,
        "compute_kernel": sharding.compute_kernel.value,
        "ranks": sharding.ranks,
        "shards": len(sharding.shards),
        "cache_load_factor": sharding.cache_load_factor,
    }


def _rank_document(rank: RankChange) -> dict[str, Any]:
    return {
        "rank": rank.rank,
        "old": _stats_summary(rank.old),
        "new": _stats_summary(rank.new),
        "delta": {
            "hbm_bytes": rank.hbm_delta,
            "ddr_bytes": rank.ddr_delta,
            "perf_ms": rank.perf_delta,
        },
        "bytes_in": rank.bytes_in,
        "bytes_out": rank.bytes_out,
        "bytes_sent": rank.bytes_sent,
    }


def _stats_summary(stats: RankStats | None) -> dict[str, Any] | None:
    if stats is None:
        return None
    return {"hbm_bytes": stats.hbm_bytes, "ddr_bytes": stats.ddr_bytes, "perf_ms": stats.perf.total}


def diff_totals(diff: PlanDiff) -> dict[str, dict[str, float]]:
    """Old, new and delta of the sums of HBM and DDR over ranks, the most loaded rank's
    perf (the objective) and the critical path."""

    def entry(old: float, new: float) -> dict[str, float]:
        return {"old": old, "new": new, "delta": new - old}

    old, new = diff.old, diff.new
    return {
        "hbm_bytes": entry(_sum(old, "hbm_bytes"), _sum(new, "hbm_bytes")),
        "ddr_bytes": entry(_sum(old, "ddr_bytes"), _sum(new, "ddr_bytes")),
        "max_rank_perf_ms": entry(_max_perf(old), _max_perf(new)),
        "critical_path_ms": entry(old.solver.critical_path, new.solver.critical_path),
    }


def _sum(plan: ShardingPlan, field_name: str) -> int:
    return sum(getattr(stats, field_name) for stats in plan.rank_stats)


def _max_perf(plan: ShardingPlan) -> float:
    return max((stats.perf.total for stats in plan.rank_stats), default=0.0)
