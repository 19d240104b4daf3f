"""Enumerate every allowed sharding option of every table, with per-shard estimates.

An option is (sharding type x compute kernel x shard split). Options are pure arithmetic on
a table's shape, so they are built once per distinct table shape and shared by every table
of that shape (large models repeat shapes heavily), and each option estimates perf once per
distinct shard width and device class, storage once per distinct shard shape.

``enumerate_options`` lists what the constraints allow; ``fit_options`` then drops options
that no rank can hold and reports, with numbers, every table left with none.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from planner_service.costs.estimate import (
    OptionContext,
    Storage,
    TableLoad,
    estimate_perf,
    estimate_storage,
    perf_rows,
)
from planner_service.costs.options import (
    DeviceClasses,
    Placement,
    ShardEstimate,
    ShardingOption,
    TableOptions,
)
from planner_service.plan.capacity import Capacity, usable_capacity
from planner_service.plan.shards import COLUMN_ALIGNMENT, row_block_size
from planner_service.plan.types import (
    COLUMN_SHARDING_TYPES,
    DEFAULT_CACHE_LOAD_FACTOR,
    DEFAULT_MIN_PARTITION,
    ComputeDevice,
    ComputeKernel,
    ParameterConstraints,
    Perf,
    PlanRequest,
    ShardingType,
    Table,
    TableProblem,
    TableProblemCode,
    Topology,
)
from planner_service.plan.units import size

CUDA_FUSED_KERNELS = (ComputeKernel.FUSED, ComputeKernel.FUSED_UVM, ComputeKernel.FUSED_UVM_CACHING)


# --------------------------------------------------------------------------- enumerate


def enumerate_options(
    request: PlanRequest, *, on_table: Callable[[], None] | None = None
) -> list[TableOptions]:
    """Every option the constraints allow for every table, in request order, estimated.
    ``on_table`` is called before each table: a solve's deadline check, which raises to
    stop (100,000 tables of distinct shapes take minutes, longer than a time limit)."""
    builder = _OptionBuilder(request)
    check = on_table or _no_check
    result = []
    for table in request.tables:
        check()
        options = builder.options_for(table, request.constraints.for_table(table.name))
        result.append(TableOptions(table, options))
    return result


def _no_check() -> None:
    """No deadline: enumerate everything."""


class _OptionBuilder:
    def __init__(self, request: PlanRequest) -> None:
        self.request = request
        self.topology = request.topology
        self.classes = DeviceClasses.of(request.topology)
        self._cache: dict[tuple[Any, ...], tuple[ShardingOption, ...]] = {}
        # Perf per shard width, shared across shapes: tables that differ only in rows cost
        # the same per shard (see ``_perf_key``), and models of thousands of tables with
        # rows of their own are otherwise estimated option by option.
        self._perf: dict[tuple[Any, ...], tuple[Perf, ...]] = {}

    def options_for(
        self, table: Table, constraint: ParameterConstraints
    ) -> tuple[ShardingOption, ...]:
        key = _shape_key(table, constraint)
        options = self._cache.get(key)
        if options is None:
            options = tuple(self._build(table, constraint))
            self._cache[key] = options
        return tuple(o for o in options if _pins_allow(o, constraint.ranks, self.topology))

    def _build(self, table: Table, constraint: ParameterConstraints) -> Iterable[ShardingOption]:
        load = TableLoad.of(table, self.request.batch_size)
        clf = constraint.cache_load_factor or DEFAULT_CACHE_LOAD_FACTOR
        for kind in allowed_sharding_types(constraint):
            for kernel in allowed_kernels(kind, self.topology.compute_device, constraint):
                ctx = OptionContext(
                    table=table,
                    load=load,
                    topology=self.topology,
                    sharding_type=kind,
                    compute_kernel=kernel,
                    cache_load_factor=clf if kernel is ComputeKernel.FUSED_UVM_CACHING else None,
                    cost_model=self.request.options.cost_model,
                    device_profile=self.request.options.device_profile,
                )
                for split in self._splits(table, kind, constraint):
                    yield self._option(ctx, split)

    def _splits(
        self, table: Table, kind: ShardingType, constraint: ParameterConstraints
    ) -> Iterable[list[tuple[tuple[int, int], int]]]:
        """Each split is a list of runs (shard sizes, number of consecutive such shards)."""
        rows, dim = table.num_embeddings, table.embedding_dim
        if kind in COLUMN_SHARDING_TYPES:
            min_partition = constraint.min_partition or DEFAULT_MIN_PARTITION
            for width in column_widths(dim, min_partition):
                yield [((rows, width), dim // width)]
        elif kind is ShardingType.ROW_WISE:
            yield _row_runs(rows, dim, self.topology.world_size)
        elif kind is ShardingType.TABLE_ROW_WISE:
            yield _row_runs(rows, dim, self.topology.num_local_ranks)
        elif kind is ShardingType.DATA_PARALLEL:
            yield [((rows, dim), self.topology.world_size)]
        else:
            yield [((rows, dim), 1)]

    def _option(
        self, ctx: OptionContext, runs: list[tuple[tuple[int, int], int]]
    ) -> ShardingOption:
        estimates: list[tuple[ShardEstimate, int]] = []
        for sizes, count in runs:
            rows, cols = sizes
            key = (_perf_key(ctx), perf_rows(ctx, rows), cols)
            perf = self._perf.get(key)
            if perf is None:
                perf = tuple(estimate_perf(ctx, rows, cols, spec) for spec in self.classes.specs)
                self._perf[key] = perf
            estimates.append((ShardEstimate(sizes, perf, estimate_storage(ctx, *sizes)), count))
        return ShardingOption(
            ctx.sharding_type, ctx.compute_kernel, ctx.cache_load_factor, tuple(estimates)
        )


def _row_runs(rows: int, dim: int, blocks: int) -> list[tuple[tuple[int, int], int]]:
    """``row_block_sizes`` as runs: full blocks, then the remainder, then empty blocks."""
    block = row_block_size(rows, blocks)
    full = rows // block
    runs = [((block, dim), full)]
    if full < blocks:
        remainder = rows - full * block
        runs.append(((remainder, dim), 1))
        if blocks - full - 1:
            runs.append(((0, dim), blocks - full - 1))
    if len(runs) == 3 and runs[1][0] == runs[2][0]:  # remainder 0 merges with empty blocks
        runs[1:] = [(runs[1][0], runs[1][1] + runs[2][1])]
    return runs


def _perf_key(ctx: OptionContext) -> tuple[Any, ...]:
    """What a shard's perf depends on besides its width and the request's topology, batch
    and cost model: everything of the table but its name and, unless data-parallel (whose
    all-reduce moves the whole table), its rows."""
    table = ctx.table
    rows = table.num_embeddings if ctx.sharding_type is ShardingType.DATA_PARALLEL else None
    return (
        ctx.sharding_type,
        ctx.compute_kernel,
        ctx.cache_load_factor,
        rows,
        table.embedding_dim,
        tuple(table.pooling_factors or ()),
        tuple(table.batch_sizes or ()),
        table.num_features,
        table.pooling,
        table.data_type,
        table.is_weighted,
        table.optimizer,
    )


def _shape_key(table: Table, constraint: ParameterConstraints) -> tuple[Any, ...]:
    """Everything but the name that options depend on (pinned ranks are applied after)."""
    return (
        table.num_embeddings,
        table.embedding_dim,
        tuple(table.pooling_factors or ()),
        tuple(table.batch_sizes or ()),
        table.pooling,
        table.data_type,
        table.is_weighted,
        table.optimizer,
        tuple(constraint.sharding_types or ()),
        tuple(constraint.compute_kernels or ()),
        constraint.min_partition,
        constraint.cache_load_factor,
    )


def allowed_sharding_types(constraint: ParameterConstraints) -> list[ShardingType]:
    """Every sharding type the constraint allows. Sequence tables (pooling none) take all
    six too: TorchRec's EmbeddingCollection runs four (not the host-local two), shardplan's
    runtime all, returning a sequence table's rows to the ids' ranks in one all-to-all
    whatever the split."""
    allowed = constraint.sharding_types or list(ShardingType)
    return [kind for kind in ShardingType if kind in allowed]


def allowed_kernels(
    kind: ShardingType, device: ComputeDevice, constraint: ParameterConstraints
) -> list[ComputeKernel]:
    if kind is ShardingType.DATA_PARALLEL:
        supported: Sequence[ComputeKernel] = (ComputeKernel.DENSE,)
    elif device is ComputeDevice.CPU:
        supported = (ComputeKernel.FUSED,)  # no UVM without a GPU
    else:
        supported = CUDA_FUSED_KERNELS
    allowed = constraint.compute_kernels or list(ComputeKernel)
    return [kernel for kernel in supported if kernel in allowed]


# Keyed by what requests send (a table's dim and min_partition) in long-lived solver
# processes: bounded, and so is each entry (the divisors of a dim <= MAX_EMBEDDING_DIM, at
# most 120 widths), so the memo holds a few MiB at most.
@functools.lru_cache(maxsize=4096)
def column_widths(dim: int, min_partition: int) -> list[int]:
    """Column-shard widths to try, widest first: the whole dim, then every multiple of 4
    that divides it and is at least ``min_partition`` (dim 512 -> 512, 256, 128).

    Divisors come from trial division up to sqrt(dim) (256 steps at the largest
    dim), not from a loop over the dim itself."""
    narrower = [
        width
        for width in _divisors(dim)
        if width % COLUMN_ALIGNMENT == 0 and min_partition <= width <= dim // 2
    ]
    return [dim, *sorted(narrower, reverse=True)]


def _divisors(n: int) -> set[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return {*small, *(n // d for d in small)}


def _pins_allow(option: ShardingOption, pinned: list[int] | None, topology: Topology) -> bool:
    """Options that must use every rank (row_wise, data_parallel) or a whole host
    (table_row_wise) are impossible when the table is pinned to fewer ranks."""
    if not pinned:
        return True
    allowed = set(pinned)
    if option.placement is Placement.FIXED:
        return len(allowed) == topology.world_size
    if option.sharding_type is ShardingType.TABLE_ROW_WISE:
        return any(set(topology.host_ranks(h)) <= allowed for h in range(topology.num_hosts))
    return True


# --------------------------------------------------------------------------- fit


@dataclass(frozen=True, slots=True)
class FitResult:
    tables: list[TableOptions]
    problems: list[TableProblem]
    capacities: list[Capacity]


def fit_options(
    request: PlanRequest,
    tables: list[TableOptions],
    *,
    on_table: Callable[[], None] | None = None,
) -> FitResult:
    """Drop options that no allowed rank could hold, even alone; report emptied tables.
    ``on_table``: as for ``enumerate_options``."""
    check = on_table or _no_check
    capacities = usable_capacity(request.topology, request.constraints)
    kept, problems = [], []
    # Tables of one shape share option objects, so their fit is decided once per shape.
    decided: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[ShardingOption, ...]] = {}
    checkers: dict[tuple[int, ...], _FitChecker] = {}  # one per set of pinned ranks
    for entry in tables:
        check()
        pinned = request.constraints.for_table(entry.table.name).ranks
        key = (tuple(map(id, entry.options)), tuple(pinned or ()))
        options = decided.get(key)
        if options is None:
            fits = checkers.get(key[1])
            if fits is None:
                fits = checkers[key[1]] = _FitChecker(request.topology, capacities, pinned)
            options = tuple(option for option in entry.options if fits.option_fits(option))
            decided[key] = options
        kept.append(TableOptions(entry.table, options))
        if not options:
            problems.append(_explain(request, entry, capacities, pinned))
    return FitResult(kept, problems, capacities)


class _FitChecker:
    def __init__(self, topology: Topology, capacities: list[Capacity], pinned: list[int] | None):
        self.topology = topology
        self.capacities = capacities
        self.allowed = sorted(set(pinned)) if pinned else list(range(topology.world_size))
        self.allowed_set = set(self.allowed)
        allowed_caps = [capacities[r] for r in self.allowed]
        # Distinct (HBM, DDR) pairs: a shard fits some allowed rank iff it fits one of these.
        self.distinct = sorted({(c.hbm_bytes, c.ddr_bytes) for c in allowed_caps})
        # The one capacity of every rank, when all ranks have the same.
        everywhere = {(c.hbm_bytes, c.ddr_bytes) for c in capacities}
        self.uniform = capacities[0] if len(everywhere) == 1 else None

    def option_fits(self, option: ShardingOption) -> bool:
        if option.placement is Placement.FIXED:
            if self.uniform is not None:  # every rank alike: each distinct shard once
                return all(_fits(shard.storage, self.uniform) for shard, _ in option.runs)
            return all(
                _fits(shard.storage, self.capacities[rank])
                for rank, shard in enumerate(option.shards)
            )
        if option.placement is Placement.PER_HOST:
            if self.uniform is not None and len(self.allowed) == self.topology.world_size:
                return all(_fits(shard.storage, self.uniform) for shard, _ in option.runs)
            return any(self._host_fits(option, host) for host in range(self.topology.num_hosts))
        return all(self._fits_somewhere(shard.storage) for shard, _ in option.runs)

    def _fits_somewhere(self, storage: Storage) -> bool:
        return any(storage.hbm_bytes <= h and storage.ddr_bytes <= d for h, d in self.distinct)

    def _host_fits(self, option: ShardingOption, host: int) -> bool:
        ranks = list(self.topology.host_ranks(host))
        allowed = [rank for rank in ranks if rank in self.allowed_set]
        if option.sharding_type is ShardingType.TABLE_ROW_WISE:
            return len(allowed) == len(ranks) and all(
                _fits(shard.storage, self.capacities[rank])
                for rank, shard in zip(ranks, option.shards, strict=True)
            )
        return all(
            any(_fits(shard.storage, self.capacities[rank]) for rank in allowed)
            for shard in option.shards
        )


def _fits(storage: Storage, capacity: Capacity) -> bool:
    return storage.hbm_bytes <= capacity.hbm_bytes and storage.ddr_bytes <= capacity.ddr_bytes


def _explain(
    request: PlanRequest, entry: TableOptions, capacities: list[Capacity], pinned: list[int] | None
) -> TableProblem:
    table = entry.table
    ranks = sorted(set(pinned)) if pinned else range(request.topology.world_size)
    largest_hbm = max(capacities[r].hbm_bytes for r in ranks)
    largest_ddr = max(capacities[r].ddr_bytes for r in ranks)
    if not entry.options:
        return TableProblem(
            code=TableProblemCode.NO_ALLOWED_OPTION,
            table=table.name,
            message=_no_option_message(request, table),
        )
    smallest = min(
        entry.options,
        key=lambda o: max(_pressure(s.storage, largest_hbm, largest_ddr) for s, _ in o.runs),
    )
    worst = max(
        (s for s, _ in smallest.runs), key=lambda s: _pressure(s.storage, largest_hbm, largest_ddr)
    )
    return TableProblem(
        code=TableProblemCode.DOES_NOT_FIT,
        table=table.name,
        message=(
            f"table {table.name!r} fits no rank under any allowed option: its smallest option "
            f"({smallest.sharding_type.value}/{smallest.compute_kernel.value}) needs "
            f"{size(worst.storage.hbm_bytes)} HBM and {size(worst.storage.ddr_bytes)} DDR for "
            f"one shard, but the largest {'pinned ' if pinned else ''}rank offers "
            f"{size(largest_hbm)} HBM and {size(largest_ddr)} DDR after the reservation"
        ),
        smallest_option=f"{smallest.sharding_type.value}/{smallest.compute_kernel.value}",
        needed_hbm_bytes=worst.storage.hbm_bytes,
        needed_ddr_bytes=worst.storage.ddr_bytes,
        largest_rank_hbm_bytes=largest_hbm,
        largest_rank_ddr_bytes=largest_ddr,
    )


def _pressure(storage: Storage, hbm: int, ddr: int) -> float:
    """How far over the largest rank a shard is, as a fraction of the tighter tier."""

    def ratio(used: int, available: int) -> float:
        return used / available if available else (float("inf") if used else 0.0)

    return max(ratio(storage.hbm_bytes, hbm), ratio(storage.ddr_bytes, ddr))


def _no_option_message(request: PlanRequest, table: Table) -> str:
    constraint = request.constraints.for_table(table.name)
    device = request.topology.compute_device
    parts = []
    if constraint.sharding_types:
        parts.append(f"sharding_types {[t.value for t in constraint.sharding_types]}")
    if constraint.compute_kernels:
        parts.append(f"compute_kernels {[k.value for k in constraint.compute_kernels]}")
    if constraint.ranks:
        parts.append(f"ranks {constraint.ranks}")
    limits = " and ".join(parts) or "its configuration"
    hint = []
    if device is ComputeDevice.CPU:
        hint.append("on compute_device cpu only fused (and dense for data_parallel) run")
    hint.append("data_parallel runs only on dense, every other sharding type on a fused kernel")
    if constraint.ranks:
        hint.append("row_wise and data_parallel need every rank, table_row_wise a whole host")
    return f"table {table.name!r}: constraints {limits} leave no sharding option; " + "; ".join(
        hint
    )
