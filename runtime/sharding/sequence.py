"""Output distribution of a sequence module: looked-up rows back to the rank whose ids they
are, each placed where its id stands in that rank's batch.

A sequence table gives one row per id, so nothing is summed across ranks: every holder
returns the rows of a sender's ids in one all-to-all, and the sender scatters them into
its output by an index it computes from what it sent (``Sent``: each sent id's place in the
batch) and the static ``SequenceExchange``. Column shards of a table land at their columns
whatever order the plan lists them in; a row-split table's ids come back from the block that
held them, in the batch's order. Data-parallel replicas work as in the pooled module: a rank
keeps its own replica's rows, and every replica gets the gradient of every rank's rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from runtime.comm import Group, all_to_all_with_grad
from runtime.modules import BaseEmbeddingConfig
from runtime.sharding.exchange import SequenceExchange
from runtime.sharding.inputs import LocalBatch, Received, Sent
from runtime.sharding.layout import features_of
from runtime.sparse import (
    JaggedTensor,
    concat,
    exclusive_cumsum,
    index_tensor,
    segment_sums,
)


class SequenceOutputDistribution:
    """This rank's ``SequenceExchange`` as tensors on the device."""

    def __init__(
        self,
        exchange: SequenceExchange,
        tables: Sequence[BaseEmbeddingConfig],
        group: Group,
        device: torch.device,
    ) -> None:
        self.exchange, self.group, self.device = exchange, group, device
        self.keys = [feature.name for feature in features_of(tables)]
        world = exchange.world_size
        # Receiving side: columns of each (kernel feature, sender) segment.
        self.segment_widths = index_tensor(
            [w for w in exchange.kernel_widths for _ in range(world)], device
        )
        self.back_order = index_tensor(exchange.back_order, device, torch.int32)
        # Sending side: the blocks that come back.
        self.block_rank = index_tensor(
            [d for d, n in enumerate(exchange.blocks_from) for _ in range(n)], device
        )
        self.block_segment = index_tensor(exchange.block_segment, device)
        self.block_width = index_tensor(exchange.block_width, device)
        self.block_column = index_tensor(exchange.block_column, device)
        self.block_feature = index_tensor(exchange.block_feature, device)
        self.block_ghost = (
            index_tensor(exchange.block_ghost, device, torch.bool)
            if any(exchange.block_ghost)
            else None
        )
        self.dims = index_tensor(exchange.dims, device)

    def __call__(
        self, rows: list[torch.Tensor], received: Received, sent: Sent, local: LocalBatch
    ) -> dict[str, JaggedTensor]:
        """This rank's output, a ``JaggedTensor`` per feature, from the rows its kernels
        looked up (one ``[ids, width]`` tensor per kernel, in kernel order)."""
        send, send_splits = self._to_senders(rows, received)
        ids, recv_splits = self._expected(sent)
        back = all_to_all_with_grad(send, self.group, send_splits, recv_splits)
        return self._place(back, ids, sent, local)

    def _to_senders(
        self, rows: list[torch.Tensor], received: Received
    ) -> tuple[torch.Tensor, list[int]]:
        """The looked-up rows, flat, sender by sender (then kernel feature by kernel feature),
        and how many values go to each sender."""
        world = self.exchange.world_size
        bags = index_tensor(
            [b for _ in self.exchange.kernel_widths for b in received.batches], self.device
        )
        values = segment_sums(received.lengths, bags) * self.segment_widths
        flat = (
            concat([r.reshape(-1) for r in rows])
            if rows
            else torch.zeros(0, device=self.device, requires_grad=torch.is_grad_enabled())
        )
        if not self.exchange.back_identity:
            _, order, _ = torch.ops.fbgemm.permute_1D_sparse_data(
                self.back_order, values, torch.arange(flat.numel(), device=self.device)
            )
            flat = flat.index_select(0, order)
        features = len(self.exchange.kernel_widths)
        per_sender = values.view(features, world).sum(dim=0)
        return flat, per_sender.tolist()

    def _expected(self, sent: Sent) -> tuple[torch.Tensor, list[int]]:
        """The rows in each block that comes back, and the values from each rank."""
        ids = sent.counts[self.block_segment]
        per_rank = ids.new_zeros(self.exchange.world_size).index_add_(
            0, self.block_rank, ids * self.block_width
        )
        return ids, per_rank.tolist()

    def _place(
        self, back: torch.Tensor, ids: torch.Tensor, sent: Sent, local: LocalBatch
    ) -> dict[str, JaggedTensor]:
        """Scatter the returned rows into each feature's ``[ids, dim]`` block: block ``b``'s
        ``k``-th row is the id at ``sent.positions`` of its segment's ``k``-th sent id."""
        block_of_row = torch.repeat_interleave(torch.arange(ids.numel(), device=self.device), ids)
        row_in_block = (
            torch.arange(block_of_row.numel(), device=self.device)
            - (exclusive_cumsum(ids)[block_of_row])
        )
        segment_start = exclusive_cumsum(sent.counts)[self.block_segment]
        position = sent.positions[segment_start[block_of_row] + row_in_block]
        feature = self.block_feature[block_of_row]
        id_start = exclusive_cumsum(local.per_feature)
        out_start = exclusive_cumsum(local.per_feature * self.dims)
        row_target = (
            out_start[feature]
            + (position - id_start[feature]) * self.dims[feature]
            + self.block_column[block_of_row]
        )
        width = self.block_width[block_of_row]
        target = torch.repeat_interleave(row_target, width) + (
            torch.arange(back.numel(), device=self.device)
            - torch.repeat_interleave(exclusive_cumsum(width), width)
        )
        if self.block_ghost is not None:  # another rank's replica: gradient only
            ghost = torch.repeat_interleave(self.block_ghost[block_of_row], width)
            back = back - back.detach() * ghost
        sizes = (local.per_feature * self.dims).tolist()
        out = back.new_zeros(sum(sizes)).index_add(0, target, back)
        lengths = local.lengths.view(len(self.keys), local.batch)
        return {
            key: JaggedTensor(values.view(-1, dim), lengths[f])
            for f, (key, values, dim) in enumerate(
                zip(self.keys, out.split(sizes), self.exchange.dims, strict=True)
            )
        }
