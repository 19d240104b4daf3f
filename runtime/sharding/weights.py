"""A rank's shards as weights: their initial values, and the state dict (this rank's shards
with their offsets; full tables loaded in). Full tables come out through ``gather``."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from runtime.modules import BaseEmbeddingConfig, EmbeddingBagCollection, EmbeddingCollection


@dataclass
class ShardedWeight:
    """A table's weight as this rank holds it: the global size and the local shards, each
    with its (row, column) offset in the full table."""

    size: tuple[int, int]
    local_shards: list[tuple[tuple[int, int], torch.Tensor]]


class ShardView(NamedTuple):
    """One local shard's weight: a view into its kernel's storage."""

    table: BaseEmbeddingConfig
    offsets: tuple[int, int]  # (row, column) in the full table
    weight: torch.Tensor

    def slice_of(self, full: torch.Tensor) -> torch.Tensor:
        """The block of the full table this shard holds."""
        (r0, c0), (rows, cols) = self.offsets, self.weight.shape
        return full[r0 : r0 + rows, c0 : c0 + cols]


def state_key(table: BaseEmbeddingConfig) -> str:
    """TorchRec's key of a table's weight: ``embedding_bags.{name}.weight`` for a pooled
    table, ``embeddings.{name}.weight`` for a sequence table."""
    return f"{table.state_prefix}.{table.name}.weight"


def initialise(
    views: Sequence[ShardView], module: EmbeddingBagCollection | EmbeddingCollection
) -> None:
    """Shards start as the matching slices of the module's weights. A module on the meta
    device has none, so each shard is drawn uniform in +-sqrt(1/rows) from a generator seeded
    by the table name and the shard's offsets (replicas of a data-parallel table are
    therefore equal)."""
    with torch.no_grad():
        for view in views:
            weight = module.table_weight(view.table.name)
            meta = weight.device.type == "meta"
            block = _seeded_block(view) if meta else view.slice_of(weight)
            view.weight.copy_(block.to(view.weight.dtype))


def _seeded_block(view: ShardView) -> torch.Tensor:
    r0, c0 = view.offsets
    generator = torch.Generator().manual_seed(zlib.crc32(f"{view.table.name}:{r0}:{c0}".encode()))
    bound = (1.0 / view.table.num_embeddings) ** 0.5
    return torch.empty(view.weight.shape).uniform_(-bound, bound, generator=generator)


def sharded_state(
    tables: Sequence[BaseEmbeddingConfig], views: Sequence[ShardView]
) -> dict[str, ShardedWeight]:
    """Each table's local shards with their global offsets; a table with nothing on this
    rank has no local shards."""
    state = {
        state_key(table): ShardedWeight((table.num_embeddings, table.embedding_dim), [])
        for table in tables
    }
    for view in views:
        state[state_key(view.table)].local_shards.append((view.offsets, view.weight))
    return state


def load_full(
    tables: Sequence[BaseEmbeddingConfig],
    views: Sequence[ShardView],
    state_dict: Mapping[str, torch.Tensor],
    strict: bool,
) -> None:
    """Copy into each shard its slice of the full (unsharded) table; with ``strict``, the
    keys must be exactly the tables'. Shapes are checked before anything is copied."""
    expected = {state_key(t): t for t in tables}
    if strict:
        missing = sorted(set(expected) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(expected))
        if missing or unexpected:
            raise KeyError(f"state_dict is missing {missing} and has unexpected {unexpected}")
    for key, table in expected.items():
        if key in state_dict:
            shape = tuple(state_dict[key].shape)
            if shape != (table.num_embeddings, table.embedding_dim):
                raise ValueError(
                    f"{key} has shape {shape}; table {table.name!r} is "
                    f"{table.num_embeddings} x {table.embedding_dim}"
                )
    with torch.no_grad():
        for view in views:
            key = state_key(view.table)
            if key in state_dict:
                block = view.slice_of(state_dict[key])
                view.weight.copy_(block.to(view.weight.device, view.weight.dtype))
