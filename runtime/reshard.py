"""Resharding in place: a sharded module moved to another plan over the same process group,
without a checkpoint on disk.

Every rank works out from the two plans alone what moves (``planner_service.plan.transfers``'
``table_transfers``, the regions ``shardplan migrate`` prints): for each shard of the new
plan, the parts its rank already holds are copied locally and every other part comes from
the rank the old plan put it on, data-parallel replicas spreading the sending. Each part
carries its weights and the fused optimizer's state for them (per element for Adagrad and
Adam, per row for row-wise Adagrad: the rule of ``runtime.sharding.state``). All of it
travels in one all-to-all of bytes whose split sizes are exactly those transfers' bytes,
so a rank sends nothing it keeps and nothing twice.

The old and the new shards are both in memory while the data moves (the new module is
built before the old one is dropped). A change of world size restarts the job on a new
process group: carry the state through a checkpoint (``runtime.checkpoint``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple, cast

import torch
from torch import nn

from planner_service.plan.transfers import Element, Transfer, boxes, table_kept, table_transfers
from planner_service.plan.types import ShardingType
from runtime.modules import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
)
from runtime.plan import ModulePlan
from runtime.sharding.module import (
    PlanSource,
    ShardedEmbeddingCollection,
    ShardedTables,
    shard_collection,
    sharded_collections,
    split_plan,
)
from runtime.sharding.state import Region, RowwiseParts, ShardState, block, overlap


class Resharded(NamedTuple):
    """The module under the new plan, and the bytes this rank sent to each rank and
    received from each rank (weights and optimizer state; what it kept is not counted)."""

    module: nn.Module
    sent: dict[int, int]
    received: dict[int, int]


def reshard(module: nn.Module, *, plan: PlanSource) -> Resharded:
    """Move ``module`` (a sharded collection, or a model holding them) to ``plan`` on the
    same process group, with its weights, fused optimizer state and step. Every rank calls
    it. A model's collections are replaced in place, in ``named_modules`` order."""
    whole = ModulePlan.of(plan)
    parts = sharded_collections(module)
    if not parts:
        raise TypeError(f"{type(module).__name__} holds no sharded collection to reshard")
    tables = [(path, old.tables) for path, old in parts]
    plans = split_plan(whole, tables, parts[0][1].group.world_size)
    sent: dict[int, int] = defaultdict(int)
    received: dict[int, int] = defaultdict(int)
    result: nn.Module = module
    for (path, old), part in zip(parts, plans, strict=True):
        new, out, into = _reshard_one(old, part)
        for rank, count in out.items():
            sent[rank] += count
        for rank, count in into.items():
            received[rank] += count
        if path:
            parent, _, name = path.rpartition(".")
            setattr(module.get_submodule(parent), name, new)
        else:
            result = new
    return Resharded(result, dict(sent), dict(received))


def _reshard_one(
    old: ShardedTables, plan: ModulePlan
) -> tuple[ShardedTables, dict[int, int], dict[int, int]]:
    skeleton: EmbeddingBagCollection | EmbeddingCollection
    if isinstance(old, ShardedEmbeddingCollection):
        skeleton = EmbeddingCollection(cast(list[EmbeddingConfig], old.tables), device="meta")
    else:
        skeleton = EmbeddingBagCollection(cast(list[EmbeddingBagConfig], old.tables), device="meta")
    new = shard_collection(skeleton, plan, old.group.pg, old.device, old.fused_params)
    me = old.group.rank
    before, after = old.shard_states(), new.shard_states()
    rowwise = {i: RowwiseParts(s) for i, s in enumerate(after) if s.rowwise is not None}
    held_before: dict[str, list[ShardState]] = defaultdict(list)
    for shard in before:
        held_before[shard.table.name].append(shard)
    held_after: dict[str, list[tuple[int, ShardState]]] = defaultdict(list)
    for index, shard in enumerate(after):
        held_after[shard.table.name].append((index, shard))
    outgoing: dict[int, list[torch.Tensor]] = defaultdict(list)
    # By sender, in transfer order: each part's region and the new shard (index) it fills.
    incoming: dict[int, list[tuple[Region, int, ShardState]]] = defaultdict(list)
    recv_bytes: dict[int, int] = defaultdict(int)
    with torch.no_grad():
        for table in old.tables:
            was, now = old.plan.tables[table.name], plan.tables[table.name]
            element = Element(table.data_type.size_bytes, old.optimizer)
            replicated = was.sharding_type is ShardingType.DATA_PARALLEL
            transfers = table_transfers(
                table.name, boxes(was), boxes(now), old_replicated=replicated, element=element
            )
            mine_before, mine_after = held_before[table.name], held_after[table.name]
            for transfer in transfers:
                if transfer.src == me:
                    source = _holding(mine_before, _region(transfer))
                    payload = _pack(source, _region(transfer))
                    assert sum(p.numel() for p in payload) == transfer.bytes
                    outgoing[transfer.dst] += payload
                if transfer.dst == me:
                    region = _region(transfer)
                    incoming[transfer.src].append((region, *_holding_indexed(mine_after, region)))
                    recv_bytes[transfer.src] += transfer.bytes
            for rank, rows, cols in table_kept(boxes(was), boxes(now)):
                if rank != me:
                    continue
                region = (rows[0], cols[0], rows[1] - rows[0], cols[1] - cols[0])
                source = _holding(mine_before, region)
                index, target = _holding_indexed(mine_after, region)
                _write(target, region, _blocks(source, region), rowwise.get(index))
        world = old.group.world_size
        send_splits = [sum(p.numel() for p in outgoing.get(r, [])) for r in range(world)]
        recv_splits = [recv_bytes.get(r, 0) for r in range(world)]
        chunks = [p for r in range(world) for p in outgoing.get(r, [])]
        send = torch.cat(chunks) if chunks else torch.empty(0, dtype=torch.uint8)
        data = old.group.all_to_all(send, send_splits, recv_splits)
        at = 0  # parts arrive grouped by sender, each sender's in transfer order
        for src in range(world):
            for region, index, target in incoming.get(src, []):
                pieces, at = _unpack(data, at, target, region)
                _write(target, region, pieces, rowwise.get(index))
        assert at == data.numel()
        for parts in rowwise.values():
            parts.write()
    steps = old.group.all_gather_object(old.optimizer_step)
    new.optimizer_step = max(steps)
    return new, dict(zip(range(world), send_splits, strict=True)), dict(recv_bytes)


def _region(transfer: Transfer) -> Region:
    (r0, r1), (c0, c1) = transfer.rows, transfer.cols
    return (r0, c0, r1 - r0, c1 - c0)


def _holding(shards: Sequence[ShardState], region: Region) -> ShardState:
    """The shard among ``shards`` that holds all of ``region``."""
    return _holding_indexed(list(enumerate(shards)), region)[1]


def _holding_indexed(
    shards: Sequence[tuple[int, ShardState]], region: Region
) -> tuple[int, ShardState]:
    for index, shard in shards:
        if overlap(shard.region, region) == region:
            return index, shard
    raise AssertionError(f"no local shard holds rows/columns {region}")  # plans are checked


def _blocks(shard: ShardState, region: Region) -> list[torch.Tensor]:
    """The weight, per-element state and per-row state of ``region`` in ``shard``."""
    return [block(tensor, shard.region, region) for tensor in shard.tensors()]


def _pack(shard: ShardState, region: Region) -> list[torch.Tensor]:
    """``region``'s state as flat bytes, in ``_blocks`` order."""
    return [part.contiguous().view(torch.uint8).reshape(-1) for part in _blocks(shard, region)]


def _unpack(
    data: torch.Tensor, at: int, like: ShardState, region: Region
) -> tuple[list[torch.Tensor], int]:
    """The tensors ``_pack`` put at byte ``at`` for ``region``, shaped like ``like``'s."""
    rows, cols = region[2], region[3]
    shapes: list[tuple[torch.dtype, tuple[int, ...]]] = [(like.weight.dtype, (rows, cols))]
    shapes += [(state.dtype, (rows, cols)) for state in like.elementwise]
    if like.rowwise is not None:
        shapes.append((like.rowwise.dtype, (rows,)))
    pieces = []
    for dtype, shape in shapes:
        count = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
        pieces.append(data[at : at + count].view(dtype).view(shape))
        at += count
    return pieces, at


def _write(
    target: ShardState, region: Region, pieces: list[torch.Tensor], rowwise: RowwiseParts | None
) -> None:
    """Put a part's weight and state into ``target``; its per-row state joins the shard's
    row-wise mean."""
    block(target.weight, target.region, region).copy_(pieces[0])
    for i, state in enumerate(target.elementwise):
        block(state, target.region, region).copy_(pieces[1 + i])
    if rowwise is not None:
        rowwise.add(region, pieces[-1])
