"""``ShardedEmbeddingBagCollection``: an ``EmbeddingBagCollection`` laid out by a plan.

Every rank holds the shards the plan puts on it, grouped into FBGEMM table-batched kernels
(``SplitTableBatchedEmbeddingBagsCodegen``) with the optimizer fused into backward. A
forward pass on rank ``r``'s local batch:

1. **Input distribution.** Each feature's ids are routed to the ranks holding shards of its
   table: unchanged to every owner for table-wise, column-wise, table-column-wise and
   data-parallel tables; bucketised by row block (FBGEMM's ``block_bucketize_sparse_features``,
   ids made local to the block) for row-wise and table-row-wise tables. One all-to-all each
   for batch sizes and value counts, lengths, values and (for weighted tables) weights.
2. **Lookups.** Each rank pools every id it received with its kernels, in SUM mode, for the
   batches of all senders at once.
3. **Output distribution** (autograd-aware collectives). Whole columns go back to the rank
   whose batch they belong to in one all-to-all, and the receiver places every block by a
   fixed column map: column shards land at their column offsets (so shards on one rank in
   any order are stitched in column order). Row-wise partial sums are reduce-scattered over
   all ranks; table-row-wise partial sums are reduce-scattered inside the host, then
   exchanged across hosts among the ranks with one local index. Mean pooling divides by the
   bag length afterwards.
4. **Data-parallel** tables are replicas on every rank. Each replica pools the whole global
   batch; a rank uses its own replica's values, and gradients reach every replica, so each
   applies the same summed update with the same fused optimizer and the replicas stay equal
   (this is the all-reduce of gradients, done through the exchange that sharded tables use).

The layout of every rank is computed from the plan on every rank, so all ranks agree on
what each exchange carries without exchanging metadata beyond batch sizes and counts.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)
from torch import nn

from planner_service.plan.shards import row_block_size
from planner_service.plan.types import (
    ComputeKernel,
    DataType,
    PoolingType,
    ShardingPlan,
    ShardingType,
)
from runtime.comm import Group, all_to_all_with_grad, reduce_scatter_with_grad
from runtime.kernels import ADAM_HYPERPARAMETERS, CpuAdamEmbeddingBags
from runtime.modules import EmbeddingBagCollection, EmbeddingBagConfig, check_tables
from runtime.plan import ROW_SPLIT, ModulePlan, PlanMismatchError, check_plan, host_size
from runtime.sparse import KeyedJaggedTensor, KeyedTensor, offsets_from_lengths

OPTIMIZERS = {
    "sgd": EmbOptimType.EXACT_SGD,
    "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    "adagrad": EmbOptimType.EXACT_ADAGRAD,
    "adam": EmbOptimType.ADAM,
}
HYPERPARAMETERS = ("learning_rate", "eps", "beta1", "beta2", "weight_decay", "momentum")
DEFAULT_FUSED_PARAMS: dict[str, Any] = {"optimizer": "sgd", "learning_rate": 0.01}
WEIGHT_PRECISION = {DataType.FP32: SparseType.FP32, DataType.FP16: SparseType.FP16}
CUDA_LOCATIONS = {
    ComputeKernel.DENSE: EmbeddingLocation.DEVICE,
    ComputeKernel.FUSED: EmbeddingLocation.DEVICE,
    ComputeKernel.FUSED_UVM: EmbeddingLocation.MANAGED,
    ComputeKernel.FUSED_UVM_CACHING: EmbeddingLocation.MANAGED_CACHING,
}
DEFAULT_CACHE_LOAD_FACTOR = 0.2
# FBGEMM's fused kernel, or (adam on CPU) its dense lookup with Adam in backward.
Kernel: TypeAlias = SplitTableBatchedEmbeddingBagsCodegen | CpuAdamEmbeddingBags
KERNEL_TYPES = (SplitTableBatchedEmbeddingBagsCodegen, CpuAdamEmbeddingBags)
ROW_WISE, TABLE_ROW_WISE = ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class LocalShard:
    table: int  # index into the module's tables
    shard: int  # index into the plan's shards of that table
    row_offset: int
    rows: int
    col_offset: int
    cols: int
    replicated: bool  # a data-parallel replica
    row_split: bool  # a row block of a row-wise or table-row-wise table (partial sums)
    key: tuple[str, str, float]  # kernel group: location, data type, cache load factor


@dataclass(frozen=True)
class KernelGroup:
    key: tuple[str, str, float]
    shards: list[int]  # indices into RankLayout.shards: the kernel's tables
    features: list[tuple[int, int]]  # (route, shard) per kernel feature, in kernel order


@dataclass(frozen=True)
class Column:
    """A block of columns a rank's lookups produce, in the order its kernels produce them."""

    feature: int
    offset: int  # in the feature's embedding
    width: int
    replicated: bool
    row_split: bool


@dataclass
class RankLayout:
    """What one rank holds and receives: local shards, the features routed to it (the same
    list from every sender), its kernel groups and the columns its lookups produce."""

    shards: list[LocalShard] = field(default_factory=list)
    routes: list[tuple[int, int]] = field(default_factory=list)  # (feature, table)
    groups: list[KernelGroup] = field(default_factory=list)
    columns: list[Column] = field(default_factory=list)


def _group_key(
    sharding_kernel: ComputeKernel, table: EmbeddingBagConfig, clf: float | None, cuda: bool
) -> tuple[str, str, float]:
    if not cuda:  # on CPU every kernel location is host memory
        return ("host", table.data_type.value, 0.0)
    location = CUDA_LOCATIONS[sharding_kernel]
    caching = location is EmbeddingLocation.MANAGED_CACHING
    load = (clf or DEFAULT_CACHE_LOAD_FACTOR) if caching else 0.0
    return (location.name, table.data_type.value, float(load))


def build_layouts(
    plan: ModulePlan,
    tables: Sequence[EmbeddingBagConfig],
    features: Sequence[tuple[str, int]],
    cuda: bool,
) -> list[RankLayout]:
    layouts = [RankLayout() for _ in range(plan.world_size)]
    for t, table in enumerate(tables):
        sharding = plan.tables[table.name]
        replicated = sharding.sharding_type is ShardingType.DATA_PARALLEL
        row_split = sharding.sharding_type in ROW_SPLIT
        key = _group_key(sharding.compute_kernel, table, sharding.cache_load_factor, cuda)
        for s, placed in enumerate(sharding.shards):
            (r0, c0), (nr, nc) = placed.offsets, placed.sizes
            if nr and nc:
                local = LocalShard(t, s, r0, nr, c0, nc, replicated, row_split, key)
                layouts[placed.rank].shards.append(local)
    for layout in layouts:
        held = {shard.table for shard in layout.shards}
        layout.routes = [(f, t) for f, (_, t) in enumerate(features) if t in held]
        for key in sorted({shard.key for shard in layout.shards}):
            members = [i for i, shard in enumerate(layout.shards) if shard.key == key]
            kernel_features = [
                (r, i)
                for r, (_, t) in enumerate(layout.routes)
                for i in members
                if layout.shards[i].table == t
            ]
            layout.groups.append(KernelGroup(key, members, kernel_features))
            for r, i in kernel_features:
                shard = layout.shards[i]
                layout.columns.append(
                    Column(
                        layout.routes[r][0],
                        shard.col_offset,
                        shard.cols,
                        shard.replicated,
                        shard.row_split,
                    )
                )
    return layouts


def subgroup_families(plan: ModulePlan) -> list[list[list[int]]]:
    """The subgroups the table-row-wise exchange runs on, each family a partition of the
    ranks: the hosts, then the ranks with one local index (one per host).

    A function of the plan alone, run by every rank: all hosts' groups whenever the plan has
    a table-row-wise table, on whichever hosts, so every rank creates the same subgroups in
    the same order (``Group.subgroup_of`` says why that matters). A host without such
    tables creates its group and leaves it unused."""
    local = host_size(plan)
    if local is None:
        return []
    hosts = plan.world_size // local
    return [
        [list(range(h * local, (h + 1) * local)) for h in range(hosts)],
        [[h * local + i for h in range(hosts)] for i in range(local)],
    ]


# --------------------------------------------------------------------------- state


@dataclass
class ShardedWeight:
    """A table's weight as this rank holds it: the global size and the local shards, each
    with its (row, column) offset in the full table."""

    size: tuple[int, int]
    local_shards: list[tuple[tuple[int, int], torch.Tensor]]


# --------------------------------------------------------------------------- the module


class ShardedEmbeddingBagCollection(nn.Module):
    def __init__(
        self,
        module: EmbeddingBagCollection,
        plan: ModulePlan,
        pg: dist.ProcessGroup | None,
        device: torch.device,
        fused_params: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        tables = module.embedding_bag_configs()
        check_tables(tables)
        self.group = Group(pg)
        check_plan(plan, tables, self.group.world_size)
        self.plan_id = plan.plan_id
        self.device = device
        cuda = device.type == "cuda"
        optimizer, hyper = _optimizer(fused_params)
        for table in tables:
            if table.data_type not in WEIGHT_PRECISION:
                raise PlanMismatchError(
                    f"table {table.name!r} has data_type {table.data_type.value!r}; the "
                    f"sharded kernels train {[d.value for d in WEIGHT_PRECISION]}"
                )
        self._tables = list(tables)
        self._features = [
            (name, t) for t, table in enumerate(tables) for name in table.feature_names
        ]
        self._layouts = build_layouts(plan, tables, self._features, cuda)
        self._me = self._layouts[self.group.rank]
        self._build_exchange(plan)
        self.kernels = nn.ModuleList(
            self._kernel(group, optimizer, hyper, cuda) for group in self._me.groups
        )
        self._initialise(module)

    # ---- static exchange tables

    def _build_exchange(self, plan: ModulePlan) -> None:
        world, tables, features = self.group.world_size, self._tables, self._features
        device = self.device
        self._num_features = len(features)
        self._dims = [tables[t].embedding_dim for _, t in features]
        self._out_offsets = [0]
        for dim in self._dims:
            self._out_offsets.append(self._out_offsets[-1] + dim)
        rows = torch.tensor([tables[t].num_embeddings for _, t in features], dtype=torch.int64)
        self._rows_per_feature = rows.to(device)
        weighted = [tables[t].is_weighted for _, t in features]
        self._weighted = torch.tensor(weighted, dtype=torch.bool, device=device)
        self._any_weighted = any(weighted)
        mean = [tables[t].pooling is PoolingType.MEAN for _, t in features]
        self._feature_of_column = torch.tensor(
            [f for f, dim in enumerate(self._dims) for _ in range(dim)], dtype=torch.int64
        ).to(device)
        self._mean_mask = torch.tensor(
            [mean[f] for f, dim in enumerate(self._dims) for _ in range(dim)], dtype=torch.bool
        ).to(device)
        self._any_mean = any(mean)
        # Row-split features: bucket b of row feature j is pool segment F + b * F_row + j.
        row_tables = {
            t
            for t, table in enumerate(tables)
            if plan.tables[table.name].sharding_type in ROW_SPLIT
        }
        self._row_features = [f for f, (_, t) in enumerate(features) if t in row_tables]
        position = {f: j for j, f in enumerate(self._row_features)}
        blocks = {t: len(plan.tables[tables[t].name].shards) for t in row_tables}
        self._buckets = max(blocks.values(), default=0)
        self._block_sizes = torch.tensor(
            [
                row_block_size(tables[features[f][1]].num_embeddings, blocks[features[f][1]])
                for f in self._row_features
            ],
            dtype=torch.int64,
        ).to(device)
        self._row_index = torch.tensor(self._row_features, dtype=torch.int64).to(device)
        self._row_index_i32 = self._row_index.to(torch.int32)
        segments, dests = [], []
        for d, layout in enumerate(self._layouts):
            bucket_of = {s.table: s.shard for s in layout.shards}
            for f, t in layout.routes:
                if t in row_tables:
                    segments.append(
                        self._num_features + bucket_of[t] * len(self._row_features) + position[f]
                    )
                else:
                    segments.append(f)
                dests.append(d)
        self._send_segments = torch.tensor(segments, dtype=torch.int64).to(device)
        self._send_segments_i32 = self._send_segments.to(torch.int32)
        self._send_dest = torch.tensor(dests, dtype=torch.int64).to(device)
        # Shortcuts when a step is the identity (one rank holding everything, say).
        self._send_identity = segments == list(range(self._num_features)) and not self._row_features
        self._routes_to = [len(layout.routes) for layout in self._layouts]
        # Received segments come (sender, route); kernels want (group, kernel feature, sender).
        routes = len(self._me.routes)
        order = [
            s * routes + r for g in self._me.groups for r, _ in g.features for s in range(world)
        ]
        self._recv_order = torch.tensor(order, dtype=torch.int32).to(device)
        self._recv_identity = order == list(range(world * routes))
        self._build_output_exchange(plan, row_tables)

    def _build_output_exchange(self, plan: ModulePlan, row_tables: set[int]) -> None:
        """Where pooled columns go. Whole columns (table-wise, column-wise, table-column-wise,
        data-parallel) go straight to the sample's rank in one all-to-all. Row blocks hold
        partial sums: row-wise ones are reduce-scattered over all ranks; table-row-wise ones
        are reduce-scattered inside the host (local rank ``j`` gets the sums for the samples
        of every host's local rank ``j``), then exchanged across hosts among the ranks with
        one local index, so each sample's sum crosses hosts once, not once per block."""
        world, me, device = self.group.world_size, self.group.rank, self.device
        tables, features = self._tables, self._features
        width = sum(c.width for c in self._me.columns)
        # Whole columns: each rank's, and where they land in the output.
        self._whole_of = [
            sum(c.width for c in layout.columns if not c.row_split) for layout in self._layouts
        ]
        local_at: dict[int, int] = {}  # row-split feature -> its first local column
        whole: list[int] = []
        at = 0
        for c in self._me.columns:
            if c.row_split:
                local_at[c.feature] = at
            else:
                whole.extend(range(at, at + c.width))
            at += c.width
        self._whole_index = (
            None
            if whole == list(range(width))
            else torch.tensor(whole, dtype=torch.int64).to(device)
        )
        targets: list[int] = []
        ghosts: list[bool] = []
        for d, layout in enumerate(self._layouts):
            for c in layout.columns:
                if not c.row_split:
                    start = self._out_offsets[c.feature] + c.offset
                    targets.extend(range(start, start + c.width))
                    ghosts.extend([c.replicated and d != me] * c.width)

        # Row-split features: a rank without rows of the table (fewer rows than blocks)
        # contributes zeros, column `width` of the padded local output.
        self._pad_zero_column = False

        def gather(feature_list: list[int]) -> torch.Tensor:
            index: list[int] = []
            for f in feature_list:
                if f in local_at:
                    index.extend(range(local_at[f], local_at[f] + self._dims[f]))
                else:
                    index.extend([width] * self._dims[f])
                    self._pad_zero_column = True
            return torch.tensor(index, dtype=torch.int64).to(device)

        def land(feature_list: list[int]) -> None:
            for f in feature_list:
                targets.extend(range(self._out_offsets[f], self._out_offsets[f + 1]))
                ghosts.extend([False] * self._dims[f])

        kinds = {t: plan.tables[tables[t].name].sharding_type for t in row_tables}
        row_wise = [f for f in self._row_features if kinds[features[f][1]] is ROW_WISE]
        self._rw_columns = sum(self._dims[f] for f in row_wise)
        self._rw_index = gather(row_wise)
        land(row_wise)
        # Table-row-wise: hosts of `local` ranks; this rank is local rank `i` of host `h`.
        local = host_size(plan) or world
        hosts = world // local
        h, i = divmod(me, local)
        on_host: list[list[int]] = [[] for _ in range(hosts)]
        for f in self._row_features:
            sharding = plan.tables[tables[features[f][1]].name]
            if sharding.sharding_type is TABLE_ROW_WISE:
                on_host[sharding.shards[0].rank // local].append(f)
        self._twrw_columns = [sum(self._dims[f] for f in fs) for fs in on_host]
        self._twrw_index = gather(on_host[h])
        for fs in on_host:
            land(fs)
        self._local_size, self._hosts, self._host, self._local_rank = local, hosts, h, i
        self._host_ranks = list(range(h * local, (h + 1) * local))
        self._cross_ranks = [g * local + i for g in range(hosts)]  # local rank i of each host
        # Senders grouped by local rank: host member j reduces the batches of local rank j.
        self._by_local_rank = [g * local + j for j in range(local) for g in range(hosts)]
        subgroups = [self.group.subgroup_of(family) for family in subgroup_families(plan)]
        self._host_group = self._cross_group = None
        if any(self._twrw_columns):
            host_group, self._cross_group = subgroups
            if self._twrw_columns[h]:  # a host without such tables only receives
                self._host_group = host_group

        self._targets = torch.tensor(targets, dtype=torch.int64).to(device)
        self._ghosts = torch.tensor(ghosts, dtype=torch.bool).to(device)
        self._any_ghost = any(ghosts)
        self._targets_identity = targets == list(range(self._out_offsets[-1]))

    def output_exchanges(self) -> list[tuple[str, list[int]]]:
        """The collectives each step's output distribution runs on this rank, in order, with
        the ranks of the process group each runs on (for logs and tests)."""
        world = list(range(self.group.world_size))
        steps = [("all_to_all", world)]
        if self._rw_columns:
            steps.append(("reduce_scatter", world))
        if self._host_group is not None:
            steps.append(("reduce_scatter", list(self._host_ranks)))
        if self._cross_group is not None:
            steps.append(("all_to_all", list(self._cross_ranks)))
        return steps

    def _kernel(
        self, group: KernelGroup, optimizer: EmbOptimType, hyper: dict[str, float], cuda: bool
    ) -> Kernel:
        location_name, data_type, load = group.key
        location = EmbeddingLocation[location_name] if cuda else EmbeddingLocation.HOST
        compute = ComputeDevice.CUDA if cuda else ComputeDevice.CPU
        shards = [self._me.shards[i] for i in group.shards]
        table_of = {i: k for k, i in enumerate(group.shards)}
        extra = {"cache_load_factor": load} if location is EmbeddingLocation.MANAGED_CACHING else {}
        if optimizer is EmbOptimType.ADAM and not cuda:  # no fused CPU kernel in fbgemm
            return CpuAdamEmbeddingBags(
                [(s.rows, s.cols) for s in shards],
                [table_of[i] for _, i in group.features],
                WEIGHT_PRECISION[DataType(data_type)],
                hyper,
            )
        return SplitTableBatchedEmbeddingBagsCodegen(
            [(s.rows, s.cols, location, compute) for s in shards],
            feature_table_map=[table_of[i] for _, i in group.features],
            optimizer=optimizer,
            pooling_mode=PoolingMode.SUM,
            weights_precision=WEIGHT_PRECISION[DataType(data_type)],
            output_dtype=SparseType.FP32,
            device=self.device,
            **hyper,
            **extra,
        )

    def _initialise(self, module: EmbeddingBagCollection) -> None:
        """Shards start as the matching slices of the module's weights; a module on the meta
        device has none, so each shard is drawn from a generator seeded by the table name and
        the shard's offsets (replicas of a data-parallel table are therefore equal)."""
        with torch.no_grad():
            for group, kernel in zip(self._me.groups, self._kernels(), strict=True):
                views = kernel.split_embedding_weights()
                for i, view in zip(group.shards, views, strict=True):
                    shard = self._me.shards[i]
                    table = self._tables[shard.table]
                    weight = module.table_weight(table.name)
                    if weight.device.type == "meta":
                        seed = zlib.crc32(
                            f"{table.name}:{shard.row_offset}:{shard.col_offset}".encode()
                        )
                        bound = (1.0 / table.num_embeddings) ** 0.5
                        generator = torch.Generator().manual_seed(seed)
                        block = torch.empty(shard.rows, shard.cols).uniform_(
                            -bound, bound, generator=generator
                        )
                    else:
                        block = weight[
                            shard.row_offset : shard.row_offset + shard.rows,
                            shard.col_offset : shard.col_offset + shard.cols,
                        ]
                    view.copy_(block.to(view.dtype))

    def _kernels(self) -> list[Kernel]:
        return [k for k in self.kernels if isinstance(k, KERNEL_TYPES)]

    # ---- forward

    def _prepare(
        self, features: KeyedJaggedTensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, int]:
        """The module's features in module order: lengths, values, per-id weights (1 for
        unweighted tables), ids per feature and the batch size; ids are checked against their
        table's rows."""
        keys = features.keys()
        names = [name for name, _ in self._features]
        missing = [name for name in names if name not in keys]
        if missing:
            raise KeyError(f"features {missing} are not in the input (it has {keys})")
        if keys != names:
            features = features.permute([keys.index(name) for name in names])
        batch = features.stride()
        lengths = features.lengths().to(self.device, torch.int64)
        values = features.values().to(self.device, torch.int64)
        per_feature = lengths.view(self._num_features, batch).sum(dim=1)
        feature_of = torch.repeat_interleave(
            torch.arange(self._num_features, device=self.device), per_feature
        )
        bad = (values < 0) | (values >= self._rows_per_feature[feature_of])
        if bool(bad.any()):
            at = int(bad.nonzero()[0])
            f = int(feature_of[at])
            table = self._tables[self._features[f][1]]
            raise ValueError(
                f"feature {names[f]!r} has id {int(values[at])}; table {table.name!r} has "
                f"{table.num_embeddings} rows, so ids must be in [0, {table.num_embeddings})"
            )
        weights = None
        if self._any_weighted:
            given = features.weights_or_none()
            if given is None:
                raise ValueError("the module has weighted tables; the input has no weights")
            weights = torch.where(
                self._weighted[feature_of], given.to(self.device, torch.float32), 1.0
            )
        return lengths, values, weights, per_feature, batch

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        lengths, values, weights, per_feature, batch = self._prepare(features)
        world, group = self.group.world_size, self.group
        # ---- input distribution
        pool_lengths, pool_values, pool_weights = [lengths], [values], [weights]
        pool_counts = [per_feature]  # ids per segment: features, then row buckets
        if self._row_features:
            _, row_values, row_weights = torch.ops.fbgemm.permute_1D_sparse_data(
                self._row_index_i32, per_feature, values, weights
            )
            bucketed = torch.ops.fbgemm.block_bucketize_sparse_features(
                lengths.view(self._num_features, batch)[self._row_index].reshape(-1),
                row_values,
                False,
                False,
                self._block_sizes,
                self._buckets,
                row_weights,
            )
            bucket_lengths = bucketed[0].to(torch.int64)
            pool_lengths.append(bucket_lengths)
            pool_values.append(bucketed[1])
            pool_weights.append(bucketed[2])
            pool_counts.append(bucket_lengths.view(-1, batch).sum(dim=1))
        segment_counts = _cat(pool_counts)
        if self._send_identity:
            send_lengths, send_values, send_weights = lengths, values, weights
        else:
            all_values = _cat(pool_values)
            all_weights = _cat(pool_weights) if weights is not None else None  # type: ignore[arg-type]
            segments_lengths = _cat(pool_lengths).view(-1, batch)
            send_lengths = segments_lengths[self._send_segments].reshape(-1)
            _, send_values, send_weights = torch.ops.fbgemm.permute_1D_sparse_data(
                self._send_segments_i32, segment_counts, all_values, all_weights
            )
        to_dest = torch.zeros(world, dtype=torch.int64, device=self.device).index_add_(
            0, self._send_dest, segment_counts[self._send_segments]
        )
        meta = torch.stack([torch.full_like(to_dest, batch), to_dest], dim=1).reshape(-1)
        received = group.all_to_all(meta, [2] * world, [2] * world).view(world, 2).tolist()
        batches = [b for b, _ in received]
        counts = [c for _, c in received]
        send_splits = [batch * n for n in self._routes_to]
        routes = len(self._me.routes)
        recv_lengths = group.all_to_all(send_lengths, send_splits, [b * routes for b in batches])
        dest_counts = to_dest.tolist()
        recv_values = group.all_to_all(send_values, dest_counts, counts)
        recv_weights = None
        if send_weights is not None:
            recv_weights = group.all_to_all(send_weights, dest_counts, counts)
        # ---- lookups for every sender's batch at once
        local = self._lookup(recv_lengths, recv_values, recv_weights, batches, routes)
        # ---- output distribution
        gathered = _cat(self._distribute_outputs(local, batches, batch), dim=1)
        if self._any_ghost:  # replicas elsewhere: gradient only, the value is our own
            gathered = gathered - gathered.detach() * self._ghosts
        if self._targets_identity:
            out = gathered
        else:
            out = gathered.new_zeros(batch, self._out_offsets[-1])
            out = out.index_add(1, self._targets, gathered)
        if self._any_mean:
            bag = lengths.view(self._num_features, batch).t()[:, self._feature_of_column]
            divisor = torch.where(self._mean_mask, bag.clamp(min=1), 1).to(out.dtype)
            out = out / divisor
        keys = [name for name, _ in self._features]
        return KeyedTensor(keys, self._dims, out)

    def _distribute_outputs(
        self, local: torch.Tensor, batches: list[int], batch: int
    ) -> list[torch.Tensor]:
        """``[batch, columns]`` blocks of this rank's output, in ``self._targets`` order:
        whole columns from every rank, then row-wise sums, then table-row-wise sums by host."""
        group = self.group
        whole = local if self._whole_index is None else local.index_select(1, self._whole_index)
        mine = self._whole_of[group.rank]
        recv_splits = [batch * c for c in self._whole_of]
        back = all_to_all_with_grad(
            whole.reshape(-1), group, [b * mine for b in batches], recv_splits
        )
        blocks = [
            chunk.view(batch, c)
            for chunk, c in zip(back.split(recv_splits), self._whole_of, strict=True)
        ]
        if not self._rw_columns and self._cross_group is None:
            return blocks
        if self._pad_zero_column:
            local = torch.nn.functional.pad(local, (0, 1))
        if self._rw_columns:
            partial = local.index_select(1, self._rw_index)
            blocks.append(reduce_scatter_with_grad(partial, group, batches))
        if self._cross_group is not None:
            blocks.extend(self._table_row_wise_outputs(local, batches, batch))
        return blocks

    def _table_row_wise_outputs(
        self, local: torch.Tensor, batches: list[int], batch: int
    ) -> list[torch.Tensor]:
        """Reduce-scatter inside the host, then all-to-all among the ranks with this local
        index (one per host): ``[batch, columns of host g]`` for every host ``g``."""
        assert self._cross_group is not None
        local_size, hosts = self._local_size, self._hosts
        per_member = [
            sum(batches[g * local_size + j] for g in range(hosts)) for j in range(local_size)
        ]
        columns = self._twrw_columns[self._host]
        if self._host_group is not None:
            partial = local.index_select(1, self._twrw_index)
            if hosts > 1 and local_size > 1:
                rows = partial.split(batches)
                partial = torch.cat([rows[d] for d in self._by_local_rank])
            reduced = reduce_scatter_with_grad(partial, self._host_group, per_member)
        else:  # nothing of this kind on this host: it only receives
            reduced = local.new_zeros(per_member[self._local_rank], 0)
        send = [batches[d] * columns for d in self._cross_ranks]
        recv = [batch * c for c in self._twrw_columns]
        back = all_to_all_with_grad(reduced.reshape(-1), self._cross_group, send, recv)
        return [
            chunk.view(batch, c)
            for chunk, c in zip(back.split(recv), self._twrw_columns, strict=True)
        ]

    def _lookup(
        self,
        lengths: torch.Tensor,
        values: torch.Tensor,
        weights: torch.Tensor | None,
        batches: list[int],
        routes: int,
    ) -> torch.Tensor:
        total = sum(batches)
        if not self._me.groups:
            return torch.zeros(total, 0, device=self.device, requires_grad=True)
        if self._recv_identity:
            ordered_lengths, ordered_values, ordered_weights = lengths, values, weights
        else:
            segment_sizes = torch.tensor(
                [b for b in batches for _ in range(routes)], dtype=torch.int64, device=self.device
            )
            bag_ends = offsets_from_lengths(lengths)
            segment_ends = offsets_from_lengths(segment_sizes)
            segment_counts = bag_ends[segment_ends[1:]] - bag_ends[segment_ends[:-1]]
            _, ordered_lengths, _ = torch.ops.fbgemm.permute_1D_sparse_data(
                self._recv_order, segment_sizes, lengths
            )
            _, ordered_values, ordered_weights = torch.ops.fbgemm.permute_1D_sparse_data(
                self._recv_order, segment_counts, values, weights
            )
        outputs = []
        start_bag = start_value = 0
        for group, kernel in zip(self._me.groups, self._kernels(), strict=True):
            bags = len(group.features) * total
            group_lengths = ordered_lengths[start_bag : start_bag + bags]
            n = int(group_lengths.sum())
            end = start_value + n
            outputs.append(
                kernel(
                    ordered_values[start_value:end],
                    offsets_from_lengths(group_lengths),
                    per_sample_weights=(
                        None if ordered_weights is None else ordered_weights[start_value:end]
                    ),
                )
            )
            start_bag, start_value = start_bag + bags, end
        return _cat(outputs, dim=1)

    # ---- state

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, ShardedWeight]:  # type: ignore[override]
        """Each table's local shards with their global offsets (``embedding_bags.{name}.weight``,
        TorchRec's key); a table with nothing on this rank has no local shards."""
        state = {
            _key(table.name): ShardedWeight((table.num_embeddings, table.embedding_dim), [])
            for table in self._tables
        }
        for offsets, view, name in self._local_views():
            state[_key(name)].local_shards.append((offsets, view))
        return state

    def load_state_dict(  # type: ignore[override]
        self, state_dict: Mapping[str, torch.Tensor], strict: bool = True, assign: bool = False
    ) -> None:
        """Load full (unsharded) tables: each rank copies the slices its shards hold."""
        expected = {_key(t.name): t for t in self._tables}
        if strict:
            missing = sorted(set(expected) - set(state_dict))
            unexpected = sorted(set(state_dict) - set(expected))
            if missing or unexpected:
                raise KeyError(f"state_dict is missing {missing} and has unexpected {unexpected}")
        for key, table in expected.items():
            if key in state_dict:
                full = state_dict[key]
                if tuple(full.shape) != (table.num_embeddings, table.embedding_dim):
                    raise ValueError(
                        f"{key} has shape {tuple(full.shape)}; table {table.name!r} is "
                        f"{table.num_embeddings} x {table.embedding_dim}"
                    )
        with torch.no_grad():
            for (r0, c0), view, name in self._local_views():
                key = _key(name)
                if key in state_dict:
                    block = state_dict[key][r0 : r0 + view.shape[0], c0 : c0 + view.shape[1]]
                    view.copy_(block.to(view.device, view.dtype))

    def _local_views(self) -> list[tuple[tuple[int, int], torch.Tensor, str]]:
        return [
            ((s.row_offset, s.col_offset), view, self._tables[s.table].name)
            for group, kernel in zip(self._me.groups, self._kernels(), strict=True)
            for s, view in zip(
                (self._me.shards[i] for i in group.shards),
                kernel.split_embedding_weights(),
                strict=True,
            )
        ]

    def gather_state_dict(self) -> dict[str, torch.Tensor]:
        """The full tables on every rank (for export): shards gathered from all ranks."""
        mine = [(name, offset, view.detach().cpu()) for offset, view, name in self._local_views()]
        full = {
            t.name: torch.zeros(t.num_embeddings, t.embedding_dim, dtype=t.dtype)
            for t in self._tables
        }
        for shards in self.group.all_gather_object(mine):
            for name, (r0, c0), block in shards:
                full[name][r0 : r0 + block.shape[0], c0 : c0 + block.shape[1]] = block
        return {_key(name): weight for name, weight in full.items()}


def _cat(tensors: list[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """``torch.cat`` without the copy when there is one tensor."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=dim)


def _key(table: str) -> str:
    return f"embedding_bags.{table}.weight"


def _optimizer(fused_params: Mapping[str, Any] | None) -> tuple[EmbOptimType, dict[str, float]]:
    params = dict(DEFAULT_FUSED_PARAMS if fused_params is None else fused_params)
    name = str(params.pop("optimizer", "sgd"))
    if name not in OPTIMIZERS:
        raise ValueError(
            f"fused_params optimizer {name!r} is not supported; use one of {sorted(OPTIMIZERS)}"
        )
    unknown = sorted(set(params) - set(HYPERPARAMETERS))
    if unknown:
        raise ValueError(
            f"fused_params has unknown keys {unknown}; accepted: optimizer, "
            f"{', '.join(HYPERPARAMETERS)}"
        )
    unused = sorted(set(params) - set(ADAM_HYPERPARAMETERS)) if name == "adam" else []
    if unused:
        raise ValueError(
            f"fused_params has keys {unused} that adam does not use; adam takes "
            f"{', '.join(ADAM_HYPERPARAMETERS)}"
        )
    return OPTIMIZERS[name], {k: float(v) for k, v in params.items()}


def shard_modules(
    module: EmbeddingBagCollection,
    *,
    plan: ModulePlan | ShardingPlan | bytes | str | Mapping[str, object],
    pg: dist.ProcessGroup | None = None,
    device: torch.device | str | None = None,
    fused_params: Mapping[str, Any] | None = None,
) -> ShardedEmbeddingBagCollection:
    """Shard ``module`` by ``plan`` over ``pg`` (default: the default group if initialised,
    else a single rank). The plan is checked against the module and the group first."""
    if not isinstance(module, EmbeddingBagCollection):
        raise TypeError(
            f"shard_modules shards an EmbeddingBagCollection, not {type(module).__name__}"
        )
    if pg is None and dist.is_available() and dist.is_initialized():
        pg = dist.group.WORLD
    target = torch.device(device) if device is not None else torch.device("cpu")
    return ShardedEmbeddingBagCollection(module, ModulePlan.of(plan), pg, target, fused_params)


apply_sharding_plan = shard_modules
