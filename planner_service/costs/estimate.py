"""Per-shard estimates: milliseconds per training iteration and bytes per memory tier.

Two cost models share one structure (see docs/cost-model.md for every formula):

- ``torchrec-1.8`` reproduces TorchRec 1.8's default estimators (EmbeddingPerfEstimatorV2 with
  its default config, and EmbeddingStorageEstimator) so plans can be judged on its terms.
- ``shardplan`` (the default) fixes what TorchRec gets wrong: optimizer state is always
  counted, in its own data type (fp32), beside the weights it belongs to; a data-parallel
  table's dense gradient is counted; and ``input_dist`` is part of the total.

Bandwidths are converted to bytes per millisecond so that times come out in milliseconds,
exactly as in TorchRec. Perf depends on a shard's width but not its row count (TorchRec's
model), so estimates are computed once per distinct width and device class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from planner_service.costs import calibrated
from planner_service.plan.types import (
    PERF_COMPONENTS,
    ComputeDevice,
    ComputeKernel,
    CostModel,
    DeviceProfile,
    DeviceSpec,
    Perf,
    PoolingType,
    ShardingType,
    Table,
    Topology,
)

# TorchRec 1.8 constants (torchrec/distributed/planner/constants.py), empirical there.
INDEX_BYTES = 8  # ids are int64 on the wire and in the input buffers
BWD_COMPUTE_MULTIPLIER = 2.0
WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER = 1.0
WEIGHTED_KERNEL_MULTIPLIER = 1.1
BATCHED_COPY_PERF_FACTOR = 2.455
DP_ELEMENTWISE_KERNELS_PERF_FACTOR = 9.22
FULL_BLOCK_EMB_DIM = 128
HALF_BLOCK_EMB_DIM = 64
HALF_BLOCK_PENALTY = 1.15
QUARTER_BLOCK_PENALTY = 1.75
MIN_LOOKUP_DIM = 32  # table-wise lookups read at least 32 columns per row
UVM_BANDWIDTH_DIVISOR = 10.0
DENSE_BANDWIDTH_FACTOR = 0.5
MS_PER_S = 1000.0

CACHE_INDEX_BYTES_PER_ROW = 4  # cache_index_table_map (int32 per row)
CACHE_STATE_BYTES_PER_SLOT = 16  # lxu_cache_state + lru_state (int64 each per cached slot)


class Collective(Enum):
    ALL_TO_ALL = "all_to_all"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    ALL_REDUCE = "all_reduce"


@dataclass(frozen=True, slots=True)
class TableLoad:
    """Ids looked up (``batch_inputs``) and bags produced (``batch_outputs``) per
    iteration on one rank, summed over the table's features (TorchRec's definitions)."""

    batch_inputs: float
    batch_outputs: float

    @classmethod
    def of(cls, table: Table, batch_size: int) -> TableLoad:
        factors = table.pooling_factors or [1.0] * table.num_features
        batches = table.batch_sizes or [batch_size] * table.num_features
        inputs = sum(f * b for f, b in zip(factors, batches, strict=True))
        if table.pooling is PoolingType.NONE:
            return cls(inputs, inputs)
        outputs = sum(min(1.0, f) * b for f, b in zip(factors, batches, strict=True))
        return cls(inputs, outputs)


@dataclass(frozen=True, slots=True)
class OptionContext:
    """Everything the estimators need about one (table, sharding type, kernel) option."""

    table: Table
    load: TableLoad
    topology: Topology
    sharding_type: ShardingType
    compute_kernel: ComputeKernel
    cache_load_factor: float | None
    cost_model: CostModel
    device_profile: DeviceProfile | None = None  # the calibrated model's coefficients
    # Derived once per option, read many times by the formulas.
    is_pooled: bool = field(init=False)
    dtype_bytes: int = field(init=False)
    world_size: int = field(init=False)
    local_world_size: int = field(init=False)

    def __post_init__(self) -> None:
        derived = {
            "is_pooled": self.table.pooling is not PoolingType.NONE,
            "dtype_bytes": element_bytes(self.table, self.cost_model),
            "world_size": self.topology.world_size,
            "local_world_size": self.topology.num_local_ranks,
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)


def element_bytes(table: Table, cost_model: CostModel) -> int:
    """Bytes per element. TorchRec's modules materialise every non-fp32 table as fp16, so
    its model prices int8 and bf16 at 2 bytes; ours at the type's real size."""
    size = table.data_type.size_bytes
    if cost_model is CostModel.TORCHREC_1_8 and size != 4:
        return 2
    return size


# --------------------------------------------------------------------------- bandwidths


def kernel_bandwidth(ctx: OptionContext, device: DeviceSpec) -> float:
    """Bytes per ms a lookup kernel streams on ``device`` (TorchRec's kernel_bw_lookup)."""
    hbm = device.hbm_bw_bytes_per_s / MS_PER_S
    ddr = device.ddr_bw_bytes_per_s / MS_PER_S
    host_link = ctx.topology.hbm_to_ddr_bw_bytes_per_s / MS_PER_S
    kernel = ctx.compute_kernel
    if ctx.topology.compute_device is ComputeDevice.CPU:
        return DENSE_BANDWIDTH_FACTOR * ddr if kernel is ComputeKernel.DENSE else ddr
    if kernel is ComputeKernel.DENSE:
        return DENSE_BANDWIDTH_FACTOR * hbm
    if kernel is ComputeKernel.FUSED:
        return hbm
    if kernel is ComputeKernel.FUSED_UVM:
        return host_link / UVM_BANDWIDTH_DIVISOR
    clf = ctx.cache_load_factor or 0.0
    return (clf * hbm + (1 - clf) * host_link) / UVM_BANDWIDTH_DIVISOR


def comms_bandwidth(topology: Topology, collective: Collective, world: int, local: int) -> float:
    """Bytes per ms of a collective over ``world`` ranks with ``local`` ranks per host."""
    intra = topology.intra_host_bw_bytes_per_s / MS_PER_S
    inter = topology.inter_host_bw_bytes_per_s / MS_PER_S
    if collective is Collective.ALL_REDUCE:
        return inter * local  # one NIC per GPU
    return intra if world <= local else inter


def block_usage_penalty(dim: int) -> float:
    """FBGEMM's kernels work on 128-column blocks; narrower rows waste part of a block."""
    if dim >= FULL_BLOCK_EMB_DIM:
        return 1.0
    return HALF_BLOCK_PENALTY if dim >= HALF_BLOCK_EMB_DIM else QUARTER_BLOCK_PENALTY


# --------------------------------------------------------------------------- perf


def estimate_perf(ctx: OptionContext, rows: int, cols: int, device: DeviceSpec) -> Perf:
    """Milliseconds per iteration of one shard of ``rows`` x ``cols`` on ``device`` (rows
    matter to the calibrated model only)."""
    if ctx.cost_model is CostModel.CALIBRATED:
        return _calibrated_perf(ctx, rows, cols)
    kind = ctx.sharding_type
    if kind is ShardingType.DATA_PARALLEL:
        return _data_parallel_perf(ctx, cols, device)
    if kind is ShardingType.ROW_WISE:
        return _row_wise_perf(ctx, cols, device, group=ctx.world_size)
    if kind is ShardingType.TABLE_ROW_WISE:
        return _row_wise_perf(ctx, cols, device, group=ctx.local_world_size)
    return _table_wise_perf(ctx, cols, device)


def perf_rows(ctx: OptionContext, rows: int) -> int | None:
    """What of a shard's rows its perf depends on, for caching estimates: nothing (only its
    width matters, as in TorchRec) except under the calibrated model."""
    return rows if ctx.cost_model is CostModel.CALIBRATED else None


def _calibrated_perf(ctx: OptionContext, rows: int, cols: int) -> Perf:
    """The shard under ``calibrated`` (``calibrated.py``); rank classes do not change it:
    the profile measured one kind of device."""
    profile = ctx.device_profile
    assert profile is not None  # PlanOptions requires one with the calibrated model
    table = ctx.table
    return calibrated.shard_perf(
        profile,
        topology=ctx.topology,
        sharding_type=ctx.sharding_type,
        compute_kernel=ctx.compute_kernel,
        cache_load_factor=ctx.cache_load_factor,
        table_rows=table.num_embeddings,
        rows=rows,
        cols=cols,
        batch_inputs=ctx.load.batch_inputs,
        batch_outputs=ctx.load.batch_outputs,
        pooled=ctx.is_pooled,
        weighted=table.is_weighted,
        element_bytes=ctx.dtype_bytes,
        state_bytes_per_row=table.optimizer.state_bytes(1, cols),
    )


def _input_read_bytes(ctx: OptionContext, ids: float) -> int:
    size = math.ceil(ids * INDEX_BYTES)
    return size * 2 if ctx.table.is_weighted else size


def _backward_compute(ctx: OptionContext, fwd_compute: float) -> float:
    bwd = fwd_compute * BWD_COMPUTE_MULTIPLIER
    if not ctx.table.is_weighted:
        return bwd
    return bwd * WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER + fwd_compute * WEIGHTED_KERNEL_MULTIPLIER


def _input_dist(ctx: OptionContext) -> float:
    """All-to-all of every rank's ids to the ranks that own them."""
    size = math.ceil(ctx.load.batch_inputs * ctx.world_size * INDEX_BYTES)
    bw = comms_bandwidth(ctx.topology, Collective.ALL_TO_ALL, ctx.world_size, ctx.local_world_size)
    return size / bw


def total_components(cost_model: CostModel) -> tuple[str, ...]:
    """The perf components ``cost_model`` sums into ``total`` (as ``_perf`` does): all of
    them in ours, all but ``input_dist`` in TorchRec's."""
    if cost_model is not CostModel.TORCHREC_1_8:
        return PERF_COMPONENTS
    return tuple(name for name in PERF_COMPONENTS if name != "input_dist")


def _perf(
    ctx: OptionContext, fwd_compute: float, fwd_comms: float, bwd_comms: float, input_dist: float
) -> Perf:
    bwd_compute = _backward_compute(ctx, fwd_compute)
    prefetch = 0.0  # TorchRec prices prefetch only from measured cache statistics
    total = fwd_compute + bwd_compute + fwd_comms + bwd_comms + prefetch
    if ctx.cost_model is not CostModel.TORCHREC_1_8:
        total += input_dist
    return Perf(
        fwd_compute=fwd_compute,
        fwd_comms=fwd_comms,
        bwd_compute=bwd_compute,
        bwd_comms=bwd_comms,
        prefetch=prefetch,
        input_dist=input_dist,
        total=total,
    )


def _table_wise_perf(ctx: OptionContext, cols: int, device: DeviceSpec) -> Perf:
    """table_wise, column_wise, table_column_wise: the shard serves the global batch."""
    world, ids, bags = ctx.world_size, ctx.load.batch_inputs, ctx.load.batch_outputs
    read = _input_read_bytes(ctx, ids * world)
    lookup = ids * world * max(cols, MIN_LOOKUP_DIM) * ctx.dtype_bytes
    write = bags * world * cols * ctx.dtype_bytes
    fwd_compute = (
        (read + lookup + write) * block_usage_penalty(cols) / kernel_bandwidth(ctx, device)
    )
    a2a = comms_bandwidth(ctx.topology, Collective.ALL_TO_ALL, world, ctx.local_world_size)
    return _perf(ctx, fwd_compute, write / a2a, write / a2a, _input_dist(ctx))


def _row_wise_perf(ctx: OptionContext, cols: int, device: DeviceSpec, group: int) -> Perf:
    """row_wise (group = world) and table_row_wise (group = one host): ids are bucketised
    over the group's row blocks, partial bags are reduce-scattered back (a sequence table's
    rows go back whole, ``_row_exchange``)."""
    world, ids, bags = ctx.world_size, ctx.load.batch_inputs, ctx.load.batch_outputs
    local_ids = ids / group
    read = _input_read_bytes(ctx, local_ids * world)
    lookup = local_ids * world * cols * ctx.dtype_bytes
    out_bags = bags if ctx.is_pooled else bags / group
    write = out_bags * world * cols * ctx.dtype_bytes
    device_bw = kernel_bandwidth(ctx, device)
    fwd_compute = (read + lookup + write) / device_bw
    batched_copy = write * BATCHED_COPY_PERF_FACTOR / device_bw
    topology, local = ctx.topology, ctx.local_world_size
    if not ctx.is_pooled:
        fwd_comms = bwd_comms = _row_exchange(ctx, write)
    elif ctx.sharding_type is ShardingType.ROW_WISE:
        fwd_comms = write / comms_bandwidth(topology, Collective.REDUCE_SCATTER, world, local)
        bwd_comms = write / comms_bandwidth(topology, Collective.ALL_GATHER, world, local)
    else:
        intra_local = min(group, local)
        fwd_comms = write / comms_bandwidth(topology, Collective.REDUCE_SCATTER, group, intra_local)
        bwd_comms = write / comms_bandwidth(topology, Collective.ALL_GATHER, group, intra_local)
        cross_hosts = _cross_host_all_to_all(ctx, cols)
        fwd_comms += cross_hosts
        bwd_comms = cross_hosts + bwd_comms
    return _perf(ctx, fwd_compute, fwd_comms, bwd_comms + batched_copy, _input_dist(ctx))


def _row_exchange(ctx: OptionContext, write: float) -> float:
    """A sequence table's row-split shard: each holder sends the rows of every rank's ids
    straight back in one all-to-all over the world (there is no partial bag to reduce,
    within the host or across hosts), for row_wise and table_row_wise alike."""
    world, local = ctx.world_size, ctx.local_world_size
    return write / comms_bandwidth(ctx.topology, Collective.ALL_TO_ALL, world, local)


def _cross_host_all_to_all(ctx: OptionContext, cols: int) -> float:
    """table_row_wise's second stage: each host's reduced bags to the other hosts."""
    hosts = max(1, ctx.world_size // ctx.local_world_size)
    if hosts <= 1:
        return 0.0
    size = ctx.load.batch_outputs * hosts * cols * ctx.dtype_bytes
    return size / comms_bandwidth(ctx.topology, Collective.ALL_TO_ALL, hosts, 1)


def _data_parallel_perf(ctx: OptionContext, cols: int, device: DeviceSpec) -> Perf:
    """A full replica per rank serves its local batch; gradients are all-reduced."""
    ids, bags = ctx.load.batch_inputs, ctx.load.batch_outputs
    read = _input_read_bytes(ctx, ids)
    lookup = ids * cols * ctx.dtype_bytes
    write = bags * cols * ctx.dtype_bytes
    device_bw = kernel_bandwidth(ctx, device)
    fwd_compute = (read + lookup + write) / device_bw
    table_bytes = ctx.table.num_embeddings * cols * ctx.dtype_bytes
    world, local = ctx.world_size, ctx.local_world_size
    nodes = min(world / local, 2)
    bw = comms_bandwidth(ctx.topology, Collective.ALL_REDUCE, world, local)
    all_reduce = table_bytes * (2 * nodes - 1) / nodes / bw
    if world > 2 * local:
        all_reduce *= 2
    optimizer = table_bytes * DP_ELEMENTWISE_KERNELS_PERF_FACTOR / device_bw
    return _perf(ctx, fwd_compute, 0.0, all_reduce + optimizer, 0.0)


# --------------------------------------------------------------------------- storage


@dataclass(frozen=True, slots=True)
class Storage:
    """Bytes a shard occupies per tier; ``io_bytes`` (input ids plus output embeddings, part
    of HBM on cuda and of DDR on cpu) is broken out for reports."""

    hbm_bytes: int
    ddr_bytes: int
    input_bytes: int = 0
    output_bytes: int = 0


def estimate_storage(ctx: OptionContext, rows: int, cols: int) -> Storage:
    """Bytes one shard of ``rows`` x ``cols`` occupies in HBM and DDR."""
    input_bytes, output_bytes = _io_bytes(ctx, rows, cols)
    weights_hbm, weights_ddr = _weight_bytes(ctx, rows, cols)
    state_hbm, state_ddr = _optimizer_bytes(ctx, rows, cols, weights_hbm, weights_ddr)
    io = input_bytes + output_bytes
    if ctx.topology.compute_device is ComputeDevice.CPU:
        return Storage(0, io + weights_ddr + state_ddr, input_bytes, output_bytes)
    return Storage(io + weights_hbm + state_hbm, weights_ddr + state_ddr, input_bytes, output_bytes)


def _io_bytes(ctx: OptionContext, rows: int, cols: int) -> tuple[int, int]:
    """Input id buffers and output embedding buffers of one shard (no pipelining)."""
    kind, world = ctx.sharding_type, ctx.world_size
    ids, bags = ctx.load.batch_inputs, ctx.load.batch_outputs
    if kind is ShardingType.DATA_PARALLEL:
        dim = ctx.table.embedding_dim
        return math.ceil(ids * INDEX_BYTES), math.ceil(bags * dim * ctx.dtype_bytes)
    if kind in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE):
        if rows * cols == 0:
            return 0, 0
        group = world if kind is ShardingType.ROW_WISE else ctx.local_world_size
        ids = ids / group
        bags = bags if ctx.is_pooled else ids
    elif kind is ShardingType.TABLE_WISE:
        cols = ctx.table.embedding_dim
    return (
        math.ceil(ids * world * INDEX_BYTES),
        math.ceil(bags * world * cols * ctx.dtype_bytes),
    )


def _weight_bytes(ctx: OptionContext, rows: int, cols: int) -> tuple[int, int]:
    """The shard's weights in (HBM, DDR), plus the HBM cache and its bookkeeping."""
    table = ctx.table
    table_bytes = table.num_embeddings * table.embedding_dim * ctx.dtype_bytes
    kernel = ctx.compute_kernel
    if ctx.topology.compute_device is ComputeDevice.CPU or kernel in (
        ComputeKernel.FUSED_UVM,
        ComputeKernel.FUSED_UVM_CACHING,
    ):
        hbm_total, ddr_total = 0, table_bytes
    else:
        hbm_total, ddr_total = table_bytes, 0
    cached = kernel is ComputeKernel.FUSED_UVM_CACHING
    clf = ctx.cache_load_factor or 0.0
    if cached and ctx.topology.compute_device is ComputeDevice.CUDA:
        hbm_total = round(ddr_total * clf)
    hbm = _shard_part(ctx, hbm_total, rows, cols)
    ddr = _shard_part(ctx, ddr_total, rows, cols)
    if cached and ctx.topology.compute_device is ComputeDevice.CUDA:
        hbm += math.ceil(rows * (CACHE_INDEX_BYTES_PER_ROW + clf * CACHE_STATE_BYTES_PER_SLOT))
    return hbm, ddr


def _shard_part(ctx: OptionContext, total: int, rows: int, cols: int) -> int:
    """A shard's share of a table-wide byte count (a full copy for data-parallel)."""
    if ctx.sharding_type is ShardingType.DATA_PARALLEL:
        return total
    table = ctx.table
    return math.ceil(total * (rows * cols) / (table.num_embeddings * table.embedding_dim))


def _optimizer_bytes(
    ctx: OptionContext, rows: int, cols: int, weights_hbm: int, weights_ddr: int
) -> tuple[int, int]:
    """Optimizer state (and a data-parallel table's dense gradient) in (HBM, DDR).

    TorchRec 1.8 counts none when the optimizer is fused into the kernel; shardplan counts
    FBGEMM's fp32 state where the weights live (DDR for UVM kernels, the cache holds
    weights only).
    """
    if ctx.cost_model is CostModel.TORCHREC_1_8:
        return 0, 0
    state = ctx.table.optimizer.state_bytes(rows, cols)
    if ctx.sharding_type is ShardingType.DATA_PARALLEL:
        state += rows * cols * ctx.dtype_bytes  # the replica's dense gradient
    in_hbm = ctx.topology.compute_device is ComputeDevice.CUDA and ctx.compute_kernel in (
        ComputeKernel.FUSED,
        ComputeKernel.DENSE,
    )
    return (state, 0) if in_hbm else (0, state)
