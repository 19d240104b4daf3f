"""A rank's training state shard by shard: each local shard's weight and the fused
optimizer's state for it, as views into the kernels' storage, and the rule that carries a
row-wise optimizer state across a change of column split.

This is what checkpoints (``runtime.checkpoint``) and resharding (``runtime.reshard``) read
and write. FBGEMM keeps, per table of a kernel (``split_optimizer_states``): nothing for
SGD; one fp32 value per row for row-wise Adagrad (the mean over the shard's columns of the
squared gradient, summed over steps); one fp32 value per element for Adagrad; two per
element for Adam (first and second moments), plus a step count per kernel (Adam's bias
correction).

**Row-wise state across column splits.** A row-wise accumulator belongs to a shard's
columns, so a table split into column shards keeps one per row per column shard. When a
new shard's columns ``[c0, c1)`` are made of parts of old shards, its accumulator is the
width-weighted mean of the parts' accumulators: ``sum_k (width_k / (c1 - c0)) * acc_k``.
Because each step adds the mean of the squared gradient over the shard's columns, this is
exactly the accumulator a shard of those columns would have reached on the same gradients
(merging column shards is exact). A shard cut out of one old shard inherits that shard's
accumulator, which is the best value the state holds: what a narrower shard would have
accumulated is not recorded anywhere (splitting is an approximation).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from planner_service.plan.types import OptimizerType
from runtime.modules import BaseEmbeddingConfig

# A region of a table: (row offset, column offset, rows, columns).
Region = tuple[int, int, int, int]

# The per-element state FBGEMM keeps for each optimizer, by the name it has in checkpoints
# and full states: Adagrad's accumulator, Adam's first then second moment.
ELEMENTWISE_STATE: dict[OptimizerType, tuple[str, ...]] = {
    OptimizerType.SGD: (),
    OptimizerType.ROWWISE_ADAGRAD: (),
    OptimizerType.ADAGRAD: ("momentum1",),
    OptimizerType.ADAM: ("momentum1", "momentum2"),
}


def rowwise_key(weight_key: str, columns: tuple[int, int]) -> str:
    """The key of row-wise Adagrad's accumulator for a table's ``columns`` ``[c0, c1)``
    (one per column range of the plan, since the accumulator belongs to a shard's columns):
    ``{weight key}.momentum1.columns_{c0}_{c1}``."""
    return f"{weight_key}.momentum1.columns_{columns[0]}_{columns[1]}"


class ShardState(NamedTuple):
    """One local shard: its weight and its optimizer state, views into the kernel."""

    table: BaseEmbeddingConfig
    offsets: tuple[int, int]  # (row, column) in the full table
    weight: torch.Tensor  # [rows, cols], the table's data type
    elementwise: tuple[torch.Tensor, ...]  # [rows, cols] fp32 each: adagrad 1, adam 2
    rowwise: torch.Tensor | None  # [rows] fp32: rowwise_adagrad

    def tensors(self) -> list[torch.Tensor]:
        """The weight, the per-element state, then the per-row state: the order in which
        they travel (resharding, full states)."""
        rowwise = [] if self.rowwise is None else [self.rowwise]
        return [self.weight, *self.elementwise, *rowwise]

    @property
    def region(self) -> Region:
        rows, cols = self.weight.shape
        return (self.offsets[0], self.offsets[1], int(rows), int(cols))


def kernel_states(kernel: torch.nn.Module, tables: int) -> list[list[torch.Tensor]]:
    """The optimizer state tensors of each of a kernel's ``tables`` (views, detached):
    FBGEMM's ``split_optimizer_states`` (an empty list for SGD)."""
    states = kernel.split_optimizer_states()  # type: ignore[operator]
    if not states:
        return [[] for _ in range(tables)]
    return [[tensor.detach() for tensor in table] for table in states]


def shard_state(
    table: BaseEmbeddingConfig,
    offsets: tuple[int, int],
    weight: torch.Tensor,
    states: Sequence[torch.Tensor],
    optimizer: OptimizerType,
) -> ShardState:
    """A shard's views, its optimizer's ``states`` read as that optimizer keeps them."""
    rows, cols = weight.shape
    if optimizer is OptimizerType.ROWWISE_ADAGRAD:
        return ShardState(table, offsets, weight.detach(), (), states[0].view(rows))
    elementwise = tuple(state.view(rows, cols) for state in states)
    return ShardState(table, offsets, weight.detach(), elementwise, None)


def overlap(a: Region, b: Region) -> Region | None:
    """The region two regions of one table have in common, or None."""
    r0, c0 = max(a[0], b[0]), max(a[1], b[1])
    r1, c1 = min(a[0] + a[2], b[0] + b[2]), min(a[1] + a[3], b[1] + b[3])
    if r1 <= r0 or c1 <= c0:
        return None
    return (r0, c0, r1 - r0, c1 - c0)


def block(tensor: torch.Tensor, of: Region, region: Region) -> torch.Tensor:
    """The part of ``tensor`` (laid out as region ``of``) that is ``region``: rows and
    columns of a 2-d tensor, rows of a 1-d (row-wise) one."""
    rows = slice(region[0] - of[0], region[0] - of[0] + region[2])
    if tensor.dim() == 1:
        return tensor[rows]
    return tensor[rows, region[1] - of[1] : region[1] - of[1] + region[3]]


class RowwiseParts:
    """Collects, for one shard, the row-wise accumulators of the parts it is made of and
    writes their width-weighted mean (module docstring) once every part is in."""

    def __init__(self, target: ShardState) -> None:
        assert target.rowwise is not None
        self.target = target
        self.total = torch.zeros_like(target.rowwise, dtype=torch.float64)

    def add(self, region: Region, values: torch.Tensor) -> None:
        """``values``: the accumulator (one per row) of a part covering ``region``."""
        own = self.target.region
        rows = slice(region[0] - own[0], region[0] - own[0] + region[2])
        self.total[rows] += values.to(torch.float64) * (region[3] / own[3])

    def write(self) -> None:
        assert self.target.rowwise is not None
        self.target.rowwise.copy_(self.total.to(self.target.rowwise.dtype))
