"""The oracle: checks any plan against its request and reports every violation.

Tests, the service (``POST /v1/validate``) and the CLI (``shardplan validate``) call
``validate_plan``; the runtime checks a served plan's layout with ``check_layout`` (it has no
request). The solver does not call it: its plans are checked by the tests that use it as
their oracle. Each check is a small generator over one family of rules; the validator runs
them all, so a user sees every problem at once rather than fixing them one by one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

from planner_service import PLANNER_VERSION
from planner_service.plan.canonical import plan_id_of
from planner_service.plan.capacity import rank_capacities
from planner_service.plan.codec import request_hash
from planner_service.plan.runs import RankRun, rank_bounds, rank_runs
from planner_service.plan.shards import COLUMN_ALIGNMENT, row_block_size, row_wise_shards
from planner_service.plan.types import (
    COLUMN_SHARDING_TYPES,
    HOST_LOCAL_SHARDING_TYPES,
    PERF_FIELDS,
    UVM_KERNELS,
    CompactSharding,
    ComputeDevice,
    ComputeKernel,
    ParameterConstraints,
    PlanRequest,
    RankStats,
    ShardingPlan,
    ShardingType,
    SolverStatus,
    Table,
    TableShardingModel,
    Topology,
    Violation,
    ViolationCode,
    gap,
)
from planner_service.plan.units import size as byte_size
from planner_service.validate.migration import check_migration
from planner_service.validate.usage import RankLoad, RankUsage, rank_usage

_ROWS, _COLUMNS = 0, 1
_GAP_TOLERANCE = 1e-9
_BRIEF = 16  # values shown of a long list of ranks or sizes
_PERF_TOLERANCE = 1e-9  # relative: sums of the same shard times in another order


def validate_plan(request: PlanRequest, plan: ShardingPlan) -> list[Violation]:
    """Every way ``plan`` breaks ``request``; an empty list means the plan is valid.

    What the plan says about itself that can be recomputed (each rank's bytes and times,
    the objective, the critical path, the moves from an inline previous plan:
    ``migration.py``) is recomputed from its shards and the request, and
    capacities are checked on the recomputed bytes. The cost follows the size of the
    request and the plan (tables, shards, overrides), not the world size."""
    usage = rank_usage(request, plan.tables)
    checks: list[Iterable[Violation]] = [
        _check_identity(request, plan),
        _check_table_names(request, plan),
        _check_tables(request, plan),
        _check_rank_stats(request, plan, usage),
        _check_capacities(request, usage),
        _check_groups(request, plan),
        _check_solver_report(plan, usage),
        check_migration(request, plan),
    ]
    return [violation for check in checks for violation in check]


def _priced(plan: ShardingPlan, message: str) -> str:
    """``message`` about a price the plan reports (its ranks' bytes and times, its objective
    and critical path), saying so when another planner version made the plan: each version
    prices with its own cost model (a calibrated plan of several collections made by 0.8.0
    differs from 0.9.0's per-collection fixed costs), so the difference may be the model's,
    not the plan's."""
    if plan.planner_version == PLANNER_VERSION:
        return message
    return (
        f"{message} (this plan was made by {plan.planner_version}; this validator is "
        f"{PLANNER_VERSION} and prices with its own cost model, which may differ: plan the "
        f"request again with {PLANNER_VERSION}, or validate with {plan.planner_version})"
    )


def runnable_violations(request: PlanRequest, plan: ShardingPlan) -> list[Violation]:
    """Every way ``plan`` cannot run ``request``'s tables on its topology: its content
    address, world size, tables, their layouts and kernels, and the capacities, as
    ``validate_plan`` checks them. Left out is what belongs to the request the plan was
    made for, so that a plan of the same tables from another request (another cost model,
    constraints or time limit) passes: its request hash, its prices (``rank_stats``, the
    solver report), the colocate and separate groups and the moves from a previous plan.
    ``shardplan measure --versus`` takes such plans."""
    usage = rank_usage(request, plan.tables)
    checks: list[Iterable[Violation]] = [
        _check_identity(request, plan),
        _check_table_names(request, plan),
        _check_tables(request, plan),
        _check_capacities(request, usage),
    ]
    return [
        violation
        for check in checks
        for violation in check
        if violation.code is not ViolationCode.REQUEST_HASH_MISMATCH
    ]


def _violation(
    code: ViolationCode, message: str, *, table: str | None = None, rank: int | None = None
) -> Violation:
    return Violation(code=code, message=message, table=table, rank=rank)


# --------------------------------------------------------------------------- plan-wide


def _check_identity(request: PlanRequest, plan: ShardingPlan) -> Iterator[Violation]:
    expected_id = plan_id_of(plan.model_dump(mode="json"))
    if expected_id != plan.plan_id:
        yield _violation(
            ViolationCode.PLAN_ID_MISMATCH,
            f"plan_id {plan.plan_id} does not match the plan's content ({expected_id}); "
            "the plan was edited after it was sealed",
        )
    expected_hash = request_hash(request)
    if plan.request_hash != expected_hash:
        yield _violation(
            ViolationCode.REQUEST_HASH_MISMATCH,
            f"the plan was made for the request with hash {plan.request_hash}, but this "
            f"request hashes to {expected_hash}; plan this request instead",
        )
    if plan.world_size != request.topology.world_size:
        yield _violation(
            ViolationCode.WORLD_SIZE_MISMATCH,
            f"plan is for world_size {plan.world_size}, request has world_size "
            f"{request.topology.world_size}",
        )


def _check_table_names(request: PlanRequest, plan: ShardingPlan) -> Iterator[Violation]:
    requested = {table.name for table in request.tables}
    for name in sorted(requested - plan.tables.keys()):
        yield _violation(
            ViolationCode.TABLE_MISSING,
            f"table {name!r} is in the request but not in the plan",
            table=name,
        )
    for name in sorted(plan.tables.keys() - requested):
        yield _violation(
            ViolationCode.TABLE_UNKNOWN,
            f"table {name!r} is in the plan but not in the request",
            table=name,
        )


def _check_rank_stats(
    request: PlanRequest, plan: ShardingPlan, usage: RankUsage
) -> Iterator[Violation]:
    world = request.topology.world_size
    ranks = [stats.rank for stats in plan.rank_stats]
    if len(ranks) != world or sorted(ranks) != list(range(world)):
        yield _violation(
            ViolationCode.RANK_STATS,
            f"rank_stats must list every rank 0..{world - 1} once; got ranks {_brief(ranks)}",
        )
    for stats in plan.rank_stats:
        if stats.rank >= world:
            continue
        differences = _stats_differences(stats, usage.of(stats.rank))
        if differences:
            yield _violation(
                ViolationCode.RANK_STATS,
                _priced(
                    plan,
                    f"rank {stats.rank} reports {'; '.join(differences)}: rank_stats must be "
                    "what the rank's shards add up to, recomputed from the request",
                ),
                rank=stats.rank,
            )


def _stats_differences(stats: RankStats, load: RankLoad) -> list[str]:
    differences = [
        f"{name} {reported:,} (the shards use {recomputed:,})"
        for name, reported, recomputed in (
            ("hbm_bytes", stats.hbm_bytes, load.hbm_bytes),
            ("ddr_bytes", stats.ddr_bytes, load.ddr_bytes),
        )
        if reported != recomputed
    ]
    for name, recomputed in zip(PERF_FIELDS, load.perf, strict=True):
        reported = getattr(stats.perf, name)
        if not _close(reported, recomputed):
            differences.append(f"perf.{name} {reported} (the shards add up to {recomputed})")
    return differences


def _check_capacities(request: PlanRequest, usage: RankUsage) -> Iterator[Violation]:
    """Capacities on the recomputed bytes; ranks without shards use nothing."""
    capacities = rank_capacities(request.topology, request.constraints)
    for rank in sorted(usage.loads):
        load, capacity = usage.loads[rank], capacities.of(rank)
        for code, tier, used, usable in (
            (ViolationCode.HBM_CAPACITY, "HBM", load.hbm_bytes, capacity.hbm_bytes),
            (ViolationCode.DDR_CAPACITY, "DDR", load.ddr_bytes, capacity.ddr_bytes),
        ):
            if used > usable:
                yield _violation(
                    code,
                    f"rank {rank} uses {_size(used)} of {tier} but only {_size(usable)} is "
                    f"available after reserving {_size(capacity.reserved_bytes)} "
                    f"(over by {used - usable:,} bytes)",
                    rank=rank,
                )


def _check_groups(request: PlanRequest, plan: ShardingPlan) -> Iterator[Violation]:
    def ranks_of(name: str) -> frozenset[int] | None:
        sharding = plan.tables.get(name)
        return sharding.placed_ranks() if sharding else None

    for group in request.constraints.colocate:
        placed = {name: ranks_of(name) for name in group}
        if len({ranks for ranks in placed.values() if ranks is not None}) > 1:
            detail = "; ".join(f"{n!r} on {sorted(r)}" for n, r in placed.items() if r is not None)
            yield _violation(
                ViolationCode.COLOCATE,
                f"colocate group {group} must share the same ranks, but {detail}",
                table=group[0],
            )
    for group in request.constraints.separate:
        for i, first in enumerate(group):
            for second in group[i + 1 :]:
                shared = (ranks_of(first) or frozenset()) & (ranks_of(second) or frozenset())
                if shared:
                    yield _violation(
                        ViolationCode.SEPARATE,
                        f"separate group {group}: tables {first!r} and {second!r} share "
                        f"rank(s) {sorted(shared)}",
                        table=first,
                        rank=min(shared),
                    )


def _check_solver_report(plan: ShardingPlan, usage: RankUsage) -> Iterator[Violation]:
    report = plan.solver
    if not _close(report.objective, usage.objective):
        yield _violation(
            ViolationCode.SOLVER_REPORT,
            _priced(
                plan,
                f"objective {report.objective} is not the most loaded rank's recomputed total "
                f"{usage.objective}",
            ),
        )
    if not _close(report.critical_path, usage.critical_path):
        yield _violation(
            ViolationCode.SOLVER_REPORT,
            _priced(
                plan,
                f"critical_path {report.critical_path} is not the recomputed "
                f"{usage.critical_path} (the sum over perf components of their max over ranks)",
            ),
        )
    if report.status not in (SolverStatus.OPTIMAL, SolverStatus.FEASIBLE):
        yield _violation(
            ViolationCode.SOLVER_REPORT,
            f"a plan's solver status must be optimal or feasible, not {report.status.value}",
        )
    if report.lower_bound > report.objective * (1 + _GAP_TOLERANCE):
        yield _violation(
            ViolationCode.SOLVER_REPORT,
            f"lower_bound {report.lower_bound} exceeds objective {report.objective}",
        )
    expected_gap = gap(report.objective, report.lower_bound)
    if not math.isclose(report.gap, expected_gap, rel_tol=1e-6, abs_tol=_GAP_TOLERANCE):
        yield _violation(
            ViolationCode.SOLVER_REPORT,
            f"gap {report.gap} should be (objective - lower_bound) / objective = {expected_gap}",
        )


# --------------------------------------------------------------------------- per table


def _check_tables(request: PlanRequest, plan: ShardingPlan) -> Iterator[Violation]:
    for table in request.tables:
        sharding = plan.tables.get(table.name)
        if sharding is None:
            continue
        constraint = request.constraints.for_table(table.name)
        context = _TableContext(request.topology, table, sharding, constraint)
        yield from context.check()


def check_layout(topology: Topology, table: Table, sharding: TableShardingModel) -> list[Violation]:
    """The layout rules alone (shard ranks, tiling, row blocks, one host for host-local
    types, column widths), without a request: the runtime checks a served plan with these,
    so it accepts exactly the layouts the planner validates."""
    context = _TableContext(topology, table, sharding, ParameterConstraints())
    return list(context.layout())


class _TableContext:
    """The checks of one table's sharding against its config and constraints."""

    def __init__(
        self,
        topology: Topology,
        table: Table,
        sharding: TableShardingModel,
        constraint: ParameterConstraints,
    ) -> None:
        self.topology = topology
        self.table = table
        self.sharding = sharding
        self.constraint = constraint

    def check(self) -> Iterator[Violation]:
        yield from self._kernel()
        yield from self.layout()
        yield from self._constraints()

    def layout(self) -> Iterator[Violation]:
        if isinstance(self.sharding, CompactSharding):
            yield from _RunsLayout(self, self.sharding).check()
            return
        yield from self._ranks()
        ranks_ok = all(0 <= s.rank < self.topology.world_size for s in self.sharding.shards)
        yield from self._tiling(ranks_ok)

    def _v(self, code: ViolationCode, message: str, rank: int | None = None) -> Violation:
        return _violation(
            code, f"table {self.table.name!r}: {message}", table=self.table.name, rank=rank
        )

    # ---- kernel and ranks

    def _kernel(self) -> Iterator[Violation]:
        kind, kernel = self.sharding.sharding_type, self.sharding.compute_kernel
        is_dp = kind is ShardingType.DATA_PARALLEL
        if is_dp != (kernel is ComputeKernel.DENSE):
            yield self._v(
                ViolationCode.KERNEL_INCOMPATIBLE,
                f"compute_kernel {kernel.value} cannot run sharding_type {kind.value}; "
                "data_parallel uses dense, every other sharding type a fused kernel",
            )
        if self.topology.compute_device is ComputeDevice.CPU and kernel in UVM_KERNELS:
            yield self._v(
                ViolationCode.KERNEL_INCOMPATIBLE,
                f"compute_kernel {kernel.value} needs a GPU; on compute_device cpu use fused",
            )

    def _ranks(self) -> Iterator[Violation]:
        world = self.topology.world_size
        for i, shard in enumerate(self.sharding.shards):
            if shard.rank >= world:
                yield self._v(
                    ViolationCode.RANK_OUT_OF_RANGE,
                    f"shard {i} is on rank {shard.rank}, but ranks are 0..{world - 1}",
                    rank=shard.rank,
                )
        shard_ranks = [shard.rank for shard in self.sharding.shards]
        if self.sharding.ranks != shard_ranks:
            yield self._v(
                ViolationCode.RANKS_MISMATCH,
                f"ranks {_brief(self.sharding.ranks)} must list each shard's rank in shard "
                f"order: {_brief(shard_ranks)}",
            )

    # ---- tiling

    def _tiling(self, ranks_ok: bool) -> Iterator[Violation]:
        kind = self.sharding.sharding_type
        if kind is ShardingType.DATA_PARALLEL:
            yield from self._data_parallel()
        elif kind is ShardingType.TABLE_WISE:
            yield from self._table_wise()
        elif kind in COLUMN_SHARDING_TYPES:
            yield from self._column_wise()
        else:
            yield from self._row_wise(ranks_ok)
        if kind in HOST_LOCAL_SHARDING_TYPES and ranks_ok:
            hosts = {self.topology.host_of(s.rank) for s in self.sharding.shards}
            if len(hosts) > 1:
                yield self._v(
                    ViolationCode.NOT_ONE_HOST,
                    f"{kind.value} shards must all sit on one host ("
                    f"{self.topology.num_local_ranks} ranks per host), found hosts {sorted(hosts)}",
                )

    def _full(self) -> tuple[tuple[int, int], tuple[int, int]]:
        return (0, 0), (self.table.num_embeddings, self.table.embedding_dim)

    def _data_parallel(self) -> Iterator[Violation]:
        offsets, sizes = self._full()
        for i, shard in enumerate(self.sharding.shards):
            if (shard.offsets, shard.sizes) != (offsets, sizes):
                yield self._shape_violation(i, offsets, sizes)
        ranks = sorted(shard.rank for shard in self.sharding.shards)
        world = self.topology.world_size
        if len(ranks) != world or ranks != list(range(world)):
            yield self._v(
                ViolationCode.SHARD_LAYOUT,
                "data_parallel needs one full replica on every rank "
                f"0..{self.topology.world_size - 1}, got replicas on ranks {_brief(ranks)}",
            )

    def _table_wise(self) -> Iterator[Violation]:
        offsets, sizes = self._full()
        if len(self.sharding.shards) != 1:
            yield self._v(
                ViolationCode.SHARD_LAYOUT,
                f"table_wise has exactly 1 shard, got {len(self.sharding.shards)}",
            )
        for i, shard in enumerate(self.sharding.shards):
            if (shard.offsets, shard.sizes) != (offsets, sizes):
                yield self._shape_violation(i, offsets, sizes)

    def _shape_violation(
        self, i: int, offsets: tuple[int, int], sizes: tuple[int, int]
    ) -> Violation:
        shard = self.sharding.shards[i]
        return self._v(
            ViolationCode.TILING,
            f"shard {i} on rank {shard.rank} has offsets {list(shard.offsets)} sizes "
            f"{list(shard.sizes)}; a full copy needs offsets {list(offsets)} sizes {list(sizes)}",
            rank=shard.rank,
        )

    def _column_wise(self) -> Iterator[Violation]:
        yield from self._split_along(_COLUMNS)
        if len(self.sharding.shards) > 1:
            yield from self._column_widths()

    def _column_widths(self) -> Iterator[Violation]:
        min_partition = self.constraint.min_partition
        for i, shard in enumerate(self.sharding.shards):
            width = shard.sizes[1]
            if width % COLUMN_ALIGNMENT:
                yield self._v(
                    ViolationCode.COLUMN_WIDTH,
                    f"column shard {i} on rank {shard.rank} is {width} columns wide; column "
                    f"shard widths must be multiples of {COLUMN_ALIGNMENT}",
                    rank=shard.rank,
                )
            if min_partition is not None and width < min_partition:
                yield self._v(
                    ViolationCode.MIN_PARTITION,
                    f"column shard {i} on rank {shard.rank} is {width} columns wide, below "
                    f"min_partition {min_partition}",
                    rank=shard.rank,
                )

    def _row_wise(self, ranks_ok: bool) -> Iterator[Violation]:
        tiling = list(self._split_along(_ROWS))
        yield from tiling
        if not tiling and ranks_ok:
            yield from self._row_blocks()

    def _row_blocks(self) -> Iterator[Violation]:
        """Row shards must follow the block layout the runtime bucketises ids by."""
        if self.sharding.sharding_type is ShardingType.ROW_WISE:
            ranks = range(self.topology.world_size)
        else:
            ranks = self.topology.host_ranks(self.topology.host_of(self.sharding.shards[0].rank))
        shards, rows = self.sharding.shards, self.table.num_embeddings
        # The count first: the expected layout is as long as the ranks, not the plan.
        if len(shards) != len(ranks) or shards != row_wise_shards(
            rows, self.table.embedding_dim, ranks
        ):
            yield self._v(
                ViolationCode.SHARD_LAYOUT,
                f"{self.sharding.sharding_type.value} must put row blocks "
                f"{_brief_row_blocks(rows, len(ranks))} on "
                f"ranks {_brief(ranks)} in order; got rows "
                f"{_brief([s.sizes[0] for s in self.sharding.shards])} on ranks "
                f"{_brief([s.rank for s in self.sharding.shards])}",
            )

    def _split_along(self, axis: int) -> Iterator[Violation]:
        """Shards cut along ``axis`` span the other axis fully and tile this one exactly."""
        other = 1 - axis
        lengths = (self.table.num_embeddings, self.table.embedding_dim)
        names = ("rows", "columns")
        for i, shard in enumerate(self.sharding.shards):
            start, size = shard.offsets[other], shard.sizes[other]
            if start != 0 or size != lengths[other]:
                yield self._v(
                    ViolationCode.SHARD_LAYOUT,
                    f"{names[axis][:-1]} shard {i} on rank {shard.rank} covers {names[other]} "
                    f"{start}..{start + size}, must cover all {lengths[other]} {names[other]}",
                    rank=shard.rank,
                )
        spans = [(s.offsets[axis], s.sizes[axis]) for s in self.sharding.shards]
        yield from self._intervals(names[axis], spans, lengths[axis])

    def _intervals(
        self, axis: str, spans: list[tuple[int, int]], length: int
    ) -> Iterator[Violation]:
        """Check that [start, start + size) spans tile [0, length) exactly once."""
        covered_to = 0
        for start, size in sorted(spans):
            end = start + size
            if end > length:
                yield self._v(
                    ViolationCode.TILING, f"{axis} {start}..{end} run past the table's {length}"
                )
            if size == 0:
                continue
            if start > covered_to:
                yield self._v(ViolationCode.TILING, f"{axis} {covered_to}..{start} are not covered")
            elif start < covered_to:
                yield self._v(
                    ViolationCode.TILING,
                    f"{axis} {start}..{min(end, covered_to)} are covered more than once",
                )
            covered_to = max(covered_to, end)
        if covered_to < length:
            yield self._v(ViolationCode.TILING, f"{axis} {covered_to}..{length} are not covered")

    # ---- constraints

    def _constraints(self) -> Iterator[Violation]:
        constraint, sharding = self.constraint, self.sharding
        if constraint.sharding_types and sharding.sharding_type not in constraint.sharding_types:
            yield self._v(
                ViolationCode.SHARDING_TYPE_NOT_ALLOWED,
                f"sharding_type {sharding.sharding_type.value} is not among the allowed "
                f"{[t.value for t in constraint.sharding_types]}",
            )
        if constraint.compute_kernels and sharding.compute_kernel not in constraint.compute_kernels:
            yield self._v(
                ViolationCode.COMPUTE_KERNEL_NOT_ALLOWED,
                f"compute_kernel {sharding.compute_kernel.value} is not among the allowed "
                f"{[k.value for k in constraint.compute_kernels]}",
            )
        if constraint.ranks:
            outside = sorted(sharding.placed_ranks() - set(constraint.ranks))
            if outside:
                yield self._v(
                    ViolationCode.PINNED_RANKS,
                    f"pinned to ranks {_brief(constraint.ranks)} but has shards on "
                    f"{_brief(outside)}",
                    rank=outside[0],
                )
        yield from self._cache_load_factor()

    def _cache_load_factor(self) -> Iterator[Violation]:
        caching = self.sharding.compute_kernel is ComputeKernel.FUSED_UVM_CACHING
        clf = self.sharding.cache_load_factor
        if caching and clf is None:
            yield self._v(
                ViolationCode.CACHE_LOAD_FACTOR, "fused_uvm_caching needs a cache_load_factor"
            )
        elif not caching and clf is not None:
            yield self._v(
                ViolationCode.CACHE_LOAD_FACTOR,
                f"cache_load_factor {clf} is set but compute_kernel "
                f"{self.sharding.compute_kernel.value} has no cache",
            )
        wanted = self.constraint.cache_load_factor
        if caching and wanted is not None and clf != wanted:
            yield self._v(
                ViolationCode.CACHE_LOAD_FACTOR,
                f"cache_load_factor {clf} differs from the constraint's {wanted}",
            )


class _RunsLayout:
    """The layout rules on a table written as runs (schema 2.0), checked on the runs: a
    row split over 4,096 ranks is one rank run and one block size, so it is compared with
    the layout it must be without listing 4,096 shards. Runs tile their shape by
    construction (``CompactSharding`` checks that), so what is left is the shape, the
    ranks and the split rule."""

    def __init__(self, table: _TableContext, sharding: CompactSharding) -> None:
        self.table = table
        self.sharding = sharding
        self.topology = table.topology

    def check(self) -> Iterator[Violation]:
        expected = (self.table.table.num_embeddings, self.table.table.embedding_dim)
        shape_ok = self.sharding.shape == expected
        if not shape_ok:
            yield self.table._v(
                ViolationCode.TILING,
                f"shape {list(self.sharding.shape)} is not the table's {list(expected)} "
                "(num_embeddings, embedding_dim)",
            )
        lowest, highest = rank_bounds(self.sharding.rank_runs)
        if highest >= self.topology.world_size:
            yield self.table._v(
                ViolationCode.RANK_OUT_OF_RANGE,
                f"ranks name rank {highest}, but ranks are 0..{self.topology.world_size - 1}",
                rank=highest,
            )
            return
        if shape_ok:
            yield from self._split()
        kind = self.sharding.sharding_type
        hosts = sorted({self.topology.host_of(lowest), self.topology.host_of(highest)})
        if kind in HOST_LOCAL_SHARDING_TYPES and len(hosts) > 1:
            yield self.table._v(
                ViolationCode.NOT_ONE_HOST,
                f"{kind.value} shards must all sit on one host ("
                f"{self.topology.num_local_ranks} ranks per host), found ranks "
                f"{lowest}..{highest} on hosts {hosts[0]}..{hosts[-1]}",
            )

    def _split(self) -> Iterator[Violation]:
        kind = self.sharding.sharding_type
        if kind is ShardingType.DATA_PARALLEL:
            yield from self._replicas()
        elif kind in COLUMN_SHARDING_TYPES:
            yield from self.table._column_wise()  # a few shards at most: listed
        elif kind is not ShardingType.TABLE_WISE:
            yield from self._row_blocks()

    def _replicas(self) -> Iterator[Violation]:
        world = self.topology.world_size
        if self.sharding.rank_runs == rank_runs(range(world)):
            return
        ranks = sorted(self.sharding.ranks)  # not in rank order: at most MAX_WORLD_SIZE
        if ranks != list(range(world)):
            yield self.table._v(
                ViolationCode.SHARD_LAYOUT,
                f"data_parallel needs one full replica on every rank 0..{world - 1}, got "
                f"replicas on ranks {_brief(ranks)}",
            )

    def _row_blocks(self) -> Iterator[Violation]:
        """The TorchRec block split on every rank (row_wise) or every rank of the host of
        the first shard (table_row_wise), in rank order."""
        sharding = self.sharding
        if sharding.sharding_type is ShardingType.ROW_WISE:
            ranks = range(self.topology.world_size)
        else:
            first = sharding.rank_runs[0]
            host = self.topology.host_of(first if isinstance(first, int) else first[0])
            ranks = self.topology.host_ranks(host)
        rows = sharding.shape[0]
        block = row_block_size(rows, len(ranks))
        if sharding.rank_runs != rank_runs(ranks) or sharding.rows_per_shard != block:
            yield self.table._v(
                ViolationCode.SHARD_LAYOUT,
                f"{sharding.sharding_type.value} must put row blocks of {block} rows "
                f"({_brief_row_blocks(rows, len(ranks))}) on ranks {_brief(ranks)} in order; "
                f"got blocks of rows_per_shard {sharding.rows_per_shard} on ranks "
                f"{_brief_runs(sharding.rank_runs)}",
            )


def _brief_runs(runs: Sequence[RankRun]) -> str:
    shown = [run if isinstance(run, int) else f"{run[0]}..{run[1]}" for run in runs[:_BRIEF]]
    more = f", ... ({len(runs)} runs in all)" if len(runs) > _BRIEF else ""
    return f"[{', '.join(map(str, shown))}{more}]"


def _close(reported: float, recomputed: float) -> bool:
    return math.isclose(reported, recomputed, rel_tol=_PERF_TOLERANCE, abs_tol=1e-15)


def _size(num_bytes: int) -> str:
    return f"{byte_size(num_bytes)} ({num_bytes:,} bytes)"


def _brief(values: Sequence[int], limit: int = _BRIEF) -> str:
    return _brief_of(list(values[:limit]), len(values))


def _brief_of(first: list[int], count: int) -> str:
    """``first``, the first values of ``count``, as a list, with how many were left out."""
    if len(first) >= count:
        return str(first)
    return f"[{', '.join(map(str, first))}, ... ({count} in all)]"


def _brief_row_blocks(num_rows: int, num_blocks: int) -> str:
    """``row_block_sizes`` in brief, without listing every block."""
    block = row_block_size(num_rows, num_blocks)
    first = [min(block, max(0, num_rows - i * block)) for i in range(min(num_blocks, _BRIEF))]
    return _brief_of(first, num_blocks)
