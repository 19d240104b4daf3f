"""Hypothesis strategies for table layouts the validator accepts, of every sharding type,
as explicit shard lists: what runs (plan schema 2.0) must write and give back."""

from __future__ import annotations

from hypothesis import strategies as st

from planner_service.plan.shards import COLUMN_ALIGNMENT, column_wise_shards, row_wise_shards
from planner_service.plan.types import (
    DEFAULT_CACHE_LOAD_FACTOR,
    ComputeKernel,
    ParameterSharding,
    Shard,
    ShardingType,
)

WORLD = 64
_ranks = st.integers(0, WORLD - 1)
_FUSED = [ComputeKernel.FUSED, ComputeKernel.FUSED_UVM, ComputeKernel.FUSED_UVM_CACHING]


def _sharding(kind: ShardingType, kernel: ComputeKernel, shards: list[Shard]) -> ParameterSharding:
    caching = kernel is ComputeKernel.FUSED_UVM_CACHING
    return ParameterSharding(
        sharding_type=kind,
        compute_kernel=kernel,
        ranks=[shard.rank for shard in shards],
        shards=shards,
        cache_load_factor=DEFAULT_CACHE_LOAD_FACTOR if caching else None,
    )


@st.composite
def layouts(draw: st.DrawFn) -> ParameterSharding:
    """A valid layout of a random table: any sharding type, ranks below ``WORLD``."""
    rows = draw(st.integers(1, 10_000))
    units = draw(st.integers(1, 64))
    cols = units * COLUMN_ALIGNMENT
    kind = draw(st.sampled_from(ShardingType))
    kernel = (
        ComputeKernel.DENSE if kind is ShardingType.DATA_PARALLEL else draw(st.sampled_from(_FUSED))
    )
    if kind is ShardingType.TABLE_WISE:
        shards = [Shard(offsets=(0, 0), sizes=(rows, cols), rank=draw(_ranks))]
    elif kind is ShardingType.DATA_PARALLEL:
        ranks = draw(st.permutations(range(draw(st.integers(1, WORLD)))))
        shards = [Shard(offsets=(0, 0), sizes=(rows, cols), rank=rank) for rank in ranks]
    elif kind in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE):
        first, count = draw(st.integers(0, WORLD - 1)), draw(st.integers(1, WORLD))
        shards = row_wise_shards(rows, cols, [(first + i) % WORLD for i in range(count)])
    else:
        cuts = sorted(draw(st.sets(st.integers(1, units - 1), max_size=8))) if units > 1 else []
        bounds = [0, *cuts, units]
        widths = [(b - a) * COLUMN_ALIGNMENT for a, b in zip(bounds, bounds[1:], strict=False)]
        ranks = draw(st.lists(_ranks, min_size=len(widths), max_size=len(widths)))
        shards = column_wise_shards(rows, widths, ranks)
    return _sharding(kind, kernel, shards)
