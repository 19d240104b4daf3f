"""Full tables and optimizer state gathered from a sharded module, run on every rank of a
gloo group.

The oracle is the unsharded model trained by the same FBGEMM kernels: the same tables whole
on one process (no process group), fed the global batch while each rank of the sharded
module is fed its slice. After three steps the gathered state must equal it bit for bit.
Row-wise Adagrad keeps its accumulator per row of a shard, so for it the one-process model
splits the columns the plan splits (on its one rank); the torch reference of
tests/runtime/cases.py then says what those accumulators and Adam's moments hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed.checkpoint as dcp

from planner_service.plan.types import OptimizerType
from runtime import (
    EmbeddingBagCollection,
    ModulePlan,
    ShardedEmbeddingBagCollection,
    column_wise,
    construct_module_plan,
    full_state,
    save_checkpoint,
    shard_modules,
    table_wise,
)
from runtime.modules import BaseEmbeddingConfig
from runtime.sharding.module import ShardedTables, shard_collection
from tests.runtime.cases import (
    ATOL,
    SEED,
    STEPS,
    ReferenceOptimizer,
    _targets,
    fused_params,
    global_batch,
    scenarios,
)
from tests.runtime.sequence_cases import TwoCollections, two_collections_plan

OPTIMIZERS = ("sgd", "rowwise_adagrad", "adagrad", "adam")
CPU = torch.device("cpu")


def one_rank_plan(plan: ModulePlan, tables: list[Any], split_columns: bool) -> ModulePlan:
    """``plan``'s tables on one rank: whole, or (``split_columns``) cut into the column
    ranges ``plan`` cuts them into."""
    per_table = {}
    for table in tables:
        widths = sorted(
            {(s.offsets[1], s.sizes[1]) for s in plan.tables[table.name].shards if s.sizes[1]}
        )
        if split_columns and len(widths) > 1:
            per_table[table.name] = column_wise([0] * len(widths), widths=[w for _, w in widths])
        else:
            per_table[table.name] = table_wise(0)
    return construct_module_plan(tables, per_table, world_size=1)


def expected_state(reference: ShardedTables, prefix: str = "") -> dict[str, torch.Tensor]:
    """The full state of a one-process module, from its shards as FBGEMM holds them, under
    the documented keys."""
    full: dict[str, torch.Tensor] = {}
    for shard in reference.shard_states():
        table = shard.table
        key = f"{prefix}{table.state_prefix}.{table.name}.weight"
        size = (table.num_embeddings, table.embedding_dim)
        r0, c0, rows, cols = shard.region
        at = (slice(r0, r0 + rows), slice(c0, c0 + cols))
        full.setdefault(key, torch.zeros(size, dtype=table.dtype))[at] = shard.weight
        for i, state in enumerate(shard.elementwise):
            full.setdefault(f"{key}.momentum{i + 1}", torch.zeros(size))[at] = state
        if shard.rowwise is not None:
            rowwise = f"{key}.momentum1.columns_{c0}_{c0 + cols}"
            full.setdefault(rowwise, torch.zeros(size[0]))[r0 : r0 + rows] = shard.rowwise
    return full


def assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    assert sorted(got) == sorted(want), f"{what}: keys {sorted(got)} != {sorted(want)}"
    for key, value in want.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, (what, key)
        if not torch.equal(got[key], value):
            gap = (got[key].double() - value.double()).abs().max().item()
            raise AssertionError(f"{what}: {key} differs by up to {gap}")


def pooled(rank: int, world: int) -> None:
    """The mixed plan (every sharding type, column shards listed out of order and two on one
    rank, data-parallel replicas) under every optimizer: ``full_state`` on every rank and on
    the last rank only."""
    scenario = next(s for s in scenarios(world) if s.name == "mixed")
    for optimizer in OPTIMIZERS:
        check_pooled(rank, world, scenario.tables, scenario.plan, optimizer)


def check_pooled(
    rank: int, world: int, tables: list[Any], plan: ModulePlan, optimizer: str
) -> None:
    fused = fused_params(optimizer)
    sharded = shard_modules(
        EmbeddingBagCollection(tables, seed=SEED), plan=plan, fused_params=fused
    )
    whole_plan = one_rank_plan(plan, tables, optimizer == OptimizerType.ROWWISE_ADAGRAD)
    unsharded = EmbeddingBagCollection(tables, seed=SEED)
    reference = ShardedEmbeddingBagCollection(unsharded, whole_plan, None, CPU, fused)
    torch_model = EmbeddingBagCollection(tables, seed=SEED)
    torch_optimizer = ReferenceOptimizer(optimizer, torch_model, plan)
    batches = [3 + r for r in range(world)]
    start = sum(batches[:rank])
    width = sum(t.embedding_dim * len(t.feature_names) for t in tables)
    for step in range(STEPS):
        whole, parts = global_batch(tables, batches, world, step)
        target = _targets(sum(batches), width, step)
        (sharded(parts[rank]).values() * target[start : start + batches[rank]]).sum().backward()
        (reference(whole).values() * target).sum().backward()
        if optimizer != "adagrad":  # the torch reference has no plain Adagrad
            (torch_model(whole).values() * target).sum().backward()
            torch_optimizer.step(whole)
    what = f"{optimizer} at world size {world}, rank {rank}"
    want = expected_state(reference)
    assert_equal(sharded.full_state(), want, what)
    at_last = sharded.full_state(dst=world - 1)
    if rank == world - 1:
        assert_equal(at_last, want, f"{what}, gathered on rank {world - 1}")
    else:
        assert at_last == {}, (what, sorted(at_last))
    weights = {k: v for k, v in want.items() if k.endswith(".weight")}
    assert_equal(sharded.full_state(optimizer_state=False), weights, f"{what}, weights only")
    assert_equal(sharded.gather_state_dict(), weights, f"{what}, gather_state_dict")
    assert sharded.optimizer_step == reference.optimizer_step, what
    check_meaning(want, torch_optimizer, tables, optimizer)


def check_meaning(
    state: dict[str, torch.Tensor],
    torch_optimizer: ReferenceOptimizer,
    tables: list[BaseEmbeddingConfig],
    optimizer: str,
) -> None:
    """What the documented keys hold, against the torch reference: row-wise Adagrad's
    accumulator per column range of the plan, Adam's two moments."""
    for table in tables:
        key = f"embedding_bags.{table.name}.weight"
        if optimizer == "rowwise_adagrad":
            for b, (c0, c1) in enumerate(torch_optimizer.blocks[table.name]):
                want = torch_optimizer.state[table.name][:, b]
                gap = (state[f"{key}.momentum1.columns_{c0}_{c1}"] - want).abs().max().item()
                assert gap <= ATOL * max(1.0, want.abs().max().item()), (table.name, c0, gap)
        if optimizer == "adam":
            for i, moment in enumerate(torch_optimizer.moments[table.name]):
                gap = (state[f"{key}.momentum{i + 1}"] - moment).abs().max().item()
                assert gap <= ATOL, (table.name, i, gap)


def model(rank: int, world: int, directory: str) -> None:
    """A model holding a pooled and a sequence collection: ``runtime.full_state`` keys every
    tensor by the model's keys, exactly the keys a checkpoint of it stores, on rank 0 only."""
    plan = two_collections_plan(world)
    fused = fused_params("rowwise_adagrad")
    sharded = shard_modules(TwoCollections(), plan=plan, fused_params=fused)
    reference = TwoCollections()
    whole_plan = one_rank_plan(plan, _configs(reference), split_columns=True)
    for path in ("pooled", "towers.history"):
        parent, _, name = path.rpartition(".")
        owner = reference.get_submodule(parent)
        collection = cast(Any, owner.get_submodule(name))
        names = {t.name for t in _configs(collection)}
        part = ModulePlan(1, {n: s for n, s in whole_plan.tables.items() if n in names})
        setattr(owner, name, shard_collection(collection, part, None, CPU, fused))
    batches = [3 + r for r in range(world)]
    start = sum(batches[:rank])
    tables = _configs(reference)
    for step in range(STEPS):
        whole, parts = global_batch(tables, batches, world, step)
        expected = reference(whole)
        weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(step))
        (expected * weights).sum().backward()
        (sharded(parts[rank]) * weights[start : start + batches[rank]]).sum().backward()
    got = full_state(sharded, dst=0)
    if rank != 0:
        assert got == {}, sorted(got)
    else:
        want = expected_state(reference.pooled, "pooled.")
        want |= expected_state(reference.towers["history"], "towers.history.")
        assert_equal(got, want, f"model at world size {world}")
    save_checkpoint(sharded, directory)
    stored = dcp.FileSystemReader(Path(directory)).read_metadata().state_dict_metadata
    assert sorted(full_state(sharded)) == sorted(stored), sorted(stored)


def _configs(module: Any) -> list[Any]:
    """The table configs of a model or collection, sharded or not."""
    found = []
    for child in module.modules():
        if isinstance(child, ShardedTables):
            found += child.tables
        elif hasattr(child, "embedding_bag_configs"):
            found += child.embedding_bag_configs()
        elif hasattr(child, "embedding_configs"):
            found += child.embedding_configs()
    return found
