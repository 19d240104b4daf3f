"""Synthetic batches drawn to a request's shapes, one local batch per rank.

Per feature: the request's ``batch_size`` samples (or the table's ``batch_sizes`` entry for
that feature), ``round(pooling_factor × samples)`` ids spread over them as evenly as whole
numbers allow (each bag ``floor`` or ``ceil`` of the pooling factor, the longer bags at
random places), ids uniform over the table's rows, and for weighted tables per-id weights
uniform in [0, 1). The id count is then exactly what the cost model prices, step after
step, so a step's time does not wander with a Poisson draw. A ``KeyedJaggedTensor`` has one
batch size, so a feature with fewer samples than the largest of its collection has empty
bags after its own (the ids and lookups are its own; the output rows are the collection's).

Every rank draws its own batches from a generator seeded by the seed and its rank, so a run
is reproducible and ranks see different ids.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from planner_service.plan.types import PlanRequest, Table
from runtime.sparse import KeyedJaggedTensor

RANK_SEED_STRIDE = 1 << 20  # above the largest world size, so (seed, rank) pairs never collide


def rank_generator(seed: int, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * RANK_SEED_STRIDE + rank)


def feature_samples(request: PlanRequest, table: Table) -> list[int]:
    """Samples per rank of each of the table's features."""
    if table.batch_sizes is not None:
        return list(table.batch_sizes)
    return [request.batch_size] * table.num_features


def bag_lengths(
    pooling_factor: float, samples: int, stride: int, generator: torch.Generator
) -> torch.Tensor:
    """``stride`` bag lengths: ``round(pooling_factor × samples)`` ids over the first
    ``samples`` bags, each ``floor`` or ``ceil`` of their mean, the rest empty."""
    ids = round(pooling_factor * samples)
    base, longer = divmod(ids, samples)
    lengths = torch.full((stride,), 0, dtype=torch.int64)
    lengths[:samples] = base
    lengths[torch.randperm(samples, generator=generator)[:longer]] += 1
    return lengths


def collection_batch(
    request: PlanRequest, tables: Sequence[Table], generator: torch.Generator
) -> KeyedJaggedTensor:
    """One local batch of every feature of ``tables`` (one collection), in table order."""
    samples = [(t, f, n) for t in tables for f, n in enumerate(feature_samples(request, t))]
    stride = max(n for _, _, n in samples)
    keys, lengths, values, weights = [], [], [], []
    for table, feature, count in samples:
        assert table.pooling_factors is not None  # filled in by the request's validation
        bags = bag_lengths(table.pooling_factors[feature], count, stride, generator)
        ids = int(bags.sum())
        keys.append(table.feature_names[feature])
        lengths.append(bags)
        values.append(torch.randint(0, table.num_embeddings, (ids,), generator=generator))
        drawn = torch.rand(ids, generator=generator) if table.is_weighted else torch.ones(ids)
        weights.append(drawn)
    weighted = any(table.is_weighted for table in tables)
    return KeyedJaggedTensor(
        keys,
        torch.cat(values),
        torch.cat(lengths),
        torch.cat(weights) if weighted else None,
        stride=stride,
    )


def draw_batches(
    request: PlanRequest,
    collections: Sequence[Sequence[Table]],
    count: int,
    generator: torch.Generator,
    device: torch.device,
) -> list[list[KeyedJaggedTensor]]:
    """``count`` steps' batches, each a batch per collection, on ``device``."""
    return [
        [_to(collection_batch(request, tables, generator), device) for tables in collections]
        for _ in range(count)
    ]


def _to(batch: KeyedJaggedTensor, device: torch.device) -> KeyedJaggedTensor:
    if device.type == "cpu":
        return batch
    weights = batch.weights_or_none()
    return KeyedJaggedTensor(
        batch.keys(),
        batch.values().to(device),
        batch.lengths().to(device),
        None if weights is None else weights.to(device),
        stride=batch.stride(),
    )
