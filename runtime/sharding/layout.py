"""What each rank holds: its shards of each table, the features routed to it, the kernels
that pool them and the columns those kernels produce.

Pure functions of the plan and the tables. Every rank computes the layouts of all ranks, so
all ranks agree on what each exchange carries without exchanging metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from planner_service.plan.types import (
    DEFAULT_CACHE_LOAD_FACTOR,
    ComputeKernel,
    ShardingType,
    TableShardingModel,
)
from runtime.kernel_key import KernelKey, Memory
from runtime.modules import BaseEmbeddingConfig
from runtime.plan import ROW_SPLIT, ModulePlan, host_size

CUDA_MEMORY = {
    ComputeKernel.DENSE: Memory.DEVICE,
    ComputeKernel.FUSED: Memory.DEVICE,
    ComputeKernel.FUSED_UVM: Memory.MANAGED,
    ComputeKernel.FUSED_UVM_CACHING: Memory.MANAGED_CACHING,
}


class Feature(NamedTuple):
    name: str
    table: int  # index into the module's tables


def features_of(tables: Sequence[BaseEmbeddingConfig]) -> tuple[Feature, ...]:
    """The module's features in output order: by table, then the table's feature order."""
    return tuple(Feature(name, t) for t, table in enumerate(tables) for name in table.feature_names)


@dataclass(frozen=True)
class LocalShard:
    table: int  # index into the module's tables
    shard: int  # index into the plan's shards of that table (a row-split table's block)
    row_offset: int
    rows: int
    col_offset: int
    cols: int
    replicated: bool  # a data-parallel replica
    row_split: bool  # a row block of a row-wise or table-row-wise table (partial sums)
    key: KernelKey


@dataclass(frozen=True)
class KernelGroup:
    """One kernel: its tables (local shards) and its features, each a (route, shard) pair
    (the shard pools the route's ids), in the order the kernel pools them."""

    key: KernelKey
    shards: tuple[int, ...]  # indices into RankLayout.shards
    features: tuple[tuple[int, int], ...]  # (index into RankLayout.routes, into .shards)

    def feature_table_map(self) -> list[int]:
        """FBGEMM's ``feature_table_map``: each kernel feature's table in the kernel."""
        table_of = {shard: k for k, shard in enumerate(self.shards)}
        return [table_of[shard] for _, shard in self.features]


@dataclass(frozen=True)
class Column:
    """A block of columns a rank's lookups produce, in the order its kernels produce them."""

    feature: int
    offset: int  # in the feature's embedding
    width: int
    replicated: bool
    row_split: bool


@dataclass(frozen=True)
class RankLayout:
    """What one rank holds and receives: local shards, the features routed to it (every
    sender sends them in this order), its kernels and the columns its lookups produce."""

    shards: tuple[LocalShard, ...]
    routes: tuple[int, ...]  # features, in module order
    groups: tuple[KernelGroup, ...]
    columns: tuple[Column, ...]

    def shards_of(self, group: KernelGroup) -> list[LocalShard]:
        """The kernel's tables."""
        return [self.shards[i] for i in group.shards]

    @property
    def width(self) -> int:
        """Columns of this rank's pooled output."""
        return sum(c.width for c in self.columns)

    @property
    def whole_width(self) -> int:
        """Columns that are whole (not row-block partial sums): sent as they are."""
        return sum(c.width for c in self.columns if not c.row_split)


def kernel_key(
    sharding: TableShardingModel, table: BaseEmbeddingConfig, cuda: bool, index: int = -1
) -> KernelKey:
    """On CUDA one kernel batches every table of a memory location, data type and cache.
    On CPU every table (``index``) has its own kernel: FBGEMM's CPU backward costs more
    than the sum of its tables' when it batches them (4 tables of 400,000 x 128 rows, 11,264
    ids each: 5.3 ms together, 4 x 0.43 ms apart), and a weighted table made the whole
    batch take the weighted path (14 tables: 23 ms instead of 7.5), while a kernel call
    costs about 0.1 ms; apart, a rank's lookups cost the sum of its tables' (which the
    calibrated cost model prices)."""
    if not cuda:
        return KernelKey(Memory.HOST, table.data_type, 0.0, table=index)
    memory = CUDA_MEMORY[sharding.compute_kernel]
    caching = memory is Memory.MANAGED_CACHING
    load = (sharding.cache_load_factor or DEFAULT_CACHE_LOAD_FACTOR) if caching else 0.0
    return KernelKey(memory, table.data_type, float(load))


def build_layouts(
    plan: ModulePlan,
    tables: Sequence[BaseEmbeddingConfig],
    cuda: bool = False,
    sequence: bool = False,
) -> tuple[RankLayout, ...]:
    """Every rank's layout; a shard with no rows or no columns is held by nobody. Sequence
    kernels (``sequence``) hold shards of one width each."""
    held: list[list[LocalShard]] = [[] for _ in range(plan.world_size)]
    for t, table in enumerate(tables):
        sharding = plan.tables[table.name]
        replicated = sharding.sharding_type is ShardingType.DATA_PARALLEL
        row_split = sharding.sharding_type in ROW_SPLIT
        key = kernel_key(sharding, table, cuda, t)
        for s, placed in enumerate(sharding.shards):
            (r0, c0), (rows, cols) = placed.offsets, placed.sizes
            if rows and cols:
                shard_key = key._replace(width=cols) if sequence else key
                shard = LocalShard(t, s, r0, rows, c0, cols, replicated, row_split, shard_key)
                held[placed.rank].append(shard)
    features = features_of(tables)
    return tuple(_rank_layout(tuple(shards), features) for shards in held)


def _rank_layout(shards: tuple[LocalShard, ...], features: Sequence[Feature]) -> RankLayout:
    """One kernel per key (keys sorted); each routed feature is a kernel feature once per
    local shard of its table, so column shards of one table on one rank each look it up.

    Kernels take their features shard by shard (each shard's features in route order), so a
    kernel's ``feature_table_map`` never goes back to an earlier table. FBGEMM's CPU kernels
    need that of a table with two features and two column shards on one rank: route by
    route (``[0, 1, 0, 1]``) fbgemm-gpu-cpu 1.8.0's row-wise Adagrad backward stops at the
    first step back ("num of rows processed by adagrad: 0 does not match c_block size")
    and its unpooled kernel indexes out of bounds."""
    tables = {shard.table for shard in shards}
    routes = tuple(f for f, feature in enumerate(features) if feature.table in tables)
    groups = []
    for key in sorted({shard.key for shard in shards}):
        members = tuple(i for i, shard in enumerate(shards) if shard.key == key)
        pairs = tuple(
            (r, i)
            for i in members
            for r, f in enumerate(routes)
            if shards[i].table == features[f].table
        )
        groups.append(KernelGroup(key, members, pairs))
    columns = tuple(
        Column(routes[r], shard.col_offset, shard.cols, shard.replicated, shard.row_split)
        for group in groups
        for r, i in group.features
        for shard in [shards[i]]
    )
    return RankLayout(shards, routes, tuple(groups), columns)


@dataclass(frozen=True)
class Hosts:
    """Ranks ``h * size .. h * size + size - 1`` are host ``h``: the hosts the plan's
    table-row-wise tables span, or one host of every rank when it has none."""

    size: int  # ranks per host
    count: int

    def members(self, host: int) -> list[int]:
        return list(range(host * self.size, (host + 1) * self.size))

    def peers(self, rank: int) -> list[int]:
        """The ranks with ``rank``'s local index, one per host."""
        return [h * self.size + rank % self.size for h in range(self.count)]

    def by_local_index(self) -> list[int]:
        """Every rank, local index major: local rank 0 of each host, then local rank 1..."""
        return [h * self.size + i for i in range(self.size) for h in range(self.count)]


def hosts_of(plan: ModulePlan) -> Hosts:
    size = host_size(plan) or plan.world_size
    return Hosts(size, plan.world_size // size)


def subgroup_families(plan: ModulePlan) -> list[list[list[int]]]:
    """The subgroups the table-row-wise exchange runs on, each family a partition of the
    ranks: the hosts, then the ranks with one local index (one per host).

    A function of the plan alone, run by every rank: all hosts' groups whenever the plan has
    a table-row-wise table, on whichever hosts, so every rank creates the same subgroups in
    the same order (``Group.subgroup_of`` says why that matters). A host without such
    tables creates its group and leaves it unused."""
    if host_size(plan) is None:
        return []
    hosts = hosts_of(plan)
    return [
        [hosts.members(h) for h in range(hosts.count)],
        [hosts.peers(i) for i in range(hosts.size)],
    ]
