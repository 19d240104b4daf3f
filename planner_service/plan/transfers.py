"""Which bytes move between which ranks when a plan changes: the one definition that the
solver's ``migration`` report, ``shardplan diff``, ``shardplan migrate`` and the runtime's
re-sharding in place use.

Moved bytes are counted region by region. For every shard of the new plan, each part of it
(rows x columns of its table) that its rank did not hold in the old plan, but some other
rank did, is sent by that rank and received by this one; what a rank held and still holds
does not move. So a shard that moves from rank 2 to rank 5 moves all its bytes once, a
row-wise table re-split over more ranks moves only the rows whose rank changes, and a
table-wise table that becomes data-parallel on 4 ranks moves three copies. Where the old
plan replicates a table (data-parallel), a rank without a replica receives from replica
``rank mod replicas`` (in rank order), which spreads the sending. Parts of a new shard that
no rank held (rows or columns a grown table gained) are new, not moved; tables added or
removed are not counted. A moved region of r rows and c columns counts
``r * c * element bytes`` of weights plus the optimizer state of those rows and columns
(``OptimizerType.state_bytes``: 4 bytes per row for rowwise_adagrad, 4 per element for
adagrad, 8 for adam) where the request is known; without it, 4-byte weights and no state.

The regions themselves are ``table_transfers`` and ``plan_transfers``: one ``Transfer``
(table, sending rank, receiving rank, rows and columns of the table, bytes) per new shard
and source shard that overlap; ``table_moves`` and ``plan_moves`` sum them, and
``shardplan migrate`` and the runtime's re-sharding in place move exactly them.
``table_kept`` lists the regions a rank keeps.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from planner_service.plan.types import (
    Migration,
    OptimizerType,
    PlanRequest,
    RankMoves,
    ShardingPlan,
    ShardingType,
    TableShardingModel,
)

ASSUMED_ELEMENT_BYTES = 4  # fp32, the request format's default data type


class ElementBytes(StrEnum):
    """Where moved bytes' element sizes come from: the new plan's request (data types and
    optimizers), or ``ASSUMED_ELEMENT_BYTES`` and no optimizer state."""

    REQUEST = "request"
    ASSUMED_FP32 = "assumed_fp32"


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


def boxes(sharding: TableShardingModel) -> list[Box]:
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
    before: TableShardingModel, after: TableShardingModel, element: Element
) -> TableMoves:
    replicated = before.sharding_type is ShardingType.DATA_PARALLEL
    return table_moves(boxes(before), boxes(after), old_replicated=replicated, element=element)


def plan_moves(
    old: ShardingPlan,
    new_tables: Mapping[str, TableShardingModel],
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
    new_tables: Mapping[str, TableShardingModel],
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
    name: str, before: TableShardingModel, after: TableShardingModel, element: Element
) -> list[Transfer]:
    replicated = before.sharding_type is ShardingType.DATA_PARALLEL
    return table_transfers(
        name, boxes(before), boxes(after), old_replicated=replicated, element=element
    )


def migration_section(
    moves: PlanMoves,
    previous_plan_id: str,
    max_moved_bytes: int | None,
    move_cost_ms_per_gib: float | None,
) -> Migration:
    """A re-planned plan's ``migration`` section: ``moves`` from the previous plan, per
    rank that sends or receives, and the limits it was planned under."""
    ranks = sorted(moves.sent.keys() | moves.received.keys())
    return Migration(
        previous_plan_id=previous_plan_id,
        moved_bytes=moves.moved_bytes,
        tables_moved=moves.tables_moved,
        ranks=[
            RankMoves(
                rank=rank,
                sent_bytes=moves.sent.get(rank, 0),
                received_bytes=moves.received.get(rank, 0),
            )
            for rank in ranks
        ],
        max_moved_bytes=max_moved_bytes,
        move_cost_ms_per_gib=move_cost_ms_per_gib,
    )
