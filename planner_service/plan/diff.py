"""What changes between two plans: the tables placed differently, the bytes that move
between ranks to get from one to the other (``plan.transfers``), and every rank's memory
and time before and after.

A table's moved bytes are ``transfers.sharding_moves`` of its old and new sharding; a
rank's ``bytes_in`` and ``bytes_sent`` are what it receives and sends over all tables, and
its ``bytes_out`` what it held before and no longer holds (memory freed, weights only).
Tables added or removed are listed, not counted.

The JSON form (``diff_document``) is documented in docs/reading-plans.md, "Comparing two
plans"; its ``version`` changes when a field changes meaning or goes away.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from planner_service.plan.order import natural_sorted
from planner_service.plan.transfers import Element, elements_of, sharding_moves
from planner_service.plan.types import (
    ParameterSharding,
    PlanRequest,
    RankStats,
    Shard,
    ShardingPlan,
)

# 2: moved bytes count optimizer state (with --request), exclude rows no rank held, and
# ranks report bytes_sent.
DIFF_VERSION = 2


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
