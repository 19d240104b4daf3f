"""One rank's part of a measurement: the request's tables sharded by the plan, and training
steps timed part by part.

The tables become one collection per kind and optimizer (pooled tables in an
``EmbeddingBagCollection``, ``pooling: none`` tables in an ``EmbeddingCollection``), since
a sharded collection fuses one optimizer into its kernels; the collections are built on the
``meta`` device, so only this rank's shards are allocated. A step runs every collection's
input distribution, then every collection's lookups, then every output distribution, so
each part is one interval of the clock. The loss is the sum of every output times a fixed
random vector; its gradient (``other``, with the hand-over between parts) is taken apart
from the backward through the output exchange (``output_dist_bwd``), which stops at copies
of the kernels' outputs, so the kernels' backward with the fused optimizer
(``lookup_bwd``) is timed on its own.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from planner_service.plan.types import PlanRequest, PoolingType, ShardingPlan, Table
from runtime.measure.batches import draw_batches, rank_generator
from runtime.measure.report import MeasureSettings, Part, StepTimes
from runtime.modules import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    config_of,
)
from runtime.plan import ModulePlan
from runtime.sharding.module import (
    ShardedEmbeddingBagCollection,
    ShardedEmbeddingCollection,
    shard_collection,
    split_plan,
)
from runtime.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

Output = KeyedTensor | dict[str, JaggedTensor]
Sharded = ShardedEmbeddingBagCollection | ShardedEmbeddingCollection


@dataclass(frozen=True)
class CollectionSpec:
    """The request tables of one collection: all pooled or all sequence, one optimizer."""

    name: str
    tables: tuple[Table, ...]

    @property
    def sequence(self) -> bool:
        return self.tables[0].pooling is PoolingType.NONE


def collection_specs(request: PlanRequest) -> list[CollectionSpec]:
    """The request's tables grouped by kind and optimizer, in a fixed order (every rank
    builds the same collections in the same order, so their collectives pair up)."""
    groups: dict[tuple[bool, str], list[Table]] = {}
    for table in request.tables:
        key = (table.pooling is PoolingType.NONE, table.optimizer.value)
        groups.setdefault(key, []).append(table)
    return [
        CollectionSpec(f"{'sequence' if sequence else 'pooled'}_{optimizer}", tuple(tables))
        for (sequence, optimizer), tables in sorted(groups.items())
    ]


def unsharded(spec: CollectionSpec) -> EmbeddingBagCollection | EmbeddingCollection:
    """The spec's collection on the meta device (nothing allocated before the plan)."""
    configs = [config_of(table) for table in spec.tables]
    if spec.sequence:
        return EmbeddingCollection(
            [c for c in configs if isinstance(c, EmbeddingConfig)], device="meta"
        )
    return EmbeddingBagCollection(
        [c for c in configs if isinstance(c, EmbeddingBagConfig)], device="meta"
    )


def shard(
    specs: Sequence[CollectionSpec],
    plan: ShardingPlan,
    pg: dist.ProcessGroup | None,
    device: torch.device,
    learning_rate: float,
) -> list[Sharded]:
    """Every collection sharded by its part of the plan, with its tables' fused optimizer."""
    modules = [unsharded(spec) for spec in specs]
    world_size = dist.get_world_size(pg) if pg is not None else 1
    parts = split_plan(
        ModulePlan.of(plan),
        [(spec.name, [config_of(t) for t in spec.tables]) for spec in specs],
        world_size,
    )
    return [
        shard_collection(
            module,
            part,
            pg,
            device,
            {"optimizer": spec.tables[0].optimizer.value, "learning_rate": learning_rate},
        )
        for spec, module, part in zip(specs, modules, parts, strict=True)
    ]


class Clock:
    """Seconds from ``time.perf_counter``, after the device's queued work (cuda) is done."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


def output_tensors(outputs: Sequence[Output]) -> list[torch.Tensor]:
    """Every tensor a step's outputs hold: pooled values, each sequence feature's rows."""
    tensors = []
    for output in outputs:
        if isinstance(output, KeyedTensor):
            tensors.append(output.values())
        else:
            tensors.extend(jt.values() for jt in output.values())
    return tensors


def loss_of(tensors: Sequence[torch.Tensor], vector: torch.Tensor) -> torch.Tensor:
    """Every output value times a fixed random weight of its column, summed."""
    return torch.stack([(t * vector[: t.shape[1]]).sum() for t in tensors]).sum()


def timed_step(
    collections: Sequence[Sharded],
    batch: Sequence[KeyedJaggedTensor],
    vector: torch.Tensor,
    clock: Clock,
) -> StepTimes:
    """One training step, its parts timed (see the module docstring)."""
    start = clock.now()
    contexts = [c.input_dist(kjt) for c, kjt in zip(collections, batch, strict=True)]
    distributed = clock.now()
    looked_up = [
        c.lookup(context.received) for c, context in zip(collections, contexts, strict=True)
    ]
    looked = clock.now()
    cut = [[x.detach().requires_grad_() for x in rows] for rows in looked_up]
    cut_done = clock.now()
    outputs = [
        c.output_dist(context, rows)
        for c, context, rows in zip(collections, contexts, cut, strict=True)
    ]
    sent = clock.now()
    tensors = output_tensors(outputs)
    grads = torch.autograd.grad(loss_of(tensors, vector), tensors)
    loss_done = clock.now()
    torch.autograd.backward(tensors, grads)
    returned = clock.now()
    pairs = [
        (x, c.grad)
        for rows, copies in zip(looked_up, cut, strict=True)
        for x, c in zip(rows, copies, strict=True)
        if c.grad is not None
    ]
    if pairs:
        torch.autograd.backward([x for x, _ in pairs], [g for _, g in pairs])
    end = clock.now()
    ms = 1000.0
    timed: dict[Part, float] = {
        Part.INPUT_DIST: (distributed - start) * ms,
        Part.LOOKUP_FWD: (looked - distributed) * ms,
        Part.OUTPUT_DIST_FWD: (sent - cut_done) * ms,
        Part.OUTPUT_DIST_BWD: (returned - loss_done) * ms,
        Part.LOOKUP_BWD: (end - returned) * ms,
    }
    return StepTimes.of((end - start) * ms, timed)


def measure_rank(
    request: PlanRequest,
    plan: ShardingPlan,
    settings: MeasureSettings,
    rank: int,
    pg: dist.ProcessGroup | None,
    device: torch.device,
) -> list[StepTimes]:
    """This rank's timed steps: shard, draw batches, warm up, then time ``settings.steps``
    steps (the batches cycled)."""
    return measure_rank_interleaved(request, [plan], settings, rank, pg, device)[0]


def measure_rank_interleaved(
    request: PlanRequest,
    plans: Sequence[ShardingPlan],
    settings: MeasureSettings,
    rank: int,
    pg: dist.ProcessGroup | None,
    device: torch.device,
) -> list[list[StepTimes]]:
    """This rank's timed steps of every plan (of one world size), taken in turn: each plan
    sharded, the batches drawn once for all, then ``settings.warmup`` + ``settings.steps``
    rounds of one step of every plan in an order drawn anew each round (seeded by the
    settings' seed and the round, so every rank draws the same one and the collectives pair
    up): a machine that runs faster or slower from one second to the next slows every plan
    alike, and no plan always follows the same one (whose caches it would inherit). Each
    plan's step starts after a barrier (untimed), so that it carries no wait for the plan
    before. Index ``i`` of the result: ``plans[i]``'s."""
    specs = collection_specs(request)
    sharded = [shard(specs, plan, pg, device, settings.learning_rate) for plan in plans]
    generator = rank_generator(settings.seed, rank)
    batches = draw_batches(
        request, [spec.tables for spec in specs], settings.batches, generator, device
    )
    widest = max(table.embedding_dim for table in request.tables)
    widths = sum(t.embedding_dim * t.num_features for t in request.tables)
    vector = torch.rand(max(widest, widths), generator=generator).to(device)
    clock = Clock(device)
    samples: list[list[StepTimes]] = [[] for _ in plans]
    for step in range(settings.warmup + settings.steps):
        batch = batches[step % len(batches)]
        order = random.Random(f"{settings.seed}-{step}").sample(range(len(plans)), len(plans))
        for index in order:
            if len(plans) > 1 and pg is not None:
                # Every rank starts the plan's step together: a rank left idle by the plan
                # before (its ranks unevenly loaded) would otherwise wait for it inside
                # this plan's input distribution, and charge this plan for it.
                dist.barrier(group=pg)
            times = timed_step(sharded[index], batch, vector, clock)
            if step >= settings.warmup:
                samples[index].append(times)
    return samples
