"""``TrainPipelineSparseDist`` against the unpipelined training loop, run on every rank of a
gloo group (or on one rank without a group).

A model holds a pooled and a sequence collection under one plan mixing every sharding type
(table-row-wise at world size 4, two hosts of two ranks), and a dense layer under
``DistributedDataParallel``. Two copies start from the same weights; one trains batch by
batch (zero_grad, forward, backward, dense optimizer step), the other through the pipeline,
on the same batches (ranks have different batch sizes). Losses, outputs, the gathered tables
and the dense parameters must be identical, bit for bit: the pipeline runs the same
computations in the same order, only the input distribution moves to another thread and
process group.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from planner_service.plan.types import ParameterSharding, PoolingType
from runtime import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
    ModulePlan,
    PipelineBatchError,
    TrainPipelineSparseDist,
    column_wise,
    construct_module_plan,
    data_parallel,
    row_wise,
    shard_modules,
    table_row_wise,
    table_wise,
)
from tests.runtime.cases import SEED, fused_params, global_batch

DENSE = 4
BATCHES = 6


@dataclass
class Batch:
    """TorchRec's ``Batch`` fields: dense features, sparse features, labels."""

    dense_features: torch.Tensor
    sparse_features: KeyedJaggedTensor
    labels: torch.Tensor

    def to(self, device: torch.device) -> Batch:
        return Batch(
            self.dense_features.to(device),
            self.sparse_features.to(device),
            self.labels.to(device),
        )


def pooled_tables(world: int) -> list[EmbeddingBagConfig]:
    tables = [
        EmbeddingBagConfig("tw", 20, 8),
        EmbeddingBagConfig("tw_mean", 13, 4, pooling=PoolingType.MEAN),
        EmbeddingBagConfig("rw", 37, 8),
        EmbeddingBagConfig("rw_w", 15, 8, is_weighted=True),
        EmbeddingBagConfig("cw", 16, 16),
        EmbeddingBagConfig("dp", 9, 4),
    ]
    if world == 4:
        tables.append(EmbeddingBagConfig("twrw", 29, 8))
    return tables


def sequence_tables(world: int) -> list[EmbeddingConfig]:
    tables = [
        EmbeddingConfig("s_tw", 21, 8),
        EmbeddingConfig("s_rw", 33, 8),
        EmbeddingConfig("s_cw", 11, 16),
        EmbeddingConfig("s_dp", 7, 8),
    ]
    if world == 4:
        tables.append(EmbeddingConfig("s_twrw", 19, 8))
    return tables


def plan(world: int) -> ModulePlan:
    local = 2 if world == 4 else world
    last = world - 1
    builders: dict[str, Callable[..., ParameterSharding]] = {
        "tw": table_wise(last),
        "tw_mean": table_wise(0),
        "rw": row_wise(),
        "rw_w": row_wise(),
        "cw": column_wise([last, 0]),
        "dp": data_parallel(),
        "twrw": table_row_wise(world // local - 1),
        "s_tw": table_wise(0),
        "s_rw": row_wise(),
        "s_cw": column_wise([0, last]),
        "s_dp": data_parallel(),
        "s_twrw": table_row_wise(0),
    }
    tables = [*pooled_tables(world), *sequence_tables(world)]
    per_table = {t.name: builders[t.name] for t in tables}
    return construct_module_plan(tables, per_table, world_size=world, local_world_size=local)


class Model(nn.Module):
    """Pooled embeddings, each sequence feature's rows summed per sample, and the dense
    features, into one linear layer; squared error against the labels."""

    def __init__(self, world: int, copy_features: bool = False) -> None:
        super().__init__()
        self.pooled = EmbeddingBagCollection(pooled_tables(world), seed=SEED)
        self.sequence = EmbeddingCollection(sequence_tables(world), seed=SEED + 1)
        width = sum(t.embedding_dim for t in pooled_tables(world))
        width += sum(t.embedding_dim for t in sequence_tables(world))
        torch.manual_seed(SEED)
        self.over: nn.Module = nn.Linear(width + DENSE, 1)
        self.copy_features = copy_features

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        features = batch.sparse_features
        if self.copy_features:  # another object with the same contents: not pipelined
            features = KeyedJaggedTensor(
                features.keys(), features.values(), features.lengths(), features.weights()
            )
        parts = [self.pooled(features).values()]
        for jagged in self.sequence(features).values():
            samples = jagged.lengths().numel()
            sample_of = torch.repeat_interleave(torch.arange(samples), jagged.lengths())
            sums = torch.zeros(samples, jagged.values().shape[1])
            parts.append(sums.index_add(0, sample_of, jagged.values()))
        logits = self.over(torch.cat([*parts, batch.dense_features], dim=1)).squeeze(1)
        loss = ((logits - batch.labels) ** 2).sum()
        return loss, logits


def sharded_model(world: int, copy_features: bool = False) -> tuple[Model, torch.optim.Optimizer]:
    model = Model(world, copy_features)
    shard_modules(model, plan=plan(world), fused_params=fused_params("rowwise_adagrad"))
    if dist.is_initialized():
        model.over = DistributedDataParallel(model.over)
    return model, torch.optim.SGD(model.over.parameters(), lr=0.05)


def batches(rank: int, world: int, count: int = BATCHES) -> list[Batch]:
    """This rank's batches: rank r has 3 + r samples."""
    sizes = [3 + r for r in range(world)]
    tables = [
        EmbeddingBagConfig(t.name, t.num_embeddings, t.embedding_dim)
        for t in [*pooled_tables(world), *sequence_tables(world)]
    ]
    result = []
    for step in range(count):
        _, parts = global_batch(tables, sizes, world, step)
        generator = torch.Generator().manual_seed(SEED + 100 * step + rank)
        dense = torch.randn(sizes[rank], DENSE, generator=generator)
        labels = torch.randn(sizes[rank], generator=generator)
        result.append(Batch(dense, parts[rank], labels))
    return result


def unpipelined(
    model: Model, optimizer: torch.optim.Optimizer, data: list[Batch]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    results = []
    for batch in data:
        optimizer.zero_grad()
        loss, logits = model(batch)
        loss.sum().backward()
        optimizer.step()
        results.append((loss.detach(), logits.detach()))
    return results


class Recording(nn.Module):
    """The model with each batch's loss kept, so the pipelined losses can be compared."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        self.inner = model
        self.losses: list[torch.Tensor] = []

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        loss, logits = self.inner(batch)
        self.losses.append(loss.detach())
        return loss, logits


def pipelined(
    model: Model, optimizer: torch.optim.Optimizer, it: Iterator[Batch]
) -> tuple[TrainPipelineSparseDist, list[tuple[torch.Tensor, torch.Tensor]]]:
    recording = Recording(model)
    pipeline: TrainPipelineSparseDist = TrainPipelineSparseDist(recording, optimizer, "cpu")
    logits = []
    while True:
        try:
            logits.append(pipeline.progress(it).detach())
        except StopIteration:
            break
    return pipeline, list(zip(recording.losses, logits, strict=True))


def assert_same_training(
    rank: int,
    got: list[tuple[torch.Tensor, torch.Tensor]],
    want: list[tuple[torch.Tensor, torch.Tensor]],
    model: Model,
    reference: Model,
) -> None:
    assert len(got) == len(want), (rank, len(got), len(want))
    for step, ((loss, logits), (want_loss, want_logits)) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(logits, want_logits), f"rank {rank} batch {step}: outputs differ"
        assert torch.equal(loss, want_loss), f"rank {rank} batch {step}: {loss} != {want_loss}"
    for name in ("pooled", "sequence"):
        tables = getattr(model, name).gather_state_dict()
        expected = getattr(reference, name).gather_state_dict()
        assert list(tables) == list(expected)
        for key, value in tables.items():
            assert torch.equal(value, expected[key]), f"rank {rank}: table {key} differs"
    for (key, value), (_, expected) in zip(
        model.over.state_dict().items(), reference.over.state_dict().items(), strict=True
    ):
        assert torch.equal(value, expected), f"rank {rank}: dense {key} differs"


# --------------------------------------------------------------------------- scenarios


def same_training(rank: int, world: int) -> None:
    """The pipeline trains every batch, drains, and matches the unpipelined loop exactly;
    every sharded module used the input distributed in the background (no fallback)."""
    data = batches(rank, world)
    reference, reference_opt = sharded_model(world)
    want = unpipelined(reference, reference_opt, data)
    model, optimizer = sharded_model(world)
    it = iter(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback warning would fail the test
        pipeline, got = pipelined(model, optimizer, it)
    assert pipeline.fallbacks == {}, pipeline.fallbacks
    assert_same_training(rank, got, want, model, reference)
    try:  # drained: it stays so
        pipeline.progress(it)
    except StopIteration:
        pass
    else:
        raise AssertionError("progress after the drain trained something")


def fallback(rank: int, world: int) -> None:
    """A model that passes its sharded modules a copy of the features: each module runs its
    own input distribution (a warning says so, once per module), results unchanged."""
    data = batches(rank, world, 3)
    reference, reference_opt = sharded_model(world, copy_features=True)
    want = unpipelined(reference, reference_opt, data)
    model, optimizer = sharded_model(world, copy_features=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pipeline, got = pipelined(model, optimizer, iter(data))
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(said) == 2 and "'inner.pooled'" in said[0] and "'inner.sequence'" in said[1], said
    assert pipeline.fallbacks == {"inner.pooled": 3, "inner.sequence": 3}, pipeline.fallbacks
    assert_same_training(rank, got, want, model, reference)


def bad_batch(rank: int, world: int) -> None:
    """Batch 2 has an id outside its table on rank 1 only: every rank's progress for that
    batch raises PipelineBatchError naming rank 1 and the id; the batch is skipped and the
    pipeline goes on, matching the unpipelined loop without it."""
    data = batches(rank, world)
    if rank == 1:
        broken = data[2].sparse_features
        values = broken.values().clone()
        values[0] = 10_000
        data[2] = Batch(
            data[2].dense_features,
            KeyedJaggedTensor(broken.keys(), values, broken.lengths(), broken.weights()),
            data[2].labels,
        )
    reference, reference_opt = sharded_model(world)
    want = unpipelined(reference, reference_opt, data[:2] + data[3:])
    model, optimizer = sharded_model(world)
    recording = Recording(model)
    pipeline: TrainPipelineSparseDist = TrainPipelineSparseDist(recording, optimizer, "cpu")
    it = iter(data)
    logits = [pipeline.progress(it).detach() for _ in range(2)]
    try:
        pipeline.progress(it)
    except PipelineBatchError as error:
        assert error.batch == 2 and list(error.failures) == [1], (error.batch, error.failures)
        assert "rank 1: ValueError: feature" in str(error) and "id 10000" in str(error), error
    else:
        raise AssertionError(f"rank {rank}: batch 2 with a bad id on rank 1 was trained")
    logits += [pipeline.progress(it).detach() for _ in range(3)]
    try:
        pipeline.progress(it)
    except StopIteration:
        pass
    else:
        raise AssertionError("the pipeline trained more batches than it was given")
    got = list(zip(recording.losses, logits, strict=True))
    assert_same_training(rank, got, want, model, reference)
