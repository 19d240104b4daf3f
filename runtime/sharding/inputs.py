"""Input distribution: each feature's ids from this rank's batch go to the ranks holding
shards of its table, and arrive ordered for those ranks' kernels.

Ids go unchanged to every owner for table-wise, column-wise, table-column-wise and
data-parallel tables; bucketed by row block (FBGEMM's ``block_bucketize_sparse_features``,
ids made local to the block) for row-wise and table-row-wise tables. One all-to-all each
for batch sizes and id counts, lengths, ids and (for weighted tables) per-id weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from runtime.comm import Group
from runtime.modules import BaseEmbeddingConfig, is_weighted
from runtime.sharding.exchange import InputExchange
from runtime.sharding.layout import features_of
from runtime.sparse import KeyedJaggedTensor, concat, index_tensor, segment_sums


class LocalBatch(NamedTuple):
    """This rank's batch, features in module order."""

    lengths: torch.Tensor  # feature-major: batch bags per feature
    values: torch.Tensor
    weights: torch.Tensor | None  # per id (1 for unweighted tables); None without weighted ones
    per_feature: torch.Tensor  # ids per feature
    batch: int


class Received(NamedTuple):
    """The ids this rank pools, for every sender's batch, in its kernels' order: kernel by
    kernel, kernel feature by kernel feature, sender by sender."""

    lengths: torch.Tensor
    values: torch.Tensor
    weights: torch.Tensor | None
    batches: list[int]  # each sender's batch size


class Sent(NamedTuple):
    """What this rank sent (sequence modules place the rows that come back by it): the ids
    in each segment, in send order, and each sent id's index in this rank's batch."""

    counts: torch.Tensor
    positions: torch.Tensor


class InputDistribution:
    """This rank's ``InputExchange`` as tensors on the device: checks a batch and sends
    its ids where the layouts say."""

    def __init__(
        self,
        exchange: InputExchange,
        tables: Sequence[BaseEmbeddingConfig],
        group: Group,
        device: torch.device,
        sequence: bool = False,
    ) -> None:
        """``sequence``: also say where each sent id stands in the batch (``Sent``)."""
        self.exchange, self.group, self.device = exchange, group, device
        self.sequence = sequence
        self.tables = list(tables)
        self.features = features_of(tables)
        per_feature = [tables[feature.table] for feature in self.features]
        self.rows = index_tensor([table.num_embeddings for table in per_feature], device)
        weighted = [is_weighted(table) for table in per_feature]
        self.weighted = index_tensor(weighted, device, torch.bool) if any(weighted) else None
        self.row_index = index_tensor(exchange.row_features, device)
        self.row_index_i32 = self.row_index.to(torch.int32)  # FBGEMM's permutations take int32
        self.block_rows = index_tensor(exchange.block_rows, device)
        self.send_segments = index_tensor(exchange.send_segments, device)
        self.send_segments_i32 = self.send_segments.to(torch.int32)
        self.send_ranks = index_tensor(exchange.send_ranks, device)
        self.recv_order = index_tensor(exchange.recv_order, device, torch.int32)

    def prepare(self, features: KeyedJaggedTensor) -> LocalBatch:
        """The module's features in module order, ids checked against their table's rows."""
        keys = features.keys()
        names = [feature.name for feature in self.features]
        missing = [name for name in names if name not in keys]
        if missing:
            raise KeyError(f"features {missing} are not in the input (it has {keys})")
        if keys != names:
            features = features.permute([keys.index(name) for name in names])
        batch = features.stride()
        lengths = features.lengths().to(self.device, torch.int64)
        values = features.values().to(self.device, torch.int64)
        per_feature = lengths.view(len(names), batch).sum(dim=1)
        feature_of = torch.repeat_interleave(
            torch.arange(len(names), device=self.device), per_feature
        )
        self._check_ids(values, feature_of)
        weights = None
        if self.weighted is not None:
            given = features.weights_or_none()
            if given is None:
                raise ValueError("the module has weighted tables; the input has no weights")
            weights = torch.where(
                self.weighted[feature_of], given.to(self.device, torch.float32), 1.0
            )
        return LocalBatch(lengths, values, weights, per_feature, batch)

    def _check_ids(self, values: torch.Tensor, feature_of: torch.Tensor) -> None:
        bad = (values < 0) | (values >= self.rows[feature_of])
        if bool(bad.any()):
            at = int(bad.nonzero()[0])
            feature = self.features[int(feature_of[at])]
            table = self.tables[feature.table]
            raise ValueError(
                f"feature {feature.name!r} has id {int(values[at])}; table {table.name!r} has "
                f"{table.num_embeddings} rows, so ids must be in [0, {table.num_embeddings})"
            )

    def __call__(
        self, local: LocalBatch, group: Group | None = None
    ) -> tuple[Received, Sent | None]:
        """The ids every rank sends this rank, in kernel order, and (sequence modules) what
        this rank sent. ``group``: another group over the same ranks in the same order (a
        pipeline's), instead of the module's."""
        group = group if group is not None else self.group
        world, batch = group.world_size, local.batch
        lengths, values, weights, counts, positions = self._send_order(local)
        to_rank = torch.zeros(world, dtype=torch.int64, device=self.device).index_add_(
            0, self.send_ranks, counts
        )
        sizes = torch.stack([torch.full_like(to_rank, batch), to_rank], dim=1).reshape(-1)
        received = group.all_to_all(sizes, [2] * world, [2] * world).view(world, 2).tolist()
        batches = [b for b, _ in received]
        from_rank = [n for _, n in received]
        routes = self.exchange.routes_to
        recv_lengths, recv_values, recv_weights = _exchange_ids(
            group,
            (lengths, values, weights),
            ([batch * n for n in routes], to_rank.tolist()),
            ([b * routes[group.rank] for b in batches], from_rank),
        )
        sent = None if positions is None else Sent(counts, positions)
        return self._kernel_order(Received(recv_lengths, recv_values, recv_weights, batches)), sent

    def _send_order(
        self, local: LocalBatch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """Lengths, ids and weights of the segments sent, destination by destination, the
        ids in each segment and (sequence modules) each sent id's index in the batch."""
        pool_lengths, pool_values, pool_weights = [local.lengths], [local.values], [local.weights]
        pool_counts = [local.per_feature]
        pool_positions = [_positions(local)] if self.sequence else []
        if self.exchange.row_features:
            lengths, values, weights, positions = self._buckets(local)
            pool_lengths.append(lengths)
            pool_values.append(values)
            pool_weights.append(weights)
            buckets = self.exchange.buckets * len(self.exchange.row_features)
            pool_counts.append(lengths.view(buckets, local.batch).sum(dim=1))
            pool_positions.extend([positions] if self.sequence else [])
        counts = concat(pool_counts)
        if self.exchange.send_identity:
            unmoved = pool_positions[0] if self.sequence else None
            return local.lengths, local.values, local.weights, counts, unmoved
        weights = None
        if local.weights is not None:
            weights = concat([w for w in pool_weights if w is not None])
        segments = len(self.features) + self.exchange.buckets * len(self.exchange.row_features)
        lengths = concat(pool_lengths).view(segments, local.batch)[self.send_segments].reshape(-1)
        _, values, weights = torch.ops.fbgemm.permute_1D_sparse_data(
            self.send_segments_i32, counts, concat(pool_values), weights
        )
        sent_positions = None
        if self.sequence:
            _, sent_positions, _ = torch.ops.fbgemm.permute_1D_sparse_data(
                self.send_segments_i32, counts, concat(pool_positions)
            )
        return lengths, values, weights, counts[self.send_segments], sent_positions

    def _buckets(
        self, local: LocalBatch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Lengths, ids and weights of the row-split features' ids bucketed by row block
        (bucket-major), ids made local to their block, and each bucketed id's index in the
        batch (only filled in for sequence modules)."""
        if self.sequence:  # no per-id weights in sequence modules
            _, positions, _ = torch.ops.fbgemm.permute_1D_sparse_data(
                self.row_index_i32, local.per_feature, _positions(local)
            )
            values, weights = local.values[positions], None
        else:
            _, values, weights = torch.ops.fbgemm.permute_1D_sparse_data(
                self.row_index_i32, local.per_feature, local.values, local.weights
            )
            positions = values[:0]
        lengths = local.lengths.view(len(self.features), local.batch)[self.row_index]
        bucketed = torch.ops.fbgemm.block_bucketize_sparse_features(
            lengths.reshape(-1),
            values,
            False,  # bucketize_pos
            self.sequence,  # sequence: also return where each id went (unbucketize_permute)
            self.block_rows,
            self.exchange.buckets,
            weights,
        )
        if self.sequence:  # bucketed id unbucketize[i] is the i-th id before bucketing
            positions = positions.new_empty(positions.shape).index_copy_(0, bucketed[4], positions)
        return bucketed[0].to(torch.int64), bucketed[1], bucketed[2], positions

    def _kernel_order(self, received: Received) -> Received:
        """Received segments come by (sender, route); reorder them for the kernels."""
        if self.exchange.recv_identity:
            return received
        routes = self.exchange.routes_to[self.group.rank]
        segment_bags = index_tensor(
            [b for b in received.batches for _ in range(routes)], self.device
        )
        segment_ids = segment_sums(received.lengths, segment_bags)
        _, lengths, _ = torch.ops.fbgemm.permute_1D_sparse_data(
            self.recv_order, segment_bags, received.lengths
        )
        _, values, weights = torch.ops.fbgemm.permute_1D_sparse_data(
            self.recv_order, segment_ids, received.values, received.weights
        )
        return Received(lengths, values, weights, received.batches)


def _exchange_ids(
    group: Group,
    tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
    send: tuple[list[int], list[int]],
    recv: tuple[list[int], list[int]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Lengths, ids and (weighted modules) weights to every rank in ONE all-to-all: each
    destination's chunk is its lengths, then its ids, then its weights' bits as int64
    (every rank holds the same tables, so all agree on whether weights come). One
    collective instead of three costs one latency instead of three each step (measured
    with ``shardplan measure``: gloo's latency was most of the input distribution).
    ``send``/``recv``: (lengths, ids) per destination / source."""
    lengths, values, weights = tensors
    if group.world_size == 1:
        return lengths, values, weights
    per_id = 1 if weights is None else 2
    columns = [lengths, values] + ([] if weights is None else [_as_int64(weights)])
    splits = [send[0], send[1]] + ([] if weights is None else [send[1]])
    chunks = [column.split(split) for column, split in zip(columns, splits, strict=True)]
    payload = torch.cat([part[d] for d in range(group.world_size) for part in chunks])
    send_splits = [n + per_id * ids for n, ids in zip(send[0], send[1], strict=True)]
    recv_splits = [n + per_id * ids for n, ids in zip(recv[0], recv[1], strict=True)]
    received = group.all_to_all(payload, send_splits, recv_splits).split(recv_splits)
    parts: list[list[torch.Tensor]] = [[] for _ in columns]
    for chunk, n, ids in zip(received, recv[0], recv[1], strict=True):
        for i, piece in enumerate(chunk.split([n, ids] + ([ids] if weights is not None else []))):
            parts[i].append(piece)
    out = [torch.cat(part) for part in parts]
    return out[0], out[1], None if weights is None else _from_int64(out[2])


def _as_int64(weights: torch.Tensor) -> torch.Tensor:
    """float32 weights' bits in int64 elements (sign-extended; ``_from_int64`` undoes it)."""
    return weights.contiguous().view(torch.int32).to(torch.int64)


def _from_int64(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)


def _positions(local: LocalBatch) -> torch.Tensor:
    """Each id's index in the batch."""
    return torch.arange(local.values.numel(), device=local.values.device)
