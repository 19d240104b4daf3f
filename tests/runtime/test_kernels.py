"""The kernels a rank looks its shards up with (``runtime.kernels``): on CPU a sequence
kernel is FBGEMM's pooled kernel over its tables stacked (``CpuSequenceEmbeddings``), and it
must return and train exactly what FBGEMM's unpooled kernel does."""

from __future__ import annotations

import pytest
import torch

from planner_service.plan.types import DataType, OptimizerType
from runtime.kernel_key import KernelKey, Memory
from runtime.kernels import (
    CpuSequenceEmbeddings,
    FusedOptimizer,
    Kernel,
    build_kernel,
    fbgemm_kernel,
    kernel_step,
    set_kernel_step,
)

CPU = torch.device("cpu")
SIZES = [(50, 8), (30, 8)]  # two tables of one width
FEATURE_TABLE_MAP = [0, 0, 1]  # the first table looked up by two features
BAGS = 4  # per feature
STEPS = 3


def _pair(optimizer: OptimizerType, data_type: DataType) -> tuple[CpuSequenceEmbeddings, Kernel]:
    """The CPU sequence kernel and FBGEMM's unpooled one, holding the same random rows."""
    key = KernelKey(Memory.HOST, data_type, 0.0)
    fused = FusedOptimizer(optimizer, {"learning_rate": 0.1})
    stacked = build_kernel(key, SIZES, FEATURE_TABLE_MAP, fused, CPU, sequence=True)
    assert isinstance(stacked, CpuSequenceEmbeddings)
    unpooled = fbgemm_kernel(key, SIZES, FEATURE_TABLE_MAP, fused, CPU, pooled=False)
    generator = torch.Generator().manual_seed(7)
    for mine, theirs in zip(
        stacked.split_embedding_weights(), unpooled.split_embedding_weights(), strict=True
    ):
        mine.copy_(torch.randn(mine.shape, generator=generator).to(mine.dtype))
        theirs.copy_(mine)
    return stacked, unpooled


def _batch(generator: torch.Generator, empty: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids and offsets of ``BAGS`` bags per feature (bags of 0 to 6 ids, repeats likely)."""
    high = 1 if empty else 7
    lengths = torch.randint(0, high, (len(FEATURE_TABLE_MAP) * BAGS,), generator=generator)
    rows = [SIZES[t][0] for t in FEATURE_TABLE_MAP]
    ids = torch.cat(
        [
            torch.randint(
                0, rows[f], (int(lengths[f * BAGS : (f + 1) * BAGS].sum()),), generator=generator
            )
            for f in range(len(FEATURE_TABLE_MAP))
        ]
    )
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    return ids, offsets


def _weights_equal(a: Kernel, b: Kernel) -> bool:
    return all(
        torch.equal(x, y)
        for x, y in zip(a.split_embedding_weights(), b.split_embedding_weights(), strict=True)
    )


def _states(kernel: Kernel) -> list[torch.Tensor]:
    return [state for table in kernel.split_optimizer_states() for state in table]


@pytest.mark.parametrize(
    ("optimizer", "data_type"),
    [
        (OptimizerType.SGD, DataType.FP32),
        (OptimizerType.SGD, DataType.FP16),
        (OptimizerType.ADAGRAD, DataType.FP32),
        (OptimizerType.ROWWISE_ADAGRAD, DataType.FP16),
    ],
)
def test_cpu_sequence_kernel_returns_and_trains_exactly_as_the_unpooled_kernel(
    optimizer: OptimizerType, data_type: DataType
) -> None:
    stacked, unpooled = _pair(optimizer, data_type)
    generator = torch.Generator().manual_seed(11)
    for step in range(STEPS):
        ids, offsets = _batch(generator)
        mine, theirs = stacked(ids, offsets), unpooled(ids, offsets)
        assert mine.shape == theirs.shape == (ids.numel(), SIZES[0][1])
        assert torch.equal(mine, theirs), step
        gradient = torch.randn(mine.shape, generator=generator)
        mine.backward(gradient)
        theirs.backward(gradient)
        assert _weights_equal(stacked, unpooled), step
        states = zip(_states(stacked), _states(unpooled), strict=True)
        assert all(torch.equal(x, y) for x, y in states), step
    assert kernel_step(stacked) == kernel_step(unpooled)


def test_cpu_sequence_kernel_rowwise_adagrad_fp32_within_one_rounding_of_the_unpooled():
    """fp32 row-wise Adagrad takes FBGEMM's vectorised update in the pooled kernel (the one
    pooled tables use), whose rounding may differ from the unpooled kernel's by an ulp."""
    stacked, unpooled = _pair(OptimizerType.ROWWISE_ADAGRAD, DataType.FP32)
    generator = torch.Generator().manual_seed(13)
    for _ in range(STEPS):
        ids, offsets = _batch(generator)
        mine, theirs = stacked(ids, offsets), unpooled(ids, offsets)
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-6)
        gradient = torch.randn(mine.shape, generator=generator)
        mine.backward(gradient)
        theirs.backward(gradient)
    for x, y in zip(
        stacked.split_embedding_weights(), unpooled.split_embedding_weights(), strict=True
    ):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


def test_cpu_sequence_kernel_takes_an_empty_batch_and_its_tables_are_views():
    stacked, _ = _pair(OptimizerType.SGD, DataType.FP32)
    ids, offsets = _batch(torch.Generator().manual_seed(3), empty=True)
    rows = stacked(ids, offsets)
    assert rows.shape == (0, SIZES[0][1]) and rows.requires_grad
    rows.backward(torch.zeros_like(rows))
    second = stacked.split_embedding_weights()[1]
    second[4].fill_(2.5)  # a view: the next lookup of the second table's row 4 reads it
    offsets = torch.tensor([0] * (2 * BAGS + 1) + [1] * BAGS)
    assert torch.equal(stacked(torch.tensor([4]), offsets), torch.full((1, 8), 2.5))
    set_kernel_step(stacked, 5)
    assert kernel_step(stacked) == 5
