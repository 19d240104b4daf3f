"""The ``calibrated`` cost model: shardplan's runtime priced with a device profile's
measured coefficients (``shardplan calibrate``; docs/cost-model.md, "The calibrated model").

Its structure follows what the runtime does in a step, not TorchRec's bandwidth model:

- every rank's kernel looks up the ids routed to each of its shards (the global batch for
  whole and column shards and for data-parallel replicas, which in this runtime each pool
  the global batch; a row block's share of it by rows for row-wise shards), at a cost per
  call, per id, per byte read and per byte written;
- backward with the fused optimizer costs per id and per byte of gradient, plus per byte
  of every distinct row it updates (rows touched, expected under uniform ids); a weighted
  table's backward reads its rows again (the weights' gradient): per id and byte read;
- the collectives cost a latency per call plus a time per byte a rank sends;
- the runtime's own work: a fixed time per step, per id received and per output byte, and
  per byte of a sequence table's rows put back in batch order (row-wise, table-row-wise
  and data-parallel sequence shards);
- **fixed costs** of a plan, paid by every rank whatever it holds: the step's own
  collectives, kernel calls and work, for each collection the tables make (pooled and
  sequence tables, and tables of different optimizers, are in collections of their own),
  and those each sharding type brings when a plan uses it at all (``fixed_perf``). Shard
  costs add up per rank as in the other models; the solver adds the fixed costs of the
  sharding types a plan uses (``solve/pipeline.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from planner_service.plan.types import Collective as CollectiveKind
from planner_service.plan.types import (
    CollectiveCoefficients,
    ComputeDevice,
    ComputeKernel,
    DeviceProfile,
    KernelCoefficients,
    Perf,
    PlanRequest,
    PoolingType,
    ShardingType,
    Topology,
)

INDEX_BYTES = 8  # ids are int64 on the wire
OUTPUT_ELEMENT_BYTES = 4  # pooled outputs and their gradients are fp32
NS_PER_MS = 1e6
US_PER_MS = 1e3
# The input distribution's all-to-alls: the counts, then lengths, ids and weights in one;
# the output's: one forward and its adjoint backward (runtime.sharding).
INPUT_ALL_TO_ALLS = 2
ROW_SPLIT = frozenset({ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE})
# Whole columns from every rank (``table_wise``, the column types, ``data_parallel``).
WHOLE_COLUMNS = frozenset(ShardingType) - ROW_SPLIT


def kernel_entry(
    profile: DeviceProfile, kernel: ComputeKernel, clf: float | None, pooled: bool = True
) -> KernelCoefficients:
    """The profile's coefficients of ``kernel`` (``pooled``, or unpooled for sequence
    tables: the unpooled entry of the kernel, or of ``fused``, when the profile has one, else
    the pooled entry); for ``fused_uvm_caching``, interpolated linearly in the cache hit rate
    between the measured rates around ``clf`` (the share of rows cached, taken as the share
    of ids that hit: uniform ids)."""
    if not pooled:
        unpooled = [k for k in profile.kernels if not k.pooled]
        exact = [k for k in unpooled if k.compute_kernel is kernel]
        fused = [k for k in unpooled if k.compute_kernel is ComputeKernel.FUSED]
        if exact or fused:
            return (exact or fused)[0]
    entries = [k for k in profile.kernels if k.compute_kernel is kernel and k.pooled]
    if kernel is not ComputeKernel.FUSED_UVM_CACHING or len(entries) == 1:
        return entries[0]
    rate = clf or 0.0
    entries.sort(key=lambda k: k.cache_hit_rate or 0.0)
    below = [k for k in entries if (k.cache_hit_rate or 0.0) <= rate] or entries[:1]
    above = [k for k in entries if (k.cache_hit_rate or 0.0) >= rate] or entries[-1:]
    low, high = below[-1], above[0]
    lo, hi = low.cache_hit_rate or 0.0, high.cache_hit_rate or 0.0
    if hi <= lo:
        return low
    share = (rate - lo) / (hi - lo)
    mixed = {
        name: (1 - share) * getattr(low, name) + share * getattr(high, name)
        for name in _KERNEL_COEFFICIENTS
    }
    return low.model_copy(update={**mixed, "cache_hit_rate": rate})


_KERNEL_COEFFICIENTS = (
    "fwd_ns_per_miss_byte",
    "bwd_ns_per_miss_byte",
    "call_fwd_ms",
    "call_bwd_ms",
    "fwd_us_per_id",
    "fwd_ns_per_byte",
    "fwd_ns_per_out_byte",
    "bwd_us_per_id",
    "bwd_ns_per_byte",
    "bwd_ns_per_row_byte",
    "weighted_bwd_us_per_id",
    "weighted_bwd_ns_per_byte",
    "weighted_bwd_ns_per_miss_byte",
)


def collective_entry(
    profile: DeviceProfile, collective: CollectiveKind, world: int, local: int
) -> CollectiveCoefficients | None:
    """The profile's measurement of ``collective`` closest to ``world`` ranks with
    ``local`` per host: the same world size and host split if measured, else the nearest
    world size (on a log scale), then host split. Reduce-scatter and all-gather fall back
    to all-to-all, which moves the same bytes; ``None`` if nothing was measured."""
    for kind in (collective, CollectiveKind.ALL_TO_ALL):
        entries = [c for c in profile.collectives if c.collective is kind]
        if entries:
            return min(
                entries,
                key=lambda c: (
                    abs(math.log(c.world_size / world)),
                    abs(math.log(c.ranks_per_host / local)),
                    c.world_size,
                    c.ranks_per_host,
                ),
            )
    return None


def collective_ms(
    profile: DeviceProfile,
    topology: Topology,
    collective: CollectiveKind,
    world: int,
    local: int,
    sent_bytes: float,
) -> float:
    """Per-byte time of a collective for ``sent_bytes`` (no latency: see ``fixed_perf``).
    Without a measurement, the topology's link bandwidth prices the bytes."""
    if world <= 1 or sent_bytes <= 0:
        return 0.0
    entry = collective_entry(profile, collective, world, local)
    if entry is not None:
        return entry.ns_per_byte * sent_bytes / NS_PER_MS
    bandwidth = (
        topology.intra_host_bw_bytes_per_s if world <= local else topology.inter_host_bw_bytes_per_s
    )
    return sent_bytes / bandwidth * 1e3


def collective_latency_ms(
    profile: DeviceProfile, collective: CollectiveKind, world: int, local: int
) -> float:
    if world <= 1:
        return 0.0
    entry = collective_entry(profile, collective, world, local)
    return 0.0 if entry is None else entry.latency_ms


def miss_share(resident_bytes: int, shard_bytes: float) -> float:
    """The share of reads from a shard of ``shard_bytes`` that miss what the processor
    keeps close (``resident_bytes``), for uniform ids: 0 when the shard fits."""
    if shard_bytes <= resident_bytes or shard_bytes <= 0:
        return 0.0
    return 1.0 - resident_bytes / shard_bytes


def rows_touched(rows: int, ids: float) -> float:
    """Expected distinct rows among ``ids`` uniform draws from ``rows`` rows."""
    if rows <= 0 or ids <= 0:
        return 0.0
    return rows * -math.expm1(-ids / rows)


def shard_perf(
    profile: DeviceProfile,
    *,
    topology: Topology,
    sharding_type: ShardingType,
    compute_kernel: ComputeKernel,
    cache_load_factor: float | None,
    table_rows: int,
    rows: int,
    cols: int,
    batch_inputs: float,
    batch_outputs: float,
    pooled: bool,
    weighted: bool,
    element_bytes: int,
    state_bytes_per_row: int,
) -> Perf:
    """Milliseconds per step one shard of ``rows`` x ``cols`` adds to the rank holding it
    (``batch_inputs``/``batch_outputs``: the table's ids and bags per rank per step)."""
    if rows == 0 or cols == 0:
        return Perf()  # the runtime holds no empty shard and routes it no ids
    world, local = topology.world_size, topology.num_local_ranks
    global_ids = batch_inputs * world
    ids = global_ids * rows / table_rows if sharding_type in ROW_SPLIT else global_ids
    bags = batch_outputs * world if pooled else ids
    row_bytes = cols * element_bytes
    out_bytes = bags * cols * OUTPUT_ELEMENT_BYTES
    kernel = kernel_entry(profile, compute_kernel, cache_load_factor, pooled)
    missed = ids * row_bytes * miss_share(kernel.resident_bytes, rows * row_bytes)
    # cpu: a kernel per table, so each shard pays its calls (on cuda: ``fixed_perf``)
    per_table = topology.compute_device is ComputeDevice.CPU
    fwd_compute = (
        (kernel.call_fwd_ms if per_table else 0.0)
        + kernel.fwd_us_per_id * ids / US_PER_MS
        + kernel.fwd_ns_per_byte * ids * row_bytes / NS_PER_MS
        + kernel.fwd_ns_per_out_byte * out_bytes / NS_PER_MS
        + kernel.fwd_ns_per_miss_byte * missed / NS_PER_MS
    )
    touched = rows_touched(rows, ids)
    bwd_compute = (
        (kernel.call_bwd_ms if per_table else 0.0)
        + kernel.bwd_us_per_id * ids / US_PER_MS
        + kernel.bwd_ns_per_byte * ids * row_bytes / NS_PER_MS
        + kernel.bwd_ns_per_row_byte * touched * (row_bytes + state_bytes_per_row) / NS_PER_MS
        + kernel.bwd_ns_per_miss_byte * missed / NS_PER_MS
    )
    if weighted:
        fwd_compute *= kernel.weighted_fwd_factor
        bwd_compute = (
            bwd_compute * kernel.weighted_bwd_factor
            + kernel.weighted_bwd_us_per_id * ids / US_PER_MS
            + kernel.weighted_bwd_ns_per_byte * ids * row_bytes / NS_PER_MS
            + kernel.weighted_bwd_ns_per_miss_byte * missed / NS_PER_MS
        )
    fwd_comms, bwd_comms = _output_exchange_ms(profile, topology, sharding_type, pooled, out_bytes)
    stitch = profile.runtime.output_ns_per_byte * out_bytes / NS_PER_MS
    placed_fwd, placed_bwd = _placed_bytes(sharding_type, pooled, out_bytes, world)
    per_placed_ms = profile.runtime.placement_ns_per_byte / NS_PER_MS
    id_bytes = ids * INDEX_BYTES * (2 if weighted else 1) * (world - 1) / world
    input_dist = (
        collective_ms(profile, topology, CollectiveKind.ALL_TO_ALL, world, local, id_bytes)
        + profile.runtime.input_us_per_id * ids / US_PER_MS
    )
    runtime = profile.runtime
    parts = {
        "fwd_compute": fwd_compute * runtime.compute_scale,
        "bwd_compute": bwd_compute * runtime.compute_scale,
        "fwd_comms": (fwd_comms + stitch + per_placed_ms * placed_fwd) * runtime.comms_scale,
        "bwd_comms": (bwd_comms + stitch + per_placed_ms * placed_bwd) * runtime.comms_scale,
        "input_dist": input_dist * runtime.input_scale,
    }
    return Perf(**parts, total=sum(parts.values()))


def _placed_bytes(
    kind: ShardingType, pooled: bool, out_bytes: float, world: int
) -> tuple[float, float]:
    """(forward, backward) bytes of a sequence shard's rows that the runtime puts in batch
    order, a gather each way (``runtime/sharding/sequence.py``): the rows of a row block
    all; of a data-parallel replica, which looks up every rank's ids, its own rank's share
    forward, every rank's backward (the others come back for their gradient only). A whole
    or column shard's rows come back in batch order and are handed over as they are."""
    if pooled:
        return 0.0, 0.0
    if kind in ROW_SPLIT:
        return out_bytes, out_bytes
    if kind is ShardingType.DATA_PARALLEL:
        return out_bytes / max(1, world), out_bytes
    return 0.0, 0.0


def _output_exchange_ms(
    profile: DeviceProfile, topology: Topology, kind: ShardingType, pooled: bool, out_bytes: float
) -> tuple[float, float]:
    """(forward, backward) ms of sending a shard's outputs to the ranks whose samples they
    are: an all-to-all (and its adjoint) for whole columns and for every shard of a
    sequence table (its rows go back whole, nothing is reduced); for pooled tables a
    reduce-scatter (adjoint: an all-gather) over the world for row-wise, over the host, then
    an all-to-all across hosts, for table-row-wise."""
    world, local = topology.world_size, topology.num_local_ranks
    hosts = max(1, world // local)
    a2a, rs, ag = (
        CollectiveKind.ALL_TO_ALL,
        CollectiveKind.REDUCE_SCATTER,
        CollectiveKind.ALL_GATHER,
    )

    def cost(kind_: CollectiveKind, group: int, per_host: int, share: float) -> float:
        sent = share * (group - 1) / group if group > 0 else 0.0
        return collective_ms(profile, topology, kind_, group, per_host, sent)

    if kind in WHOLE_COLUMNS or not pooled:
        each = cost(a2a, world, local, out_bytes)
        return each, each
    if kind is ShardingType.ROW_WISE:
        return cost(rs, world, local, out_bytes), cost(ag, world, local, out_bytes)
    cross = cost(a2a, hosts, 1, out_bytes / local)
    return cost(rs, local, local, out_bytes) + cross, cost(ag, local, local, out_bytes) + cross


def collections_of(request: PlanRequest) -> int:
    """How many sharded collections the request's tables make at least: pooled and sequence
    tables live in collections of their own kind (an ``EmbeddingBagCollection``, an
    ``EmbeddingCollection``), and a sharded collection fuses one optimizer into its kernels,
    so one per kind and optimizer (as ``shardplan measure`` builds them)."""
    return len({(t.pooling is PoolingType.NONE, t.optimizer) for t in request.tables})


def fixed_perf(request: PlanRequest, sharding_types: Iterable[ShardingType]) -> Perf:
    """What every rank pays per step under the calibrated model whatever shards it holds:
    the step's own work, its kernel calls and collective latencies, for each collection the
    tables make (``collections_of``: each distributes its ids and exchanges its outputs),
    plus those of each of ``sharding_types`` (the types a plan uses), once. Zero under the
    other models."""
    profile = request.options.device_profile
    if profile is None:
        return Perf()
    topology = request.topology
    world, local = topology.world_size, topology.num_local_ranks
    hosts = max(1, world // local)
    a2a, rs, ag = (
        CollectiveKind.ALL_TO_ALL,
        CollectiveKind.REDUCE_SCATTER,
        CollectiveKind.ALL_GATHER,
    )
    collections = collections_of(request)
    a2a_ms = collective_latency_ms(profile, a2a, world, local)
    input_dist = collections * INPUT_ALL_TO_ALLS * a2a_ms
    # cuda: one kernel per data type (and memory tier) of each collection on each rank;
    # cpu: a kernel per table, priced with its shards (``shard_perf``)
    cuda = topology.compute_device is ComputeDevice.CUDA
    calls = (
        len({(t.pooling is PoolingType.NONE, t.optimizer, t.data_type) for t in request.tables})
        if cuda
        else 0
    )
    kernel = kernel_entry(profile, ComputeKernel.FUSED, None)  # every device has it
    fwd_compute = collections * profile.runtime.step_ms + calls * kernel.call_fwd_ms
    bwd_compute = calls * kernel.call_bwd_ms
    fwd_comms = bwd_comms = collections * a2a_ms
    for kind in sorted(set(sharding_types)):
        fwd_comms += profile.runtime.sharding_type_ms.get(kind, 0.0)
        if kind is ShardingType.ROW_WISE:
            fwd_comms += collective_latency_ms(profile, rs, world, local)
            bwd_comms += collective_latency_ms(profile, ag, world, local)
        elif kind is ShardingType.TABLE_ROW_WISE:
            cross = collective_latency_ms(profile, a2a, hosts, 1)
            fwd_comms += collective_latency_ms(profile, rs, local, local) + cross
            bwd_comms += collective_latency_ms(profile, ag, local, local) + cross
    total = input_dist + fwd_compute + bwd_compute + fwd_comms + bwd_comms
    return Perf(
        fwd_compute=fwd_compute,
        fwd_comms=fwd_comms,
        bwd_compute=bwd_compute,
        bwd_comms=bwd_comms,
        input_dist=input_dist,
        total=total,
    )
