"""``ShardedEmbeddingBagCollection``: an ``EmbeddingBagCollection`` laid out by a plan.

Every rank holds the shards the plan puts on it, grouped into FBGEMM table-batched kernels
with the optimizer fused into backward. Building it runs the plan's pure functions (every
rank's layout, this rank's exchange plans); a forward pass on a rank's local batch runs
them:

1. **Input distribution** (``inputs``): ids to the ranks holding shards of their tables.
2. **Lookups**: each rank pools every id it received with its kernels, in SUM mode, for
   the batches of all senders at once.
3. **Output distribution** (``outputs``): pooled columns back to their samples' ranks, row
   blocks' partial sums reduced on the way, mean pooling last.
4. **Data-parallel** tables are replicas on every rank. Each replica pools the whole global
   batch; a rank uses its own replica's values, and gradients reach every replica, so each
   applies the same summed update with the same fused optimizer and the replicas stay equal
   (this is the all-reduce of gradients, done through the exchange that sharded tables use).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from planner_service.plan.types import ShardingPlan
from runtime.comm import Group
from runtime.kernels import (
    KERNEL_TYPES,
    Kernel,
    build_kernel,
    check_trainable,
    fused_optimizer,
)
from runtime.modules import EmbeddingBagCollection, check_tables
from runtime.plan import ModulePlan, check_plan
from runtime.sharding.exchange import input_exchange, output_exchange
from runtime.sharding.inputs import InputDistribution, Received
from runtime.sharding.layout import build_layouts, subgroup_families
from runtime.sharding.outputs import OutputDistribution
from runtime.sharding.weights import (
    ShardedWeight,
    ShardView,
    gather_full,
    initialise,
    load_full,
    sharded_state,
)
from runtime.sparse import KeyedJaggedTensor, KeyedTensor, concat, offsets_from_lengths


class ShardedEmbeddingBagCollection(nn.Module):
    """An ``EmbeddingBagCollection`` sharded by a plan over a process group (build it with
    ``shard_modules``). It holds this rank's ``layout``, the ``inputs`` and ``outputs``
    distributions built for this rank and one FBGEMM kernel per kernel group (``kernels``),
    and runs them."""

    def __init__(
        self,
        module: EmbeddingBagCollection,
        plan: ModulePlan,
        pg: dist.ProcessGroup | None,
        device: torch.device,
        fused_params: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        tables = module.embedding_bag_configs()
        check_tables(tables)
        self.group = Group(pg)
        check_plan(plan, tables, self.group.world_size)
        optimizer = fused_optimizer(fused_params)
        check_trainable(tables)
        self.plan_id = plan.plan_id
        self.device = device
        self.tables = tables
        rank = self.group.rank
        layouts = build_layouts(plan, tables, cuda=device.type == "cuda")
        self.layout = layouts[rank]
        self.inputs = InputDistribution(
            input_exchange(plan, tables, layouts, rank), tables, self.group, device
        )
        self.outputs = OutputDistribution(
            output_exchange(plan, tables, layouts, rank),
            tables,
            self.group,
            subgroup_families(plan),
            device,
        )
        self.kernels = nn.ModuleList(
            build_kernel(
                group.key,
                [(shard.rows, shard.cols) for shard in self.layout.shards_of(group)],
                group.feature_table_map(),
                optimizer,
                device,
            )
            for group in self.layout.groups
        )
        initialise(self._shard_views(), module)

    def output_exchanges(self) -> list[tuple[str, list[int]]]:
        """The collectives each step's output distribution runs on this rank, in order, with
        the ranks of the process group each runs on (for logs and tests)."""
        return self.outputs.exchange.collectives()

    # ---- forward

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        local = self.inputs.prepare(features)
        received = self.inputs(local)
        return self.outputs(self._lookup(received), received.batches, local.lengths)

    def _lookup(self, received: Received) -> torch.Tensor:
        """``[sum of batches, columns]``: each kernel pools its features' ids, kernel by
        kernel (``RankLayout.columns`` order)."""
        total = sum(received.batches)
        if not self.layout.groups:
            return torch.zeros(total, 0, device=self.device, requires_grad=True)
        outputs = []
        start_bag = start_value = 0
        for group, kernel in zip(self.layout.groups, self._kernels(), strict=True):
            end_bag = start_bag + len(group.features) * total
            lengths = received.lengths[start_bag:end_bag]
            end_value = start_value + int(lengths.sum())
            weights = received.weights
            outputs.append(
                kernel(
                    received.values[start_value:end_value],
                    offsets_from_lengths(lengths),
                    per_sample_weights=None if weights is None else weights[start_value:end_value],
                )
            )
            start_bag, start_value = end_bag, end_value
        return concat(outputs, dim=1)

    def _kernels(self) -> list[Kernel]:
        return [k for k in self.kernels if isinstance(k, KERNEL_TYPES)]

    # ---- state

    def _shard_views(self) -> list[ShardView]:
        """This rank's shards with their kernels' weights, kernel by kernel."""
        return [
            ShardView(self.tables[shard.table], (shard.row_offset, shard.col_offset), weight)
            for group, kernel in zip(self.layout.groups, self._kernels(), strict=True)
            for shard, weight in zip(
                self.layout.shards_of(group), kernel.split_embedding_weights(), strict=True
            )
        ]

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, ShardedWeight]:  # type: ignore[override]
        """Each table's local shards with their global offsets (``embedding_bags.{name}.weight``,
        TorchRec's key); a table with nothing on this rank has no local shards."""
        return sharded_state(self.tables, self._shard_views())

    def load_state_dict(  # type: ignore[override]
        self, state_dict: Mapping[str, torch.Tensor], strict: bool = True, assign: bool = False
    ) -> None:
        """Load full (unsharded) tables: each rank copies the slices its shards hold."""
        load_full(self.tables, self._shard_views(), state_dict, strict)

    def gather_state_dict(self) -> dict[str, torch.Tensor]:
        """The full tables on every rank (for export): shards gathered from all ranks."""
        return gather_full(self.tables, self._shard_views(), self.group)


def shard_modules(
    module: EmbeddingBagCollection,
    *,
    plan: ModulePlan | ShardingPlan | bytes | str | Mapping[str, object],
    pg: dist.ProcessGroup | None = None,
    device: torch.device | str | None = None,
    fused_params: Mapping[str, Any] | None = None,
) -> ShardedEmbeddingBagCollection:
    """Shard ``module`` by ``plan`` over ``pg`` (default: the default group if initialised,
    else a single rank). The plan is checked against the module and the group first."""
    if not isinstance(module, EmbeddingBagCollection):
        raise TypeError(
            f"shard_modules shards an EmbeddingBagCollection, not {type(module).__name__}"
        )
    if pg is None and dist.is_available() and dist.is_initialized():
        pg = dist.group.WORLD
    target = torch.device(device) if device is not None else torch.device("cpu")
    return ShardedEmbeddingBagCollection(module, ModulePlan.of(plan), pg, target, fused_params)


apply_sharding_plan = shard_modules
