"""What the plan page answers at a glance, computed from a plan and its request: what each
rank holds (its tables and how they are sharded), which rank is the bottleneck and which
perf component makes it so, where memory is tight, what moved from the previous plan, and
the fixed costs every rank pays. ``plan.py`` renders it as HTML.

The page stays bounded for plans of 65,536 ranks and thousands of tables: consecutive ranks
that show the same share a row, a row names at most ``HELD_NAMES_SHOWN`` tables (the page
adds "+K more"), at most ``MAX_RANK_ROWS`` rows are shown (the most loaded ones, always
with the bottleneck and the fullest rank of each tier), and at most ``MOVED_TABLES_SHOWN``
changed tables."""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

from planner_service.costs.calibrated import fixed_perf
from planner_service.costs.estimate import total_components
from planner_service.plan.capacity import Capacity, RankCapacities, rank_capacities
from planner_service.plan.diff import TableChange, TableStatus, diff_plans
from planner_service.plan.order import natural_sorted
from planner_service.plan.types import (
    PERF_COMPONENTS,
    ComputeDevice,
    Migration,
    Perf,
    PlanRequest,
    RankMoves,
    RankStats,
    ShardingPlan,
    ShardingType,
)

TIGHT_FRACTION = 0.9  # a tier at or above this share of its usable bytes reads as tight
HELD_NAMES_SHOWN = 6  # tables named per rank row; the rest are counted
MAX_RANK_ROWS = 1024  # a 1,024-rank plan shows every rank, whatever its ranks hold
MOVED_TABLES_SHOWN = 50


class Tier(StrEnum):
    """A memory tier tables live in, as the page heads its columns."""

    HBM = "HBM"
    DDR = "DDR"


@dataclass(frozen=True, slots=True)
class Held:
    """A table's shards on one rank: ``shards`` of them, sharded ``sharding_type``."""

    table: str
    sharding_type: ShardingType
    shards: int


@dataclass(frozen=True, slots=True)
class TierUse:
    """A rank's bytes in one tier against what the tier offers to tables (after the
    reservation)."""

    used_bytes: int
    usable_bytes: int

    @property
    def fraction(self) -> float:
        """The share in use; infinite when bytes sit where nothing is usable."""
        if self.usable_bytes:
            return self.used_bytes / self.usable_bytes
        return math.inf if self.used_bytes else 0.0

    @property
    def tight(self) -> bool:
        return self.fraction >= TIGHT_FRACTION


@dataclass(frozen=True, slots=True)
class RankRow:
    """Consecutive ranks ``first`` to ``last`` that show the same; ``stats`` is the first's.
    ``moves``: what the rank sends and receives from the previous plan (None: nothing)."""

    first: int
    last: int
    stats: RankStats
    capacity: Capacity
    held: tuple[Held, ...]
    moves: RankMoves | None

    @property
    def label(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"

    def holds(self, rank: int) -> bool:
        return self.first <= rank <= self.last

    def use(self, tier: Tier) -> TierUse:
        return _use(tier, self.stats, self.capacity)


@dataclass(frozen=True)
class Bottleneck:
    """The most loaded rank (the first, when several tie: ``tied_ranks`` more do) and the
    summed perf component that weighs most on it."""

    rank: int
    tied_ranks: int
    perf: Perf
    component: str
    mean_total_ms: float

    @property
    def component_ms(self) -> float:
        return float(getattr(self.perf, self.component))


@dataclass(frozen=True)
class Fullest:
    """A tier's fullest rank (the first of equals) and how many ranks are tight in it."""

    tier: Tier
    rank: int
    use: TierUse
    tight_ranks: int


@dataclass(frozen=True)
class Moved:
    """What re-planning from the previous plan changed: the plan's ``migration`` section,
    and the tables placed differently (most bytes moved first, at most
    ``MOVED_TABLES_SHOWN``) when the request carries the previous plan."""

    migration: Migration
    tables: tuple[TableChange, ...]
    tables_not_shown: int
    previous_known: bool


@dataclass(frozen=True)
class PlanGlance:
    """Everything the page shows beyond the plan's own fields. ``tiers``: the tiers the
    tables live in (cpu: DDR; cuda: HBM, and DDR when a rank uses it); ``summed``: the
    perf components the cost model adds up to ``total``; ``components``: those that are not
    zero everywhere, one column each; ``fixed``: what every rank pays whatever it holds
    (calibrated model), None when nothing; ``rows``: shown, in rank order, of
    ``rows_total``."""

    tiers: tuple[Tier, ...]
    summed: tuple[str, ...]
    components: tuple[str, ...]
    fixed: Perf | None
    rows: tuple[RankRow, ...]
    rows_total: int
    bottleneck: Bottleneck | None
    fullest: tuple[Fullest, ...]
    moved: Moved | None


def plan_glance(request: PlanRequest, plan: ShardingPlan) -> PlanGlance:
    """What the page of ``plan`` shows beyond its fields; ``request`` is the plan's own
    (capacities, cost model, fixed costs, and the previous plan a re-plan started from)."""
    capacities = rank_capacities(request.topology, request.constraints)
    summed = total_components(request.options.cost_model)
    tiers = _tiers(request, plan)
    moves = {} if plan.migration is None else {m.rank: m for m in plan.migration.ranks}
    rows = list(_rank_rows(plan, capacities, _held_by_rank(plan), moves))
    bottleneck = _bottleneck(plan.rank_stats, summed)
    fullest = tuple(_fullest(tier, plan.rank_stats, capacities) for tier in tiers)
    keep = {f.rank for f in fullest} | ({bottleneck.rank} if bottleneck else set())
    return PlanGlance(
        tiers=tiers,
        summed=summed,
        components=_components(plan.rank_stats),
        fixed=_fixed(request, plan),
        rows=_shown_rows(rows, keep),
        rows_total=len(rows),
        bottleneck=bottleneck,
        fullest=fullest,
        moved=_moved(request, plan),
    )


def _tiers(request: PlanRequest, plan: ShardingPlan) -> tuple[Tier, ...]:
    """The tier tables live in on the device (DDR on cpu, HBM on cuda), and the other one
    too when a rank uses it (UVM tables on cuda)."""
    on_cpu = request.topology.compute_device is ComputeDevice.CPU
    hbm = not on_cpu or any(stats.hbm_bytes for stats in plan.rank_stats)
    ddr = on_cpu or any(stats.ddr_bytes for stats in plan.rank_stats)
    return tuple(tier for tier, shown in ((Tier.HBM, hbm), (Tier.DDR, ddr)) if shown)


def _held_by_rank(plan: ShardingPlan) -> dict[int, list[Held]]:
    """Each rank's tables in natural order. A ``Held`` is made once per table and count,
    and shared by the ranks it describes: a table on 65,536 ranks is one object."""
    held: dict[int, list[Held]] = defaultdict(list)
    for name in natural_sorted(plan.tables):
        sharding = plan.tables[name]
        made: dict[int, Held] = {}
        for rank, shards in Counter(shard.rank for shard in sharding.shards).items():
            one = made.get(shards)
            if one is None:
                one = made[shards] = Held(name, sharding.sharding_type, shards)
            held[rank].append(one)
    return held


def _rank_rows(
    plan: ShardingPlan,
    capacities: RankCapacities,
    held: dict[int, list[Held]],
    moves: dict[int, RankMoves],
) -> Iterator[RankRow]:
    """Consecutive ranks that show the same as one row labelled "first-last": a plan over
    65,536 ranks that each hold the same has one row for them, not 65,536."""
    keyed = (
        (_row_key(position, stats, capacities, held, moves), stats)
        for position, stats in enumerate(plan.rank_stats)
    )
    for key, run in itertools.groupby(keyed, key=lambda item: item[0]):
        members = [stats for _, stats in run]
        first = members[0]
        capacity = _capacity(capacities, first.rank)
        yield RankRow(first.rank, members[-1].rank, first, capacity, key[-2], moves.get(first.rank))


def _row_key(
    position: int,
    stats: RankStats,
    capacities: RankCapacities,
    held: dict[int, list[Held]],
    moves: dict[int, RankMoves],
) -> tuple[object, ...]:
    """Equal for neighbours that show the same; ``rank - position`` keeps runs consecutive.
    The rank's tables are the next to last item, its moves the last."""
    capacity = _capacity(capacities, stats.rank)
    moved = moves.get(stats.rank)
    return (
        stats.rank - position,
        stats.hbm_bytes,
        stats.ddr_bytes,
        capacity.hbm_bytes,
        capacity.ddr_bytes,
        stats.perf,
        tuple(held.get(stats.rank, ())),
        None if moved is None else (moved.sent_bytes, moved.received_bytes),
    )


def _capacity(capacities: RankCapacities, rank: int) -> Capacity:
    """The rank's usable bytes without an object per rank (``RankCapacities.of`` makes one:
    a second for 65,536 ranks); the result's ``rank`` field is not the rank's."""
    return capacities.overridden.get(rank, capacities.default)


def _bottleneck(rank_stats: list[RankStats], summed: tuple[str, ...]) -> Bottleneck | None:
    if not rank_stats:
        return None
    worst = max(rank_stats, key=lambda stats: stats.perf.total)  # the first of equals
    tied = sum(1 for stats in rank_stats if stats.perf.total == worst.perf.total) - 1
    component = max(summed, key=lambda name: float(getattr(worst.perf, name)))
    mean = sum(stats.perf.total for stats in rank_stats) / len(rank_stats)
    return Bottleneck(worst.rank, tied, worst.perf, component, mean)


def _fullest(tier: Tier, rank_stats: list[RankStats], capacities: RankCapacities) -> Fullest:
    uses = [
        (stats.rank, _use(tier, stats, _capacity(capacities, stats.rank))) for stats in rank_stats
    ]
    rank, use = max(uses, key=lambda item: item[1].fraction, default=(0, TierUse(0, 0)))
    return Fullest(tier, rank, use, sum(1 for _, each in uses if each.tight))


def _use(tier: Tier, stats: RankStats, capacity: Capacity) -> TierUse:
    if tier is Tier.HBM:
        return TierUse(stats.hbm_bytes, capacity.hbm_bytes)
    return TierUse(stats.ddr_bytes, capacity.ddr_bytes)


def _components(rank_stats: list[RankStats]) -> tuple[str, ...]:
    """The perf components not zero on every rank (fixed costs are part of every rank's)."""
    return tuple(
        name for name in PERF_COMPONENTS if any(getattr(stats.perf, name) for stats in rank_stats)
    )


def _fixed(request: PlanRequest, plan: ShardingPlan) -> Perf | None:
    """The calibrated model's fixed costs for the sharding types the plan uses, as the
    validator adds them to every rank; None under the other models."""
    fixed = fixed_perf(request, {sharding.sharding_type for sharding in plan.tables.values()})
    return fixed if fixed.total > 0 else None


def _shown_rows(rows: list[RankRow], keep_ranks: set[int]) -> tuple[RankRow, ...]:
    """All rows, or ``MAX_RANK_ROWS`` of them in rank order: those of ``keep_ranks`` and
    then the most loaded."""
    if len(rows) <= MAX_RANK_ROWS:
        return tuple(rows)
    kept = {i for i, row in enumerate(rows) if any(row.holds(rank) for rank in keep_ranks)}
    by_load = sorted(range(len(rows)), key=lambda i: (-rows[i].stats.perf.total, i))
    for index in by_load:
        if len(kept) >= MAX_RANK_ROWS:
            break
        kept.add(index)
    return tuple(rows[i] for i in sorted(kept))


def _moved(request: PlanRequest, plan: ShardingPlan) -> Moved | None:
    """The migration, with the tables that changed when the request carries the previous
    plan (the service stores requests with it inlined)."""
    migration = plan.migration
    if migration is None:
        return None
    previous = request.options.previous_plan
    if previous is None or previous.plan_id != migration.previous_plan_id:
        return Moved(migration, (), 0, previous_known=False)
    changes = diff_plans(previous, plan, request).tables
    changes.sort(key=_change_order)
    shown = tuple(changes[:MOVED_TABLES_SHOWN])
    return Moved(migration, shown, len(changes) - len(shown), previous_known=True)


_STATUS_ORDER = {TableStatus.CHANGED: 0, TableStatus.ADDED: 1, TableStatus.REMOVED: 2}


def _change_order(change: TableChange) -> tuple[int, int]:
    """Most bytes moved first, then changed, added, removed (stable: natural order)."""
    return (-change.moved_bytes, _STATUS_ORDER[change.status])
