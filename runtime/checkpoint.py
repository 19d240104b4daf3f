"""Sharded checkpoints that survive a new plan: ``save_checkpoint`` and ``load_checkpoint``.

A checkpoint is a ``torch.distributed.checkpoint`` (DCP) directory plus a manifest
(``shardplan.json``). Every rank writes the shards it holds, each with its global offsets in
its table, and the fused optimizer's state for them; data-parallel replicas are written
once (DCP keeps one of identical chunks). Loading is a DCP read of, for each shard of the
*new* plan, the parts of the stored chunks it overlaps, so the new plan may have another
world size and other sharding types: a table-wise table comes back row-wise on three ranks,
a column-wise one table-wise, a data-parallel one as row blocks.

Keys are the model's state-dict keys (``embedding_bags.{table}.weight``, with the module
path in front for a collection inside a model) and, for the optimizer:

- ``{weight key}.momentum1`` (Adagrad; Adam's first moment) and ``.momentum2`` (Adam's
  second moment): one fp32 value per element, sharded like the weight;
- ``{weight key}.momentum1.columns_{c0}_{c1}`` (row-wise Adagrad): one fp32 value per row,
  one key per column range of the saving plan, because the accumulator belongs to a shard's
  columns. A new shard's accumulator is the width-weighted mean of the stored ranges it
  overlaps (``runtime.sharding.state``: exact when column shards merge, inherited when one
  is split);
- the manifest keeps the optimizer's step count (Adam's bias correction).

A model's other parameters and buffers (its dense part) are saved once, as plain tensors,
under their own keys. The manifest is written last, by rank 0, after every rank's data: a
directory without one is an incomplete checkpoint and is refused.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Final, Literal, TypeAlias

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from pydantic import BaseModel, ConfigDict, ValidationError
from torch import nn
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
from torch.distributed._shard.sharded_tensor.metadata import (
    ShardedTensorMetadata,
    TensorProperties,
)

from planner_service.plan.types import DataType, OptimizerType, ShardingType
from runtime.comm import Group
from runtime.sharding.module import ShardedTables, sharded_collections
from runtime.sharding.state import (
    ELEMENTWISE_STATE,
    Region,
    RowwiseParts,
    ShardState,
    overlap,
    rowwise_key,
)
from runtime.sharding.weights import state_key

MANIFEST = "shardplan.json"
FORMAT: Final = "shardplan-checkpoint"
FORMAT_VERSION: Final = 1
_ROWWISE = re.compile(r"\.momentum1\.columns_(\d+)_(\d+)$")

# The state dict DCP saves and loads here (``dcp.save`` and ``dcp.load`` take any values):
# each table's shards and optimizer state as ShardedTensors, a model's dense part as tensors.
DcpState: TypeAlias = dict[str, ShardedTensor | torch.Tensor]


class CheckpointError(ValueError):
    """The checkpoint cannot be loaded into this module (names what does not match)."""


class TableEntry(BaseModel):
    """A table as the checkpoint holds it: its shape, data type and the saving plan's
    sharding type."""

    model_config = ConfigDict(frozen=True)

    name: str
    rows: int
    dim: int
    data_type: DataType
    sharding_type: ShardingType


class CheckpointManifest(BaseModel):
    """What ``shardplan.json`` records: the plan the checkpoint was saved under, the
    optimizer and its step, every table (by weight key) and the dense keys."""

    model_config = ConfigDict(frozen=True)

    format: Literal["shardplan-checkpoint"] = FORMAT
    version: Literal[1] = FORMAT_VERSION
    plan_id: str | None
    world_size: int
    optimizer: OptimizerType
    optimizer_step: int
    tables: dict[str, TableEntry] = {}
    dense: list[str] = []

    def to_text(self) -> str:
        """The manifest file's text: indented JSON, keys sorted."""
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

    @staticmethod
    def read(path: Path) -> CheckpointManifest:
        file = path / MANIFEST
        try:
            data = json.loads(file.read_text())
        except FileNotFoundError:
            raise CheckpointError(
                f"{path} is not a complete checkpoint: it has no {MANIFEST} (written last, "
                "after every rank's shards; the save did not finish)"
            ) from None
        except (OSError, ValueError) as error:
            raise CheckpointError(f"cannot read {file}: {error}") from error
        if data.get("format") != FORMAT or data.get("version") != FORMAT_VERSION:
            raise CheckpointError(
                f"{file} is format {data.get('format')!r} version {data.get('version')!r}; "
                f"this runtime reads {FORMAT!r} version {FORMAT_VERSION}"
            )
        try:
            return CheckpointManifest.model_validate(data)
        except ValidationError as error:
            raise CheckpointError(f"cannot read {file}: {error}") from error


def save_checkpoint(module: nn.Module, path: str | os.PathLike[str]) -> CheckpointManifest:
    """Write ``module``'s shards, fused optimizer state and dense state to directory
    ``path`` (every rank calls it; the path is shared by all ranks). ``module`` is a sharded
    collection or a model holding them (``shard_modules``)."""
    target = Path(path)
    parts = _sharded_parts(module)
    group = parts[0][1].group
    state: DcpState = {}
    tables: dict[str, TableEntry] = {}
    for prefix, sharded in parts:
        shards = sharded.shard_states()
        for table in sharded.tables:
            key = prefix + state_key(table)
            tables[key] = TableEntry(
                name=table.name,
                rows=table.num_embeddings,
                dim=table.embedding_dim,
                data_type=table.data_type,
                sharding_type=sharded.plan.tables[table.name].sharding_type,
            )
            mine = [s for s in shards if s.table.name == table.name]
            size = (table.num_embeddings, table.embedding_dim)
            state.update(_table_state(key, size, mine, _group_ranks(group)))
    dense = _dense_state(module, [prefix for prefix, _ in parts])
    state.update(dense)
    if group.rank == 0:  # saving over a checkpoint: it is incomplete until the new manifest
        (target / MANIFEST).unlink(missing_ok=True)
    with _sharded_tensors_accepted():
        dcp.save(state, checkpoint_id=target, process_group=group.pg)
    steps = group.all_gather_object(max(s.optimizer_step for _, s in parts))
    manifest = CheckpointManifest(
        plan_id=parts[0][1].plan_id,
        world_size=group.world_size,
        optimizer=parts[0][1].optimizer,
        optimizer_step=max(steps),
        tables=tables,
        dense=sorted(dense),
    )
    if group.rank == 0:
        staged = target / f"{MANIFEST}.tmp"
        staged.write_text(manifest.to_text())
        staged.replace(target / MANIFEST)
    group.all_gather_object(None)  # the manifest exists when any rank returns
    return manifest


def load_checkpoint(
    module: nn.Module, path: str | os.PathLike[str], *, optimizer_state: bool = True
) -> CheckpointManifest:
    """Load a checkpoint saved under any plan into ``module`` sharded by its own plan
    (every rank calls it). Every table of the module must be in the checkpoint with the
    same shape; with ``optimizer_state`` (the default) the checkpoint's optimizer must be
    the module's, and its state and step are loaded too."""
    source = Path(path)
    manifest = CheckpointManifest.read(source)
    parts = _sharded_parts(module)
    group = parts[0][1].group
    optimizer = parts[0][1].optimizer
    if optimizer_state and manifest.optimizer is not optimizer:
        raise CheckpointError(
            f"the checkpoint holds {manifest.optimizer.value} optimizer state and the module "
            f"trains with {optimizer.value}; load with optimizer_state=False to take the "
            "weights only"
        )
    stored = dcp.FileSystemReader(source).read_metadata().state_dict_metadata
    state: DcpState = {}
    rowwise: list[tuple[ShardState, list[tuple[Region, torch.Tensor]]]] = []
    for prefix, sharded in parts:
        shards = sharded.shard_states()
        for table in sharded.tables:
            key = prefix + state_key(table)
            size = (table.num_embeddings, table.embedding_dim)
            _check_entry(key, table.name, manifest, size)
            mine = [s for s in shards if s.table.name == table.name]
            ranks = _group_ranks(group)
            state.update(
                _table_state(key, size, mine, ranks, optimizer=optimizer_state, rowwise=False)
            )
            if optimizer_state and any(s.rowwise is not None for s in mine):
                rowwise += _rowwise_targets(key, mine, stored, state, ranks)
    dense = _dense_state(module, [prefix for prefix, _ in parts])
    unsaved = sorted(set(dense) - set(manifest.dense))
    if unsaved:
        raise CheckpointError(
            f"the module's dense state {unsaved} is not in the checkpoint, which holds "
            f"{manifest.dense}"
        )
    state.update(dense)
    missing = sorted(set(state) - set(stored))
    if missing:
        raise CheckpointError(f"the checkpoint at {source} has no {missing}")
    with _sharded_tensors_accepted():
        dcp.load(state, checkpoint_id=source, process_group=group.pg)
    for shard, pieces in rowwise:
        parts_of = RowwiseParts(shard)
        for region, values in pieces:
            parts_of.add(region, values)
        parts_of.write()
    if optimizer_state:
        for _, sharded in parts:
            sharded.optimizer_step = manifest.optimizer_step
    return manifest


# --------------------------------------------------------------------------- helpers


@contextmanager
def _sharded_tensors_accepted() -> Iterator[None]:
    """DCP warns on every ShardedTensor that DTensor is to replace it; DTensor's placements
    cannot express shards at arbitrary offsets (a column shard of 12 of 16 columns, row
    blocks of a table-row-wise table), which is what plans hold, so ShardedTensor stays."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*deprecating ShardedTensor", category=FutureWarning
        )
        yield


def _sharded_parts(module: nn.Module) -> list[tuple[str, ShardedTables]]:
    """The sharded collections in ``module`` with their key prefixes (``""`` for itself)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("checkpoints need an initialised process group (one rank is fine)")
    found = [(f"{path}." if path else "", child) for path, child in sharded_collections(module)]
    if not found:
        raise TypeError(
            f"{type(module).__name__} holds no sharded collection; shard it with "
            "shard_modules first"
        )
    return found


def _check_entry(key: str, name: str, manifest: CheckpointManifest, size: tuple[int, int]) -> None:
    entry = manifest.tables.get(key)
    if entry is None:
        raise CheckpointError(
            f"table {name!r} ({key}) is not in the checkpoint; it holds {sorted(manifest.tables)}"
        )
    if (entry.rows, entry.dim) != size:
        raise CheckpointError(
            f"table {name!r} is {size[0]} x {size[1]} in the module and {entry.rows} x "
            f"{entry.dim} in the checkpoint ({key})"
        )


def _group_ranks(group: Group) -> list[int]:
    """The global rank of each rank of ``group`` (ShardedTensor placements are global)."""
    if group.pg is None:
        return [dist.get_rank()]
    return [dist.get_global_rank(group.pg, r) for r in range(group.world_size)]


def _elementwise_names(shards: Sequence[ShardState]) -> tuple[str, ...]:
    count = max((len(s.elementwise) for s in shards), default=0)
    return ELEMENTWISE_STATE[OptimizerType.ADAM][:count]


def _table_state(
    key: str,
    size: tuple[int, int],
    shards: Sequence[ShardState],
    ranks: list[int],
    *,
    optimizer: bool = True,
    rowwise: bool = True,
) -> dict[str, ShardedTensor]:
    """This rank's part of one table: its shards' weights, (``optimizer``) their
    per-element state and (``rowwise``) their per-row state by column range."""
    state: dict[str, ShardedTensor] = {}

    def put(name: str, size: tuple[int, ...], pieces: list[tuple[Region, torch.Tensor]]) -> None:
        if pieces:
            state[name] = _sharded_tensor(size, pieces, ranks)

    put(key, size, [(s.region, s.weight) for s in shards])
    if not optimizer:
        return state
    for i, name in enumerate(_elementwise_names(shards)):
        put(f"{key}.{name}", size, [(s.region, s.elementwise[i]) for s in shards])
    for shard in shards:
        if rowwise and shard.rowwise is not None:
            r0, c0, rows, cols = shard.region
            piece = ((r0, 0, rows, 1), shard.rowwise)
            put(rowwise_key(key, (c0, c0 + cols)), (size[0],), [piece])
    return state


def _rowwise_targets(
    key: str,
    shards: Sequence[ShardState],
    stored: Collection[str],
    state: DcpState,
    ranks: list[int],
) -> list[tuple[ShardState, list[tuple[Region, torch.Tensor]]]]:
    """Buffers to read each stored column range's accumulators into (added to ``state``),
    for the rows of this rank's shards that overlap it, and which part of which shard each
    buffer feeds; ``stored`` are the checkpoint's keys."""
    ranges = []
    for name in stored:
        match = _ROWWISE.search(name)
        if match and name[: match.start()] == key:
            ranges.append((int(match[1]), int(match[2])))
    rows_total = shards[0].table.num_embeddings
    targets = []
    for c0, c1 in sorted(ranges):
        buffers: dict[tuple[int, int], torch.Tensor] = {}
        for shard in shards:
            part = overlap(shard.region, (0, c0, rows_total, c1 - c0))
            if part is None or shard.rowwise is None:
                continue
            r0, _, rows, _ = shard.region
            buffer = buffers.setdefault((r0, rows), torch.zeros(rows, dtype=torch.float32))
            targets.append((shard, [(part, buffer)]))
        if buffers:
            pieces = [((r0, 0, rows, 1), b) for (r0, rows), b in buffers.items()]
            state[rowwise_key(key, (c0, c1))] = _sharded_tensor((rows_total,), pieces, ranks)
    merged: dict[int, tuple[ShardState, list[tuple[Region, torch.Tensor]]]] = {}
    for shard, pieces in targets:
        merged.setdefault(id(shard), (shard, []))[1].extend(pieces)
    return list(merged.values())


def _sharded_tensor(
    size: tuple[int, ...], pieces: Sequence[tuple[Region, torch.Tensor]], ranks: list[int]
) -> ShardedTensor:
    """This rank's ``pieces`` (region, tensor; at least one) of a tensor of ``size`` as a
    ShardedTensor. DCP reads and writes only local shards, but a ShardedTensor's metadata
    must cover the whole tensor without overlaps: the rest is described as held by another
    rank (per-rank metadata; data-parallel replicas are each their own whole)."""
    me = dist.get_rank()
    other = ranks[(ranks.index(me) + 1) % len(ranks)] if me in ranks else me
    device = pieces[0][1].device
    boxes = [_box(region, len(size)) for region, _ in pieces]
    unique = list(dict.fromkeys(boxes))
    metadata = [ShardMetadata(list(o), list(s), f"rank:{me}/{device}") for o, s in unique]
    metadata += [
        ShardMetadata(list(o), list(s), f"rank:{other}/{device}")
        for o, s in _complement(size, unique)
    ]
    local = []
    seen = set()
    for box, (_, tensor) in zip(boxes, pieces, strict=True):
        if box in seen:  # one buffer serves several shards of one row range
            continue
        seen.add(box)
        local.append(Shard(tensor, metadata[unique.index(box)]))
    properties = TensorProperties(dtype=pieces[0][1].dtype)
    global_metadata = ShardedTensorMetadata(metadata, torch.Size(size), properties)
    return ShardedTensor._init_from_local_shards_and_global_metadata(local, global_metadata)


Box = tuple[tuple[int, ...], tuple[int, ...]]


def _box(region: Region, dims: int) -> Box:
    r0, c0, rows, cols = region
    if dims == 1:
        return ((r0,), (rows,))
    return ((r0, c0), (rows, cols))


def _complement(size: tuple[int, ...], boxes: Sequence[Box]) -> list[Box]:
    """Boxes covering what ``boxes`` do not, for boxes that each span every dimension but
    one, all the same one (row blocks, column blocks, or one whole)."""
    for axis in range(len(size)):
        spans_rest = all(
            o[d] == 0 and s[d] == size[d] for o, s in boxes for d in range(len(size)) if d != axis
        )
        if not spans_rest:
            continue
        gaps, at = [], 0
        for start, end in sorted((o[axis], o[axis] + s[axis]) for o, s in boxes):
            if start > at:
                gaps.append((at, start))
            at = max(at, end)
        if at < size[axis]:
            gaps.append((at, size[axis]))
        result = []
        for start, end in gaps:
            offsets = tuple(start if d == axis else 0 for d in range(len(size)))
            sizes = tuple(end - start if d == axis else size[d] for d in range(len(size)))
            result.append((offsets, sizes))
        return result
    raise ValueError(f"shards {list(boxes)} are neither row blocks nor column blocks")


def _dense_tensors(module: nn.Module, prefixes: Sequence[str]) -> list[tuple[str, torch.Tensor]]:
    """The model's parameters and buffers outside its sharded collections."""
    inside = tuple(prefixes)
    named = [*module.named_parameters(), *module.named_buffers()]
    return [(k, t.detach()) for k, t in named if not (inside and k.startswith(inside))]


def _dense_state(module: nn.Module, prefixes: Sequence[str]) -> dict[str, torch.Tensor]:
    if isinstance(module, ShardedTables):
        return {}
    return dict(_dense_tensors(module, prefixes))
