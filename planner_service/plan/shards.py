"""How tables are cut into shards: the splits shared by the enumerator, the validator and
the runtime, so that all three agree on where every row and column lives."""

from __future__ import annotations

from collections.abc import Sequence

from planner_service.plan.types import Shard

# FBGEMM's kernels need row widths in multiples of 4 elements, so split column shards must be.
COLUMN_ALIGNMENT = 4


def row_block_size(num_rows: int, num_blocks: int) -> int:
    """Rows per block when ``num_rows`` are split over ``num_blocks`` ranks (ceil division)."""
    return -(-num_rows // num_blocks)


def row_block_sizes(num_rows: int, num_blocks: int) -> list[int]:
    """TorchRec's row-wise split: ranks get full blocks in order, then the remainder, then 0.

    ``row_block_sizes(10, 4) == [3, 3, 3, 1]`` and ``row_block_sizes(5, 4) == [2, 2, 1, 0]``.
    This is the layout ``block_bucketize_sparse_features`` routes ids by.
    """
    block = row_block_size(num_rows, num_blocks)
    return [min(block, max(0, num_rows - i * block)) for i in range(num_blocks)]


def row_wise_shards(num_rows: int, dim: int, ranks: Sequence[int]) -> list[Shard]:
    """One full-width row block per rank, in rank order."""
    block = row_block_size(num_rows, len(ranks))
    sizes = row_block_sizes(num_rows, len(ranks))
    return [
        Shard(offsets=(min(i * block, num_rows), 0), sizes=(rows, dim), rank=rank)
        for i, (rows, rank) in enumerate(zip(sizes, ranks, strict=True))
    ]


def column_wise_shards(num_rows: int, widths: Sequence[int], ranks: Sequence[int]) -> list[Shard]:
    """Full-height column blocks of the given widths, left to right, on the given ranks."""
    shards, col = [], 0
    for width, rank in zip(widths, ranks, strict=True):
        shards.append(Shard(offsets=(0, col), sizes=(num_rows, width), rank=rank))
        col += width
    return shards
