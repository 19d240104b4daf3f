"""``ShardedEmbeddingBagCollection`` and ``ShardedEmbeddingCollection``: the collections
laid out by a plan, and ``shard_modules``, which shards them alone or inside a model.

Every rank holds the shards the plan puts on it, grouped into FBGEMM table-batched kernels
with the optimizer fused into backward. Building it runs the plan's pure functions (every
rank's layout, this rank's exchange plans); a forward pass on a rank's local batch runs
them:

1. **Input distribution** (``inputs``): ids to the ranks holding shards of their tables.
2. **Lookups**: each rank pools every id it received with its kernels, in SUM mode, for
   the batches of all senders at once (a sequence module looks up a row per id instead).
3. **Output distribution** (``outputs``): pooled columns back to their samples' ranks, row
   blocks' partial sums reduced on the way, mean pooling last; a sequence module's rows
   back to their ids' ranks, each placed where its id stands (``sequence``).
4. **Data-parallel** tables are replicas on every rank. Each replica pools the whole global
   batch; a rank uses its own replica's values, and gradients reach every replica, so each
   applies the same summed update with the same fused optimizer and the replicas stay equal
   (this is the all-reduce of gradients, done through the exchange that sharded tables use).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, overload

import torch
import torch.distributed as dist
from torch import nn

from planner_service.plan.types import ShardingPlan
from runtime.comm import Group
from runtime.kernels import (
    KERNEL_TYPES,
    FusedParams,
    Kernel,
    build_kernel,
    check_trainable,
    fused_optimizer,
    kernel_step,
    set_kernel_step,
)
from runtime.modules import (
    BaseEmbeddingConfig,
    EmbeddingBagCollection,
    EmbeddingCollection,
    check_tables,
    is_weighted,
)
from runtime.plan import ModulePlan, PlanMismatchError, check_plan
from runtime.sharding.exchange import input_exchange, output_exchange, sequence_exchange
from runtime.sharding.gather import gather_full_state
from runtime.sharding.inputs import InputDistribution, LocalBatch, Received, Sent
from runtime.sharding.layout import build_layouts, subgroup_families
from runtime.sharding.outputs import OutputDistribution
from runtime.sharding.sequence import SequenceOutputDistribution
from runtime.sharding.state import ShardState, kernel_states, shard_state
from runtime.sharding.weights import (
    ShardedWeight,
    ShardView,
    initialise,
    load_full,
    sharded_state,
)
from runtime.sparse import (
    JaggedTensor,
    KeyedJaggedTensor,
    KeyedTensor,
    concat,
    offsets_from_lengths,
)

# Every form of a plan the sharded modules take (``ModulePlan.of`` reads each).
PlanSource = ModulePlan | ShardingPlan | bytes | str | Mapping[str, object]


class InputContext(NamedTuple):
    """A batch after its input distribution (step 1): this rank's batch in module order, the
    ids every rank sent this rank, and (sequence modules) what this rank sent."""

    features: KeyedJaggedTensor
    local: LocalBatch
    received: Received
    sent: Sent | None


class ShardedTables(nn.Module):
    """What both sharded modules hold: this rank's ``layout``, the ``inputs`` distribution
    built for this rank and one FBGEMM kernel per kernel group (``kernels``).

    It is also what checkpoints (``runtime.checkpoint``) and resharding (``runtime.reshard``)
    work with, whichever the collection: its ``plan``, ``tables``, ``group``, ``device``,
    ``fused_params`` and ``optimizer``, the ``shard_states`` they read and write, and the
    ``optimizer_step`` they carry over (``sharded_collections`` finds them in a model)."""

    def __init__(
        self,
        module: EmbeddingBagCollection | EmbeddingCollection,
        tables: Sequence[BaseEmbeddingConfig],
        plan: PlanSource,
        pg: dist.ProcessGroup | None,
        device: torch.device | str,
        fused_params: FusedParams | None,
        sequence: bool,
    ) -> None:
        super().__init__()
        check_tables(tables)
        self.group = Group(pg)
        plan = ModulePlan.of(plan)
        device = torch.device(device)
        check_plan(plan, tables, self.group.world_size)
        optimizer = fused_optimizer(fused_params)
        check_trainable(tables)
        self.plan = plan
        self.fused_params = dict(fused_params) if fused_params is not None else None
        self.optimizer = optimizer.optimizer
        self.plan_id = plan.plan_id
        self.device = device
        self.tables = list(tables)
        rank = self.group.rank
        self.layouts = build_layouts(plan, tables, cuda=device.type == "cuda", sequence=sequence)
        self.layout = self.layouts[rank]
        self.inputs = InputDistribution(
            input_exchange(plan, tables, self.layouts, rank), tables, self.group, device, sequence
        )
        self.kernels = nn.ModuleList(
            build_kernel(
                group.key,
                [(shard.rows, shard.cols) for shard in self.layout.shards_of(group)],
                group.feature_table_map(),
                optimizer,
                device,
                sequence,
            )
            for group in self.layout.groups
        )
        initialise(self._shard_views(), module)
        # Kernels with a weighted table take the ids' weights (1.0 for their other tables);
        # the others pool without: FBGEMM's weighted backward is the slower one.
        self._weighted = [
            any(is_weighted(self.tables[shard.table]) for shard in self.layout.shards_of(group))
            for group in self.layout.groups
        ]
        self._staged: InputContext | None = None

    def input_dist(self, features: KeyedJaggedTensor, group: Group | None = None) -> InputContext:
        """Step 1 of ``forward``: check the batch and send its ids to the ranks that look
        them up (the input all-to-alls, on ``group``: by default the module's; a pipeline
        passes another group over the same ranks). No autograd."""
        return self.distribute(features, self.inputs.prepare(features), group)

    def distribute(
        self, features: KeyedJaggedTensor, local: LocalBatch, group: Group | None = None
    ) -> InputContext:
        """``input_dist`` of a batch already checked by ``inputs.prepare``."""
        received, sent = self.inputs(local, group)
        return InputContext(features, local, received, sent)

    def stage(self, context: InputContext | None) -> None:
        """The next ``forward`` called with ``context.features`` (that very object) uses
        ``context`` instead of running the input distribution (and drops it); ``None``
        drops it. A call with any other input runs the ordinary path and leaves it staged."""
        self._staged = context

    def unstage(self) -> bool:
        """Drop the staged context; whether one was left (no ``forward`` used it)."""
        left, self._staged = self._staged is not None, None
        return left

    def _input_of(self, features: KeyedJaggedTensor) -> InputContext:
        staged = self._staged
        if staged is not None and staged.features is features:
            self._staged = None
            return staged
        return self.input_dist(features)

    def lookup(self, received: Received) -> list[torch.Tensor]:
        """Step 2 of ``forward``: each kernel's lookups of its features' ids, kernel by
        kernel: ``[sum of batches, columns]`` pooled, or ``[ids, width]`` rows for a sequence
        kernel. Public so that a step can be timed part by part (``runtime.measure``)."""
        total = sum(received.batches)
        outputs = []
        start_bag = start_value = 0
        kernels = zip(self.layout.groups, self._kernels(), self._weighted, strict=True)
        for group, kernel, weighted in kernels:
            end_bag = start_bag + len(group.features) * total
            lengths = received.lengths[start_bag:end_bag]
            end_value = start_value + int(lengths.sum())
            weights = received.weights if weighted else None
            outputs.append(
                kernel(
                    received.values[start_value:end_value],
                    offsets_from_lengths(lengths),
                    per_sample_weights=None if weights is None else weights[start_value:end_value],
                )
            )
            start_bag, start_value = end_bag, end_value
        return outputs

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

    def shard_states(self) -> list[ShardState]:
        """This rank's shards with their weights and fused optimizer state (views into the
        kernels), kernel by kernel; what checkpoints and resharding read and write."""
        states = []
        for group, kernel in zip(self.layout.groups, self._kernels(), strict=True):
            shards = self.layout.shards_of(group)
            optimizer_states = kernel_states(kernel, len(shards))
            for shard, weight, state in zip(
                shards, kernel.split_embedding_weights(), optimizer_states, strict=True
            ):
                table = self.tables[shard.table]
                offsets = (shard.row_offset, shard.col_offset)
                states.append(shard_state(table, offsets, weight, state, self.optimizer))
        return states

    @property
    def optimizer_step(self) -> int:
        """The fused optimizer's step count (the largest of this rank's kernels')."""
        return max((kernel_step(k) for k in self._kernels()), default=0)

    @optimizer_step.setter
    def optimizer_step(self, step: int) -> None:
        for kernel in self._kernels():
            set_kernel_step(kernel, step)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, ShardedWeight]:  # type: ignore[override]
        """Each table's local shards with their global offsets under TorchRec's key
        (``embedding_bags.{name}.weight`` pooled, ``embeddings.{name}.weight`` sequence); a
        table with nothing on this rank has no local shards."""
        return sharded_state(self.tables, self._shard_views())

    def load_state_dict(  # type: ignore[override]
        self, state_dict: Mapping[str, torch.Tensor], strict: bool = True, assign: bool = False
    ) -> None:
        """Load full (unsharded) tables: each rank copies the slices its shards hold."""
        load_full(self.tables, self._shard_views(), state_dict, strict)

    def gather_state_dict(self) -> dict[str, torch.Tensor]:
        """The full tables on every rank (for export): ``full_state`` without the
        optimizer's state."""
        return self.full_state(optimizer_state=False)

    def full_state(
        self, *, dst: int | None = None, optimizer_state: bool = True
    ) -> dict[str, torch.Tensor]:
        """Every full (unsharded) table and, with ``optimizer_state``, the fused optimizer's
        state for it, as CPU tensors under a checkpoint's keys (``runtime.sharding.gather``
        lists them with their shapes), gathered on rank ``dst`` of the module's group, or on
        every rank when ``dst`` is None; the other ranks get an empty dict. Every rank calls
        it. The step count is ``optimizer_step``."""
        return gather_full_state(
            self.layouts,
            self.tables,
            self.shard_states(),
            self.optimizer,
            self.group,
            self.device,
            dst=dst,
            optimizer_state=optimizer_state,
        )


class ShardedEmbeddingBagCollection(ShardedTables):
    """An ``EmbeddingBagCollection`` sharded by a plan over a process group (build it with
    ``shard_modules``); ``outputs`` turns the pooled columns into this rank's
    ``KeyedTensor``."""

    def __init__(
        self,
        module: EmbeddingBagCollection,
        plan: PlanSource,
        pg: dist.ProcessGroup | None,
        device: torch.device | str,
        fused_params: FusedParams | None = None,
    ) -> None:
        tables = module.embedding_bag_configs()
        super().__init__(module, tables, plan, pg, device, fused_params, sequence=False)
        self.outputs = OutputDistribution(
            output_exchange(self.plan, tables, self.layouts, self.group.rank),
            tables,
            self.group,
            subgroup_families(self.plan),
            self.device,
        )

    def output_exchanges(self) -> list[tuple[str, list[int]]]:
        """The collectives each step's output distribution runs on this rank, in order, with
        the ranks of the process group each runs on (for logs and tests)."""
        return self.outputs.exchange.collectives()

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        return self.compute_and_output(self._input_of(features))

    def compute_and_output(self, context: InputContext) -> KeyedTensor:
        """Steps 2 and 3 of ``forward``: lookups of the received ids, then the pooled columns
        back to their samples' ranks."""
        return self.output_dist(context, self.lookup(context.received))

    def output_dist(self, context: InputContext, pooled: list[torch.Tensor]) -> KeyedTensor:
        """Step 3 of ``forward``: the kernels' pooled columns (``lookup``'s) back to their
        samples' ranks, as this rank's ``KeyedTensor``."""
        received = context.received
        if not pooled:
            total = sum(received.batches)
            pooled = [torch.zeros(total, 0, device=self.device, requires_grad=True)]
        return self.outputs(concat(pooled, dim=1), received.batches, context.local.lengths)


class ShardedEmbeddingCollection(ShardedTables):
    """An ``EmbeddingCollection`` sharded by a plan over a process group (build it with
    ``shard_modules``); ``forward`` gives, per feature, a ``JaggedTensor`` of this rank's
    ids' rows, as the unsharded module does."""

    def __init__(
        self,
        module: EmbeddingCollection,
        plan: PlanSource,
        pg: dist.ProcessGroup | None,
        device: torch.device | str,
        fused_params: FusedParams | None = None,
    ) -> None:
        tables = module.embedding_configs()
        super().__init__(module, tables, plan, pg, device, fused_params, sequence=True)
        self.outputs = SequenceOutputDistribution(
            sequence_exchange(tables, self.layouts, self.group.rank),
            tables,
            self.group,
            self.device,
        )

    def forward(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        return self.compute_and_output(self._input_of(features))

    def compute_and_output(self, context: InputContext) -> dict[str, JaggedTensor]:
        """Steps 2 and 3 of ``forward``: a row per received id, then the rows back to their
        ids' ranks."""
        return self.output_dist(context, self.lookup(context.received))

    def output_dist(
        self, context: InputContext, rows: list[torch.Tensor]
    ) -> dict[str, JaggedTensor]:
        """Step 3 of ``forward``: the kernels' rows (``lookup``'s) back to their ids'
        ranks, each where its id stands."""
        sent = context.sent
        assert sent is not None
        return self.outputs(rows, context.received, sent, context.local)


Collection = EmbeddingBagCollection | EmbeddingCollection


@overload
def shard_modules(
    module: EmbeddingBagCollection,
    *,
    plan: PlanSource,
    pg: dist.ProcessGroup | None = None,
    device: torch.device | str | None = None,
    fused_params: FusedParams | None = None,
) -> ShardedEmbeddingBagCollection: ...


@overload
def shard_modules(
    module: EmbeddingCollection,
    *,
    plan: PlanSource,
    pg: dist.ProcessGroup | None = None,
    device: torch.device | str | None = None,
    fused_params: FusedParams | None = None,
) -> ShardedEmbeddingCollection: ...


@overload
def shard_modules(
    module: nn.Module,
    *,
    plan: PlanSource,
    pg: dist.ProcessGroup | None = None,
    device: torch.device | str | None = None,
    fused_params: FusedParams | None = None,
) -> nn.Module: ...


def shard_modules(
    module: nn.Module,
    *,
    plan: PlanSource,
    pg: dist.ProcessGroup | None = None,
    device: torch.device | str | None = None,
    fused_params: FusedParams | None = None,
) -> nn.Module:
    """Shard ``module`` by ``plan`` over ``pg`` (default: the default group if initialised,
    else a single rank).

    An ``EmbeddingBagCollection`` or ``EmbeddingCollection`` comes back as its sharded
    form. Any other module is sharded in place and returned: each such collection inside it
    is replaced by its sharded form, in ``named_modules`` order, and the plan must shard
    exactly the tables they hold between them. The plan is checked against the modules and
    the group before anything is allocated."""
    if pg is None and dist.is_available() and dist.is_initialized():
        pg = dist.group.WORLD
    target = torch.device(device) if device is not None else torch.device("cpu")
    whole = ModulePlan.of(plan)
    if isinstance(module, Collection):
        return shard_collection(module, whole, pg, target, fused_params)
    found = _collections(module)
    if not found:
        raise TypeError(
            f"shard_modules found no EmbeddingBagCollection or EmbeddingCollection in "
            f"{type(module).__name__}; nothing to shard"
        )
    tables = [(path, _configs(collection)) for path, collection in found]
    parts = split_plan(whole, tables, Group(pg).world_size)
    for (path, collection), part in zip(found, parts, strict=True):
        parent, _, name = path.rpartition(".")
        sharded = shard_collection(collection, part, pg, target, fused_params)
        setattr(module.get_submodule(parent), name, sharded)
    return module


def split_plan(
    whole: ModulePlan,
    collections: Sequence[tuple[str, Sequence[BaseEmbeddingConfig]]],
    world_size: int,
) -> list[ModulePlan]:
    """``whole`` cut into one plan per collection (path, tables) of a model, each checked
    (``check_plan``) before anything is allocated: table names unique across the model, and
    every table of the plan in some collection."""
    owner: dict[str, str] = {}
    for path, tables in collections:
        for table in tables:
            if table.name in owner:
                raise PlanMismatchError(
                    f"table {table.name!r} is in both {owner[table.name]!r} and {path!r}; the "
                    "plan keys tables by name, so names must be unique across the model"
                )
            owner[table.name] = path
    unknown = sorted(set(whole.tables) - set(owner))
    if unknown:
        raise PlanMismatchError(
            f"the plan shards tables {unknown} that no collection in the model has "
            f"(the model's tables: {sorted(owner)})"
        )
    parts = []
    for _, tables in collections:
        names = {t.name for t in tables}
        part = ModulePlan(
            whole.world_size,
            {n: s for n, s in whole.tables.items() if n in names},
            whole.plan_id,
        )
        check_plan(part, tables, world_size)
        parts.append(part)
    return parts


def shard_collection(
    module: Collection,
    plan: ModulePlan,
    pg: dist.ProcessGroup | None,
    device: torch.device,
    fused_params: FusedParams | None,
) -> ShardedEmbeddingBagCollection | ShardedEmbeddingCollection:
    """The sharded form of one collection under its own (already split) plan: what
    ``shard_modules`` does for each collection, and what resharding builds the new module
    with."""
    if isinstance(module, EmbeddingBagCollection):
        return ShardedEmbeddingBagCollection(module, plan, pg, device, fused_params)
    return ShardedEmbeddingCollection(module, plan, pg, device, fused_params)


def sharded_collections(module: nn.Module) -> list[tuple[str, ShardedTables]]:
    """The sharded collections in ``module`` with their paths (``""``: ``module`` itself),
    in ``named_modules`` order: what checkpoints save and load and resharding moves."""
    return [
        (path, child) for path, child in module.named_modules() if isinstance(child, ShardedTables)
    ]


def _collections(module: nn.Module) -> list[tuple[str, Collection]]:
    """The collections in ``module`` (not inside one another), with their paths."""
    found: list[tuple[str, Collection]] = []
    for path, child in module.named_modules():
        inside = any(path.startswith(f"{outer}.") for outer, _ in found)
        if isinstance(child, Collection) and not inside:
            found.append((path, child))
    return found


def _configs(module: Collection) -> Sequence[BaseEmbeddingConfig]:
    if isinstance(module, EmbeddingBagCollection):
        return module.embedding_bag_configs()
    return module.embedding_configs()


apply_sharding_plan = shard_modules
