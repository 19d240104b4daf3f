"""Full (unsharded) tables and fused optimizer state, gathered from every rank's shards for
export or inspection (``ShardedTables.full_state``).

Keys are a checkpoint's (``runtime.checkpoint``), each a whole tensor on the CPU:

- ``{weight key}``: ``[rows, dim]`` in the table's data type;
- ``{weight key}.momentum1`` (Adagrad's accumulator, Adam's first moment) and
  ``.momentum2`` (Adam's second moment): ``[rows, dim]`` fp32;
- ``{weight key}.momentum1.columns_{c0}_{c1}`` (row-wise Adagrad): ``[rows]`` fp32, one per
  column range of the plan (``columns_0_{dim}`` alone unless the plan splits the table's
  columns: FBGEMM keeps one accumulator per row of each shard).

Every rank computes every rank's layout from the plan, so each knows, without exchanging
any metadata, which shards every rank sends and their bytes. A region held by several ranks
(a data-parallel table's replicas, which are equal) is sent by the lowest of them only. It
all travels in one all-to-all of bytes on the module's group: to ``dst`` alone, or to every
rank. It is for export, not the training step: a receiving rank holds every full table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from planner_service.plan.types import OptimizerType
from runtime.comm import Group
from runtime.modules import BaseEmbeddingConfig
from runtime.sharding.layout import LocalShard, RankLayout
from runtime.sharding.state import ELEMENTWISE_STATE, Region, ShardState, rowwise_key
from runtime.sharding.weights import state_key


class Piece(NamedTuple):
    """One tensor of a shard as it travels: the full tensor it belongs to (``key``) and
    where in it (``offsets`` of ``shape``: row and column, or the row of row-wise state)."""

    key: str
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def num_bytes(self) -> int:
        return torch.Size(self.shape).numel() * torch.empty(0, dtype=self.dtype).element_size()

    def target(self, full: torch.Tensor) -> torch.Tensor:
        """The block of ``full`` this piece fills."""
        return full[tuple(slice(o, o + n) for o, n in zip(self.offsets, self.shape, strict=True))]


def gather_full_state(
    layouts: Sequence[RankLayout],
    tables: Sequence[BaseEmbeddingConfig],
    shards: Sequence[ShardState],
    optimizer: OptimizerType,
    group: Group,
    device: torch.device,
    *,
    dst: int | None,
    optimizer_state: bool,
) -> dict[str, torch.Tensor]:
    """The full tensors on rank ``dst`` of ``group`` (``None``: on every rank), an empty
    dict on the others. ``shards`` are this rank's ``shard_states`` (on ``device``, where
    the group's collectives run); every rank calls it."""
    if dst is not None and not 0 <= dst < group.world_size:
        raise ValueError(
            f"dst {dst} is not a rank of the module's process group (ranks 0 to "
            f"{group.world_size - 1}); pass one of them, or None for every rank"
        )
    pieces = rank_pieces(layouts, tables, optimizer, optimizer_state)
    mine = [shards[i] for i in senders(layouts)[group.rank]]
    send = _pack(mine, optimizer_state, device)
    assert send.numel() == sum(p.num_bytes for p in pieces[group.rank])
    receivers = range(group.world_size) if dst is None else [dst]
    sizes = [sum(p.num_bytes for p in rank) for rank in pieces]
    send_splits = [send.numel() if r in receivers else 0 for r in range(group.world_size)]
    recv_splits = sizes if group.rank in receivers else [0] * group.world_size
    data = group.all_to_all(send.repeat(len(receivers)), send_splits, recv_splits)
    if group.rank not in receivers:
        return {}
    full = empty_full(layouts, tables, optimizer, optimizer_state)
    _unpack(data.cpu(), pieces, full)
    return full


def shard_pieces(
    table: BaseEmbeddingConfig, region: Region, optimizer: OptimizerType, optimizer_state: bool
) -> list[Piece]:
    """A shard's tensors in ``ShardState.tensors`` order: the weight, the per-element
    state, the per-row state."""
    r0, c0, rows, cols = region
    key = state_key(table)
    pieces = [Piece(key, (r0, c0), (rows, cols), table.dtype)]
    if not optimizer_state:
        return pieces
    for name in ELEMENTWISE_STATE[optimizer]:
        pieces.append(Piece(f"{key}.{name}", (r0, c0), (rows, cols), torch.float32))
    if optimizer is OptimizerType.ROWWISE_ADAGRAD:
        pieces.append(Piece(rowwise_key(key, (c0, c0 + cols)), (r0,), (rows,), torch.float32))
    return pieces


def senders(layouts: Sequence[RankLayout]) -> list[list[int]]:
    """For each rank, which of its shards (indices in ``shard_states`` order) it sends: all
    but those a lower rank holds too (data-parallel replicas)."""
    seen: set[tuple[int, Region]] = set()
    result = []
    for layout in layouts:
        sent = []
        for index, shard in enumerate(_in_state_order(layout)):
            if (shard.table, _region(shard)) not in seen:
                seen.add((shard.table, _region(shard)))
                sent.append(index)
        result.append(sent)
    return result


def rank_pieces(
    layouts: Sequence[RankLayout],
    tables: Sequence[BaseEmbeddingConfig],
    optimizer: OptimizerType,
    optimizer_state: bool,
) -> list[list[Piece]]:
    """Every rank's pieces, in the order it packs them."""
    result = []
    for layout, sent in zip(layouts, senders(layouts), strict=True):
        held = _in_state_order(layout)
        shards = [held[index] for index in sent]
        result.append(
            [
                piece
                for shard in shards
                for piece in shard_pieces(
                    tables[shard.table], _region(shard), optimizer, optimizer_state
                )
            ]
        )
    return result


def empty_full(
    layouts: Sequence[RankLayout],
    tables: Sequence[BaseEmbeddingConfig],
    optimizer: OptimizerType,
    optimizer_state: bool,
) -> dict[str, torch.Tensor]:
    """The full tensors, zeroed, in table order: the weight, the per-element state, then
    the row-wise state of each column range the plan's shards of the table have."""
    columns: dict[int, set[tuple[int, int]]] = {t: set() for t in range(len(tables))}
    for shard in (s for layout in layouts for s in layout.shards):
        columns[shard.table].add((shard.col_offset, shard.col_offset + shard.cols))
    full = {}
    for t, table in enumerate(tables):
        key, size = state_key(table), (table.num_embeddings, table.embedding_dim)
        full[key] = torch.zeros(size, dtype=table.dtype)
        if not optimizer_state:
            continue
        for name in ELEMENTWISE_STATE[optimizer]:
            full[f"{key}.{name}"] = torch.zeros(size, dtype=torch.float32)
        if optimizer is OptimizerType.ROWWISE_ADAGRAD:
            for cols in sorted(columns[t]):
                full[rowwise_key(key, cols)] = torch.zeros(size[0], dtype=torch.float32)
    return full


def _region(shard: LocalShard) -> Region:
    return (shard.row_offset, shard.col_offset, shard.rows, shard.cols)


def _in_state_order(layout: RankLayout) -> list[LocalShard]:
    """A rank's shards in the order of its ``shard_states``: kernel by kernel."""
    return [shard for group in layout.groups for shard in layout.shards_of(group)]


def _pack(
    shards: Sequence[ShardState], optimizer_state: bool, device: torch.device
) -> torch.Tensor:
    """``shards``' tensors as one flat byte tensor, in ``shard_pieces`` order."""
    parts = [
        tensor.contiguous().view(torch.uint8).reshape(-1)
        for shard in shards
        for tensor in (shard.tensors() if optimizer_state else [shard.weight])
    ]
    if not parts:
        return torch.empty(0, dtype=torch.uint8, device=device)
    return torch.cat(parts)


def _unpack(
    data: torch.Tensor, pieces: Sequence[Sequence[Piece]], full: dict[str, torch.Tensor]
) -> None:
    """Fill ``full`` from ``data``: every sender's pieces, senders in rank order."""
    at = 0
    for piece in (p for rank in pieces for p in rank):
        block = data[at : at + piece.num_bytes].view(piece.dtype).view(piece.shape)
        piece.target(full[piece.key]).copy_(block)
        at += piece.num_bytes
    assert at == data.numel(), (at, data.numel())
