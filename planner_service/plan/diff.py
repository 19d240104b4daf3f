"""What changes between two plans: the tables placed differently, the bytes that move
between ranks to get from one to the other (``plan.transfers``), and every rank's memory
and time before and after.

A table's moved bytes are ``transfers.sharding_moves`` of its old and new sharding; a
rank's ``bytes_in`` and ``bytes_sent`` are what it receives and sends over all tables, and
its ``bytes_out`` what it held before and no longer holds (memory freed, weights only).
Tables added or removed are listed, not counted.

The JSON form (``diff_document``: a ``DiffDocument``, frozen models written in field
order) is documented in docs/reading-plans.md, "Comparing two
plans"; its ``version`` changes when a field changes meaning or goes away.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, Self, TypeVar

from pydantic import BaseModel, ConfigDict

from planner_service.plan.order import natural_sorted
from planner_service.plan.transfers import Element, ElementBytes, elements_of, sharding_moves
from planner_service.plan.types import (
    ComputeKernel,
    PlanRequest,
    RankStats,
    Shard,
    ShardingPlan,
    ShardingType,
    TableShardingModel,
)

# 2: moved bytes count optimizer state (with --request), exclude rows no rank held, and
# ranks report bytes_sent.
DIFF_VERSION = 2


class TableStatus(StrEnum):
    """How a table differs: placed differently, or in only one of the plans."""

    CHANGED = "changed"
    ADDED = "added"
    REMOVED = "removed"


class ShardingAspect(StrEnum):
    """The parts of a table's sharding a diff compares: each is a ``ParameterSharding``
    field of that name."""

    SHARDING_TYPE = "sharding_type"
    COMPUTE_KERNEL = "compute_kernel"
    RANKS = "ranks"
    SHARDS = "shards"
    CACHE_LOAD_FACTOR = "cache_load_factor"


@dataclass(frozen=True)
class TableChange:
    """One table placed differently: which aspects changed, and the weights that move."""

    name: str
    status: TableStatus
    changes: tuple[ShardingAspect, ...]
    old: TableShardingModel | None
    new: TableShardingModel | None
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
            status = TableStatus.ADDED if before is None else TableStatus.REMOVED
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
            TableChange(
                name, TableStatus.CHANGED, changes, before, after, moves.elements, moves.moved_bytes
            )
        )
    ranks = _ranks(old, new, bytes_in, bytes_out, bytes_sent)
    return PlanDiff(old, new, tables, unchanged, ranks, bool(request))


def _changes(before: TableShardingModel, after: TableShardingModel) -> tuple[ShardingAspect, ...]:
    return tuple(
        aspect for aspect in ShardingAspect if getattr(before, aspect) != getattr(after, aspect)
    )


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


class _Document(BaseModel):
    """Base of the diff document's parts: values, written in field order."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class PlanHeader(_Document):
    """What the document shows of each plan."""

    plan_id: str
    request_hash: str
    planner_version: str
    world_size: int
    tables: int
    objective_ms: float
    critical_path_ms: float

    @classmethod
    def of(cls, plan: ShardingPlan) -> PlanHeader:
        return cls(
            plan_id=plan.plan_id,
            request_hash=plan.request_hash,
            planner_version=plan.planner_version,
            world_size=plan.world_size,
            tables=len(plan.tables),
            objective_ms=plan.solver.objective,
            critical_path_ms=plan.solver.critical_path,
        )


class ShardingSummary(_Document):
    """A table's sharding in one plan, its shards counted."""

    sharding_type: ShardingType
    compute_kernel: ComputeKernel
    ranks: list[int]
    shards: int
    cache_load_factor: float | None

    @classmethod
    def of(cls, sharding: TableShardingModel | None) -> ShardingSummary | None:
        if sharding is None:
            return None
        shards = sharding.num_shards
        return cls(
            sharding_type=sharding.sharding_type,
            compute_kernel=sharding.compute_kernel,
            ranks=sharding.ranks,
            shards=shards,
            cache_load_factor=sharding.cache_load_factor,
        )


class TableEntry(_Document):
    """One table placed differently (``TableChange``)."""

    table: str
    status: TableStatus
    changes: list[ShardingAspect]
    old: ShardingSummary | None
    new: ShardingSummary | None
    moved_elements: int
    moved_bytes: int

    @classmethod
    def of(cls, change: TableChange) -> TableEntry:
        old, new = ShardingSummary.of(change.old), ShardingSummary.of(change.new)
        return cls(
            table=change.name,
            status=change.status,
            changes=list(change.changes),
            old=old,
            new=new,
            moved_elements=change.moved_elements,
            moved_bytes=change.moved_bytes,
        )


class RankLoad(_Document):
    """A rank's memory and time in one plan, or their change between the plans."""

    hbm_bytes: int
    ddr_bytes: int
    perf_ms: float

    @classmethod
    def of(cls, stats: RankStats | None) -> RankLoad | None:
        if stats is None:
            return None
        return cls(hbm_bytes=stats.hbm_bytes, ddr_bytes=stats.ddr_bytes, perf_ms=stats.perf.total)


class RankEntry(_Document):
    """One rank whose estimates or moved bytes change (``RankChange``)."""

    rank: int
    old: RankLoad | None
    new: RankLoad | None
    delta: RankLoad
    bytes_in: int
    bytes_out: int
    bytes_sent: int

    @classmethod
    def of(cls, change: RankChange) -> RankEntry:
        delta = RankLoad(
            hbm_bytes=change.hbm_delta, ddr_bytes=change.ddr_delta, perf_ms=change.perf_delta
        )
        return cls(
            rank=change.rank,
            old=RankLoad.of(change.old),
            new=RankLoad.of(change.new),
            delta=delta,
            bytes_in=change.bytes_in,
            bytes_out=change.bytes_out,
            bytes_sent=change.bytes_sent,
        )


Number = TypeVar("Number", int, float)


class Total(_Document, Generic[Number]):
    """A number in each plan (bytes summed over its ranks, or milliseconds), and its change."""

    old: Number
    new: Number
    delta: Number

    @classmethod
    def of(cls, old: Number, new: Number) -> Self:
        return cls(old=old, new=new, delta=new - old)


class DiffTotals(_Document):
    """Old, new and delta of the sums of HBM and DDR over ranks, the most loaded rank's
    perf (the objective) and the critical path."""

    hbm_bytes: Total[int]
    ddr_bytes: Total[int]
    max_rank_perf_ms: Total[float]
    critical_path_ms: Total[float]


class DiffDocument(_Document):
    """The stable JSON form of a diff (docs/reading-plans.md, "Comparing two plans"):
    ranks are those whose estimates or moved bytes change."""

    version: int
    identical: bool
    old: PlanHeader
    new: PlanHeader
    element_bytes: ElementBytes
    moved_bytes: int
    moved_elements: int
    unchanged_tables: int
    tables: list[TableEntry]
    ranks: list[RankEntry]
    totals: DiffTotals


def diff_document(diff: PlanDiff) -> DiffDocument:
    """The JSON form of ``diff`` (``DiffDocument``)."""
    return DiffDocument(
        version=DIFF_VERSION,
        identical=diff.identical,
        old=PlanHeader.of(diff.old),
        new=PlanHeader.of(diff.new),
        element_bytes=(
            ElementBytes.REQUEST if diff.element_bytes_from_request else ElementBytes.ASSUMED_FP32
        ),
        moved_bytes=diff.moved_bytes,
        moved_elements=diff.moved_elements,
        unchanged_tables=diff.unchanged_tables,
        tables=[TableEntry.of(table) for table in diff.tables],
        ranks=[RankEntry.of(rank) for rank in diff.ranks if rank.changed],
        totals=diff_totals(diff),
    )


def diff_totals(diff: PlanDiff) -> DiffTotals:
    """The totals of both plans (``DiffTotals``)."""
    old, new = diff.old, diff.new
    return DiffTotals(
        hbm_bytes=Total[int].of(_sum(old, "hbm_bytes"), _sum(new, "hbm_bytes")),
        ddr_bytes=Total[int].of(_sum(old, "ddr_bytes"), _sum(new, "ddr_bytes")),
        max_rank_perf_ms=Total[float].of(_max_perf(old), _max_perf(new)),
        critical_path_ms=Total[float].of(old.solver.critical_path, new.solver.critical_path),
    )


def _sum(plan: ShardingPlan, field_name: str) -> int:
    return sum(getattr(stats, field_name) for stats in plan.rank_stats)


def _max_perf(plan: ShardingPlan) -> float:
    return max((stats.perf.total for stats in plan.rank_stats), default=0.0)
