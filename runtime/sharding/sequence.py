"""Output distribution of a sequence module: looked-up rows back to the rank whose ids they
are, each placed where its id stands in that rank's batch.

A sequence table gives one row per id, so nothing is summed across ranks: every holder
returns the rows of a sender's ids in one all-to-all, and the sender places them in its
output by an index it computes from what it sent (``Sent``: each sent id's place in the
batch) and the static ``SequenceExchange``: one gather of whole rows (or of column chunks
where shards split a row), whose backward is a gather as well. Column shards of a table
land at their columns whatever order the plan lists them in; a row-split table's ids come
back from the block that held them, in the batch's order. Data-parallel replicas work as in
the pooled module: a rank keeps its own replica's rows, and every replica gets the gradient
of every rank's rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import accumulate, pairwise
from typing import Any

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
    """This rank's ``SequenceExchange`` as tensors on the device.

    Rows move as *chunks* of ``unit`` columns (the widest width that divides every shard's
    width and column offset and every feature's dim). What comes back is placed in one of
    two ways, feature by feature:

    - **whole**: every block of the feature holds the rows of all its ids, in batch order
      (table-wise, column-wise and table-column-wise shards, and this rank's own
      data-parallel replica): the feature's rows are its block as it came back (a view of
      the received buffer), or its column blocks side by side;
    - **placed**: some block holds a row block's rows (row-wise, table-row-wise) or another
      rank's replica: the blocks of such features are a permutation of the chunks of the
      output (``_Placement``).

    Placing whole features by a gather cost a random read of every row: 4 to 8 ms a step
    for eight table-wise sequence tables of 7 MB of rows at world size 2 on one core,
    where handing over their blocks costs nothing."""

    def __init__(
        self,
        exchange: SequenceExchange,
        tables: Sequence[BaseEmbeddingConfig],
        group: Group,
        device: torch.device,
    ) -> None:
        self.exchange, self.group, self.device = exchange, group, device
        self.keys = [feature.name for feature in features_of(tables)]
        self.unit = unit = _unit(
            exchange.kernel_widths, exchange.block_width, exchange.block_column, exchange.dims
        )
        # Receiving side: the chunks in a row of each kernel feature, and where each kernel's
        # (kernel feature, sender) segments start in their list.
        self.kernel_chunks = index_tensor([w // unit for w in exchange.kernel_widths], device)
        self.kernel_segments = list(
            accumulate((n * exchange.world_size for n in exchange.kernel_features), initial=0)
        )
        # Sending side: the blocks that come back and the chunks in a row of each.
        self.block_rank = index_tensor(
            [d for d, n in enumerate(exchange.blocks_from) for _ in range(n)], device
        )
        self.block_segment = index_tensor(exchange.block_segment, device)
        self.block_chunks = index_tensor([w // unit for w in exchange.block_width], device)
        blocks = range(len(exchange.block_feature))
        placed = {
            exchange.block_feature[b]
            for b in blocks
            if exchange.block_ghost[b] or exchange.block_row_split[b]
        }
        self.whole: dict[int, list[int]] = {}  # feature -> its blocks, in column order
        for b in sorted(blocks, key=lambda b: exchange.block_column[b]):
            if exchange.block_feature[b] not in placed:
                self.whole.setdefault(exchange.block_feature[b], []).append(b)
        # The received buffer cut into runs: a whole feature's block alone, or consecutive
        # blocks of placed features (ending at block ``run_last``).
        self.runs: list[tuple[int, ...]] = []
        for b in blocks:
            joins = (
                self.runs
                and exchange.block_feature[b] in placed
                and exchange.block_feature[self.runs[-1][-1]] in placed
            )
            if joins:
                self.runs[-1] += (b,)
            else:
                self.runs.append((b,))
        self.run_of = {run[0]: r for r, run in enumerate(self.runs)}
        self.placed_runs = [
            r for r, run in enumerate(self.runs) if exchange.block_feature[run[0]] in placed
        ]
        self.run_last = index_tensor([run[-1] for run in self.runs], device)
        placed_blocks = [b for b in blocks if exchange.block_feature[b] in placed]
        self.placement = (
            _Placement(exchange, placed_blocks, placed, device) if placed_blocks else None
        )

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
        """The looked-up rows as ``[chunks, unit]``, sender by sender (then kernel feature by
        kernel feature), and how many chunks go to each sender."""
        world, widths = self.exchange.world_size, self.exchange.kernel_widths
        if not rows:
            empty = torch.zeros(
                0, self.unit, device=self.device, requires_grad=torch.is_grad_enabled()
            )
            return empty, [0] * world
        bags = index_tensor([b for _ in widths for b in received.batches], self.device)
        ids = segment_sums(received.lengths, bags).view(len(widths), world)
        chunks = (ids * self.kernel_chunks[:, None]).view(-1).tolist()
        per_sender = [sum(chunks[j * world + s] for j in range(len(widths))) for s in range(world)]
        pieces = [r.reshape(-1, self.unit) for r in rows]
        if self.exchange.back_identity:
            return concat(pieces), per_sender
        # (kernel feature, sender) -> sender-major, in one copy straight from the kernels' rows,
        # not a concatenation and then a copy of it in another order (7.5 MB of rows from five
        # kernels: 0.2 ms instead of 0.5 to 0.75)
        segments = [
            segment
            for piece, (start, end) in zip(pieces, pairwise(self.kernel_segments), strict=True)
            for segment in piece.split(chunks[start:end])
        ]
        return torch.cat([segments[s] for s in self.exchange.back_order]), per_sender

    def _expected(self, sent: Sent) -> tuple[torch.Tensor, list[int]]:
        """The rows in each block that comes back, and the chunks from each rank."""
        ids = sent.counts[self.block_segment]
        per_rank = ids.new_zeros(self.exchange.world_size).index_add_(
            0, self.block_rank, ids * self.block_chunks
        )
        return ids, per_rank.tolist()

    def _place(
        self, back: torch.Tensor, ids: torch.Tensor, sent: Sent, local: LocalBatch
    ) -> dict[str, JaggedTensor]:
        """Each feature's ``[ids, dim]`` rows: whole features' from their blocks, the others'
        placed by ``_Placement``."""
        if len(self.runs) == 1:  # one whole block, or only placed features: no cutting
            runs = [back]
        else:
            ends = torch.cumsum(ids * self.block_chunks, 0)[self.run_last].tolist()
            runs = list(back.split([b - a for a, b in pairwise([0, *ends])]))
        placed: list[torch.Tensor] = []
        if self.placement is not None:
            mine = concat([runs[r] for r in self.placed_runs])
            placed = self.placement(mine, ids, sent, local)
        lengths = local.lengths.view(len(self.keys), local.batch)
        widths = self.exchange.block_width
        outputs: dict[str, JaggedTensor] = {}
        for f, (key, dim) in enumerate(zip(self.keys, self.exchange.dims, strict=True)):
            blocks = self.whole.get(f)
            if blocks is None:
                values = placed[f]
            else:
                columns = [runs[self.run_of[b]].reshape(-1, widths[b]) for b in blocks]
                values = concat(columns, dim=1)
            outputs[key] = JaggedTensor(values.reshape(-1, dim), lengths[f])
        return outputs


class _Placement:
    """The features some of whose rows come from row blocks or other ranks' replicas: their
    blocks (consecutive runs of the received buffer, concatenated) are a permutation of the
    chunks of their output, in chunks of their own ``unit``."""

    def __init__(
        self,
        exchange: SequenceExchange,
        blocks: list[int],
        features: set[int],
        device: torch.device,
    ) -> None:
        self.device = device
        self.blocks = index_tensor(blocks, device)
        self.every_block = len(blocks) == len(exchange.block_feature)
        widths = [exchange.block_width[b] for b in blocks]
        columns = [exchange.block_column[b] for b in blocks]
        feature_of = [exchange.block_feature[b] for b in blocks]
        self.unit = unit = _unit(widths, columns, [exchange.dims[f] for f in features])
        self.block_segment = index_tensor([exchange.block_segment[b] for b in blocks], device)
        self.block_chunks = index_tensor([w // unit for w in widths], device)
        self.one_chunk_rows = all(w == unit for w in widths)
        self.block_column = index_tensor([c // unit for c in columns], device)
        self.block_feature = index_tensor(feature_of, device)
        self.block_dim = index_tensor([exchange.dims[f] // unit for f in feature_of], device)
        ghosts = [exchange.block_ghost[b] for b in blocks]
        self.block_ghost = index_tensor(ghosts, device, torch.bool) if any(ghosts) else None
        # Per feature: its chunks in a row, counted only for the placed features.
        self.dim_chunks = index_tensor(
            [d // unit if f in features else 0 for f, d in enumerate(exchange.dims)], device
        )
        self.dims = index_tensor(
            [d if f in features else 0 for f, d in enumerate(exchange.dims)], device
        )

    def __call__(
        self, back: torch.Tensor, ids: torch.Tensor, sent: Sent, local: LocalBatch
    ) -> list[torch.Tensor]:
        """Per feature of the module, its rows (empty for features placed elsewhere):
        block ``b``'s ``k``-th row is the id at ``sent.positions`` of its segment's ``k``-th
        sent id."""
        chunks = back.reshape(-1, self.unit)
        if not self.every_block:
            ids = ids.index_select(0, self.blocks)
        target, ghost = self._targets(chunks.shape[0], ids, sent, local)
        sizes = (local.per_feature * self.dims).tolist()
        out = place_chunks(chunks, target, ghost, sum(sizes) // self.unit).reshape(-1)
        return list(out.split(sizes))

    def _targets(
        self, chunks: int, ids: torch.Tensor, sent: Sent, local: LocalBatch
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Where in the output (in chunks) each returned chunk lands, and which are ghosts.

        A block's values reach its rows by ``repeat_interleave`` and ``index_select``, not by
        indexing with each row's block: advanced indexing took 3.5 times as long (53,760
        rows of 8 blocks: 0.12 ms against 0.034 ms a gather). Every ``repeat_interleave`` is
        told its output's size, so that on cuda only the row count waits for the device."""
        returned = int(ids.sum())

        def per_row(values: torch.Tensor) -> torch.Tensor:  # each block's value, row by row
            return torch.repeat_interleave(values, ids, output_size=returned)

        # Per block: where its rows' ids are in ``sent.positions`` (less the rows before
        # it) and where in the output (in chunks) an id at batch position 0 would land.
        sent_at = exclusive_cumsum(sent.counts)[self.block_segment] - exclusive_cumsum(ids)
        feature = self.block_feature
        id_start = exclusive_cumsum(local.per_feature)[feature]
        out_start = exclusive_cumsum(local.per_feature * self.dim_chunks)[feature]
        base = out_start - id_start * self.block_dim + self.block_column
        rows = torch.arange(returned, device=self.device)
        position = sent.positions.index_select(0, per_row(sent_at) + rows)
        target = per_row(base) + position * per_row(self.block_dim)
        ghost = None if self.block_ghost is None else per_row(self.block_ghost)
        if self.one_chunk_rows:
            return target, ghost
        # A row of several chunks: chunk ``k`` of the returned ones lands ``k`` less its
        # row's first chunk after the row's target.
        per_chunk = per_row(self.block_chunks)
        first = exclusive_cumsum(per_chunk)
        target = torch.repeat_interleave(target - first, per_chunk, output_size=chunks)
        target += torch.arange(chunks, device=self.device)
        if ghost is not None:
            ghost = torch.repeat_interleave(ghost, per_chunk, output_size=chunks)
        return target, ghost


def _unit(*widths: Sequence[int]) -> int:
    """The widest chunk that divides every one of ``widths`` (at least 1)."""
    return max(1, math.gcd(*(w for group in widths for w in group)))


def place_chunks(
    chunks: torch.Tensor, target: torch.Tensor, ghost: torch.Tensor | None, total: int
) -> torch.Tensor:
    """``total`` chunks, chunk ``target[i]`` being ``chunks[i]``; a ghost chunk (another
    rank's data-parallel replica) is placed for its gradient only."""
    keep = torch.arange(chunks.shape[0], device=chunks.device)
    placed = target
    if ghost is not None:
        keep, placed = keep[~ghost], target[~ghost]
    # -1 where nothing lands, so a chunk the exchange failed to cover raises, not reads
    # uninitialised memory.
    source = torch.full((total,), -1, dtype=torch.int64, device=chunks.device)
    source.scatter_(0, placed, keep)  # (2.5 times as fast as ``source[placed] = keep``)
    result: torch.Tensor = _Permute.apply(chunks, source, target)
    return result


class _Permute(torch.autograd.Function):
    """Forward: ``x``'s rows picked by ``source``; backward: each row of ``x`` gets the
    gradient of the output row at ``target`` (its place). Gathers both ways, where
    ``index_select``'s own backward would scatter-add."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, source: torch.Tensor, target: torch.Tensor
    ) -> torch.Tensor:
        ctx.save_for_backward(target)
        return x.index_select(0, source)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (target,) = ctx.saved_tensors
        return grad.index_select(0, target), None, None
