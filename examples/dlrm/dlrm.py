"""A DLRM-style click model and the synthetic clicks it trains on.

The model (Naumov et al., "Deep Learning Recommendation Model for Personalization and
Recommendation Systems", 2019): a bottom MLP maps the 13 dense features to a vector of
the embedding width; each sparse feature looks up its table; the interaction takes the dot
product of every pair among the dense vector and the features' embeddings; a top MLP maps
the dense vector and those products to one logit per sample.

``DLRM.sparse`` is the embedding collection the plan shards (``shard_modules`` replaces it
in place); ``DLRM.dense`` is everything else, one module that a job wraps in
``DistributedDataParallel``. Sequence features give a row per id; the model takes their
mean per sample (zeros for a sample with none) before the interaction.

The data is a pure function of ``(seed, step, rank)``, so a job and an unsharded reference
draw the same batches. Ids follow a power law (``id = floor(rows * u**3)``: a few ids are
frequent, as in click logs) and labels come from a fixed teacher drawn from ``seed``: a
linear function of the dense features plus, for each feature, a score in [-1, 1] hashed
from its ids (averaged over a sample's ids), through a sigmoid, then a coin flip. The
model can learn both parts, so the loss falls.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import torch
from torch import nn

from planner_service.plan.types import Table
from runtime import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    JaggedTensor,
    KeyedJaggedTensor,
    KeyedTensor,
)
from runtime.modules import config_of

from tables import NUM_DENSE, TableSpec, tables

TableConfig: TypeAlias = EmbeddingBagConfig | EmbeddingConfig
SKEW = 3.0  # ids are floor(rows * u**SKEW), u uniform in [0, 1)
TEACHER_SCALE = 2.0  # the teacher's logit: dense and sparse parts each of about this spread
HASH_MULTIPLIER = 2654435761  # Knuth's multiplicative hash: scores spread over [-1, 1]


def runtime_tables(spec: TableSpec) -> list[TableConfig]:
    """The runtime's tables, made from the very dicts the planning request lists."""
    return [config_of(Table.model_validate(table)) for table in tables(spec)]


# ------------------------------------------------------------------------------ model


def mlp(sizes: Sequence[int], *, last_relu: bool) -> nn.Sequential:
    """Linear layers with ReLUs between them, initialised as DLRM's reference does (weights
    normal with std sqrt(2 / (in + out)), biases with std sqrt(1 / out)): torch's default
    shrinks the signal layer after layer, and training starts on a long plateau."""
    layers: list[nn.Module] = []
    for i, (width_in, width_out) in enumerate(zip(sizes, sizes[1:], strict=False)):
        linear = nn.Linear(width_in, width_out)
        with torch.no_grad():
            linear.weight.normal_(0.0, math.sqrt(2 / (width_in + width_out)))
            linear.bias.normal_(0.0, math.sqrt(1 / width_out))
        layers.append(linear)
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DenseArch(nn.Module):
    """Bottom MLP, dot interaction, top MLP: ``(dense [B, 13], embedded [B, F, D])`` to
    logits ``[B]``."""

    pair_rows: torch.Tensor  # the (i, j), i > j, of every pair among the F + 1 vectors
    pair_cols: torch.Tensor

    def __init__(
        self, num_features: int, dim: int, bottom: Sequence[int], top: Sequence[int]
    ) -> None:
        super().__init__()
        self.bottom = mlp([NUM_DENSE, *bottom, dim], last_relu=True)
        pairs = (num_features + 1) * num_features // 2
        self.top = mlp([dim + pairs, *top, 1], last_relu=False)
        rows, cols = torch.tril_indices(num_features + 1, num_features + 1, offset=-1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        vectors = torch.cat([x.unsqueeze(1), embedded], dim=1)  # [B, F + 1, D]
        dots = torch.bmm(vectors, vectors.transpose(1, 2))
        pairs = dots[:, self.pair_rows, self.pair_cols]  # each pair once, no self-products
        return self.top(torch.cat([x, pairs], dim=1)).squeeze(1)


class DLRM(nn.Module):
    """``sparse``: the tables (one collection, sharded by the plan); ``dense``: the rest."""

    def __init__(
        self,
        table_configs: Sequence[TableConfig],
        *,
        bottom: Sequence[int],
        top: Sequence[int],
        seed: int,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        dims = {t.embedding_dim for t in table_configs}
        if len(dims) != 1:
            raise ValueError(f"the dot interaction needs one embedding width; got {dims}")
        (dim,) = dims
        self.features = [f for t in table_configs for f in t.feature_names]
        self.sparse: nn.Module
        if all(isinstance(t, EmbeddingConfig) for t in table_configs):
            self.sparse = EmbeddingCollection(table_configs, device=device)  # type: ignore[arg-type]
        else:
            self.sparse = EmbeddingBagCollection(table_configs, device=device)  # type: ignore[arg-type]
        with torch.random.fork_rng(devices=[]):  # the same start wherever the tables live
            torch.manual_seed(seed)
            self.dense: nn.Module = DenseArch(len(self.features), dim, bottom, top)

    def forward(self, dense: torch.Tensor, features: KeyedJaggedTensor) -> torch.Tensor:
        return self.dense(dense, self.embedded(self.sparse(features), dense.shape[0]))

    def embedded(
        self, looked_up: KeyedTensor | dict[str, JaggedTensor], batch: int
    ) -> torch.Tensor:
        """``[B, F, D]``: pooled embeddings as they are, sequence rows averaged per sample."""
        if isinstance(looked_up, KeyedTensor):
            return looked_up.values().view(batch, len(self.features), -1)
        return torch.stack([sample_mean(looked_up[f], batch) for f in self.features], dim=1)


def sample_mean(jt: JaggedTensor, batch: int) -> torch.Tensor:
    """Each sample's rows averaged (zeros where a sample has none)."""
    rows, lengths = jt.values(), jt.lengths()
    samples = torch.repeat_interleave(torch.arange(batch), lengths)
    sums = torch.zeros(batch, rows.shape[1], dtype=rows.dtype).index_add(0, samples, rows)
    return sums / lengths.clamp(min=1).unsqueeze(1).to(rows.dtype)


def initial_weight(table: TableConfig, seed: int) -> torch.Tensor:
    """A table's starting weight, uniform in +-sqrt(1/rows) (TorchRec's default), drawn from
    ``(seed, table name)`` alone, so that any sharding of it and the unsharded reference
    start equal."""
    generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{table.name}".encode()))
    bound = math.sqrt(1.0 / table.num_embeddings)
    shape = (table.num_embeddings, table.embedding_dim)
    return torch.empty(shape).uniform_(-bound, bound, generator=generator)


def state_key(table: TableConfig) -> str:
    return f"{table.state_prefix}.{table.name}.weight"


# ------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Batch:
    """One batch: dense features, each sparse feature's ids and per-sample counts, labels."""

    dense: torch.Tensor  # [B, 13]
    ids: list[torch.Tensor]  # per feature, every sample's ids in sample order
    lengths: list[torch.Tensor]  # per feature, [B]
    labels: torch.Tensor  # [B], 0.0 or 1.0

    def features(self, names: Sequence[str]) -> KeyedJaggedTensor:
        return KeyedJaggedTensor(
            keys=list(names), values=torch.cat(self.ids), lengths=torch.cat(self.lengths)
        )

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """The batches one after another (a global batch from the ranks' batches)."""
        return Batch(
            torch.cat([b.dense for b in batches]),
            [torch.cat(parts) for parts in zip(*(b.ids for b in batches), strict=True)],
            [torch.cat(parts) for parts in zip(*(b.lengths for b in batches), strict=True)],
            torch.cat([b.labels for b in batches]),
        )


class ClickData:
    """Synthetic clicks for ``table_configs``; ``batch(step, rank)`` is deterministic."""

    def __init__(
        self, table_configs: Sequence[TableConfig], *, batch_size: int, max_ids: int, seed: int
    ) -> None:
        self.rows = [t.num_embeddings for t in table_configs for _ in t.feature_names]
        self.sequence = all(isinstance(t, EmbeddingConfig) for t in table_configs)
        self.batch_size = batch_size
        self.max_ids = max_ids
        self.seed = seed
        teacher = torch.Generator().manual_seed(seed)
        self.dense_weights = torch.randn(NUM_DENSE, generator=teacher) / math.sqrt(NUM_DENSE)

    def batch(self, step: int, rank: int) -> Batch:
        generator = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}:{step}:{rank}".encode()))
        size = self.batch_size
        dense = torch.randn(size, NUM_DENSE, generator=generator)
        lengths, ids = [], []
        for rows in self.rows:
            if self.sequence:
                count = torch.randint(0, self.max_ids + 1, (size,), generator=generator)
            else:
                count = torch.ones(size, dtype=torch.int64)
            u = torch.rand(int(count.sum()), generator=generator, dtype=torch.float64)
            ids.append((u**SKEW * rows).long().clamp(max=rows - 1))
            lengths.append(count)
        logits = self._teacher(dense, ids, lengths)
        labels = torch.bernoulli(torch.sigmoid(logits), generator=generator)
        return Batch(dense, ids, lengths, labels)

    def _teacher(
        self, dense: torch.Tensor, ids: list[torch.Tensor], lengths: list[torch.Tensor]
    ) -> torch.Tensor:
        sparse = torch.zeros(dense.shape[0])
        for feature, (values, counts) in enumerate(zip(ids, lengths, strict=True)):
            salt = zlib.crc32(f"{self.seed}:{feature}".encode())
            hashed = (values + salt) * HASH_MULTIPLIER % 2**32
            scores = hashed.double() / 2**32 * 2 - 1
            samples = torch.repeat_interleave(torch.arange(dense.shape[0]), counts)
            sums = torch.zeros(dense.shape[0], dtype=torch.float64).index_add(0, samples, scores)
            sparse += (sums / counts.clamp(min=1)).float()
        sparse *= math.sqrt(3 / len(ids))  # scores have variance 1/3: the sum has about 1
        return TEACHER_SCALE * (dense @ self.dense_weights + sparse)
