"""Equivalence scenarios for sequence embeddings (``EmbeddingCollection``), run on every rank
of a gloo group, and for a model holding pooled and sequence collections under one plan.

As in tests/runtime/cases.py: the unsharded module sees the global batch, the sharded one
the rank's slice (ranks have different batch sizes). Each feature's rows must equal the
reference's rows for that rank's ids, and after three training steps (loss = each
feature's rows times a fixed random matrix, summed) every local shard must equal the
matching slice of the reference trained by the same optimizer rule on the global batch.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from torch import nn

from planner_service.plan.shards import COLUMN_ALIGNMENT, column_wise_shards
from planner_service.plan.types import ComputeKernel, ParameterSharding, PoolingType, ShardingType
from runtime import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    JaggedTensor,
    KeyedJaggedTensor,
    ModulePlan,
    column_wise,
    construct_module_plan,
    data_parallel,
    row_wise,
    shard_modules,
    table_column_wise,
    table_row_wise,
    table_wise,
)
from tests.runtime.cases import (
    ATOL,
    SEED,
    STEPS,
    ReferenceOptimizer,
    Scenario,
    check_scenario,
    fused_params,
    global_batch,
)
from tests.runtime.cases import scenarios as pooled_scenarios


def _listed(kind: ShardingType, shards: list, order: list[int]) -> ParameterSharding:
    """A column-split sharding with its shards listed in ``order``."""
    listed = [shards[i] for i in order]
    return ParameterSharding(
        sharding_type=kind,
        compute_kernel=ComputeKernel.FUSED,
        ranks=[s.rank for s in listed],
        shards=listed,
    )


def seed_case(table: EmbeddingConfig, world: int, local: int) -> ParameterSharding:
    """The column-wise commit's case: three column shards on ranks [0, 1, 0], listed out of
    column order (the last first)."""
    shards = column_wise_shards(table.num_embeddings, [4, 8, 4], [0, 1, 0])
    return _listed(ShardingType.COLUMN_WISE, shards, [2, 0, 1])


def scenarios(world: int) -> dict[str, tuple[list[EmbeddingConfig], ModulePlan]]:
    """Every sharding type alone, then all together; tables of several widths, a table
    with two features, fewer rows than ranks and a table of one row."""
    local = 2 if world == 4 else world
    last, last_host = world - 1, world // local - 1
    t = {
        "tw": EmbeddingConfig("tw", 20, 8),
        "tw_two": EmbeddingConfig("tw_two", 25, 12, feature_names=["s1", "s2"]),
        "cw": EmbeddingConfig("cw", 16, 16),  # the seed's [0, 1, 0], out of order
        "cw_b": EmbeddingConfig("cw_b", 9, 8),
        "twcw": EmbeddingConfig("twcw", 11, 12),
        "rw": EmbeddingConfig("rw", 37, 8),
        "rw_tiny": EmbeddingConfig("rw_tiny", 2, 4),
        "twrw": EmbeddingConfig("twrw", 29, 8),
        "twrw_one": EmbeddingConfig("twrw_one", 1, 4),
        "dp": EmbeddingConfig("dp", 9, 4),
    }
    builders: dict[str, Callable[..., ParameterSharding]] = {
        "tw": table_wise(last),
        "tw_two": table_wise(0),
        "cw": seed_case,
        "cw_b": column_wise([last, 0]),
        "twcw": table_column_wise(last_host),
        "rw": row_wise(),
        "rw_tiny": row_wise(),
        "twrw": table_row_wise(last_host),
        "twrw_one": table_row_wise(0),
        "dp": data_parallel(),
    }
    groups = {
        "table_wise": ["tw", "tw_two"],
        "column_wise": ["cw", "cw_b"],
        "table_column_wise": ["twcw"],
        "row_wise": ["rw", "rw_tiny"],
        "table_row_wise": ["twrw", "twrw_one"],
        "data_parallel": ["dp"],
        "mixed": list(t),
    }
    result = {}
    for name, members in groups.items():
        tables = [t[m] for m in members]
        per_table = {m: builders[m] for m in members}
        plan = construct_module_plan(tables, per_table, world_size=world, local_world_size=local)
        result[name] = (tables, plan)
    return result


def random_column_orders(
    world: int, count: int, seed: int
) -> list[tuple[list[EmbeddingConfig], ModulePlan]]:
    """Column-wise tables of different widths (one with two features) cut into 1 to 5
    shards of random widths on random ranks (repeats included), listed in random order."""
    rng = random.Random(seed * 100 + world)
    result = []
    for _ in range(count):
        tables = [
            EmbeddingConfig(
                f"t{i}",
                rng.randint(1, 30),
                COLUMN_ALIGNMENT * rng.randint(1, 6),
                feature_names=[f"t{i}_a", f"t{i}_b"] if i == 0 else [],
            )
            for i in range(3)
        ]
        shardings = {}
        for table in tables:
            units = table.embedding_dim // COLUMN_ALIGNMENT
            parts = rng.randint(1, min(units, 5))
            cuts = sorted(rng.sample(range(1, units), parts - 1))
            widths = [
                (b - a) * COLUMN_ALIGNMENT for a, b in zip([0, *cuts], [*cuts, units], strict=True)
            ]
            ranks = [rng.randrange(world) for _ in widths]
            shards = column_wise_shards(table.num_embeddings, widths, ranks)
            order = list(range(len(shards)))
            rng.shuffle(order)
            shardings[table.name] = _listed(ShardingType.COLUMN_WISE, shards, order)
        result.append((tables, ModulePlan(world, shardings)))
    return result


# --------------------------------------------------------------------------- checks


def _rows(batch: KeyedJaggedTensor, feature: str, start: int, end: int) -> slice:
    """Which of a feature's ids in ``batch`` belong to samples ``start .. end``."""
    offsets = batch[feature].offsets()
    return slice(int(offsets[start]), int(offsets[end]))


def _targets(rows: int, width: int, step: int, feature: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(SEED * 11 + step * 101 + sum(map(ord, feature)))
    return torch.randn(rows, width, generator=generator)


def _loss(out: dict[str, JaggedTensor], targets: dict[str, torch.Tensor]) -> torch.Tensor:
    return sum(
        ((out[f].values() * target).sum() for f, target in targets.items()), start=torch.zeros(())
    )


def check_sequence(
    rank: int,
    world: int,
    name: str,
    tables: list[EmbeddingConfig],
    plan: ModulePlan,
    optimizer: str,
    batches: list[int] | None = None,
) -> None:
    batches = batches or [3 + r for r in range(world)]
    start = sum(batches[:rank])
    end = start + batches[rank]
    reference = EmbeddingCollection(tables, seed=SEED)
    sharded = shard_modules(reference, plan=plan, fused_params=fused_params(optimizer))
    ref_opt = ReferenceOptimizer(optimizer, reference, plan)
    for step in range(STEPS):
        whole, parts = global_batch(tables, batches, world, step)  # type: ignore[arg-type]
        expected = reference(whole)
        got = sharded(parts[rank])
        assert list(got) == list(expected), (name, list(got), list(expected))
        targets, mine = {}, {}
        for feature, jt in expected.items():
            rows = _rows(whole, feature, start, end)
            want = jt.values()[rows]
            have = got[feature]
            assert have.values().shape == want.shape, (name, feature, have.values().shape)
            assert torch.equal(have.lengths(), parts[rank][feature].lengths()), (name, feature)
            diff = (have.values() - want).abs().max().item() if want.numel() else 0.0
            assert diff <= ATOL, (
                f"{name}/{optimizer} rank {rank} step {step}: {feature} off by {diff}"
            )
            targets[feature] = _targets(jt.values().shape[0], jt.values().shape[1], step, feature)
            mine[feature] = targets[feature][rows]
        _loss(expected, targets).backward()
        ref_opt.step(whole)
        _loss(got, mine).backward()
    state = sharded.state_dict()
    for table in tables:
        full = reference.table_weight(table.name).detach()
        for (r0, c0), shard in state[f"embeddings.{table.name}.weight"].local_shards:
            want = full[r0 : r0 + shard.shape[0], c0 : c0 + shard.shape[1]]
            diff = (shard - want).abs().max().item() if shard.numel() else 0.0
            assert diff <= ATOL, (
                f"{name}/{optimizer} rank {rank}: table {table.name} shard at {(r0, c0)} off "
                f"by {diff} after {STEPS} steps"
            )


def planned(rank: int, world: int, plan_json: bytes) -> None:
    """A plan the planner made (``test_sequence.planned_host_local``): sequence tables
    table-row-wise and table-column-wise, as the planner splits and places them."""
    plan = ModulePlan.of(plan_json)
    tables = [EmbeddingConfig(name, rows, dim) for name, (rows, dim) in PLANNED_TABLES.items()]
    check_sequence(rank, world, "planned", tables, plan, "rowwise_adagrad")


# The tables of ``planned`` and the sharding type the request allows each.
PLANNED_TABLES = {"twrw": (29, 8), "twcw": (11, 16), "twrw_wide": (40, 16)}
PLANNED_TYPES = {
    "twrw": ShardingType.TABLE_ROW_WISE,
    "twcw": ShardingType.TABLE_COLUMN_WISE,
    "twrw_wide": ShardingType.TABLE_ROW_WISE,
}


def equivalence(rank: int, world: int, optimizer: str) -> None:
    for name, (tables, plan) in scenarios(world).items():
        check_sequence(rank, world, name, tables, plan, optimizer)


def empty_batch(rank: int, world: int) -> None:
    """Rank 0 has no samples this step (an uneven last batch): it still takes part in every
    exchange, gets empty outputs, and every shard trains as the unsharded module does."""
    batches = [0] + [3] * (world - 1)
    tables, plan = scenarios(world)["mixed"]
    check_sequence(rank, world, "mixed, empty batch", tables, plan, "sgd", batches)
    mixed = next(s for s in pooled_scenarios(world) if s.name == "mixed")
    check_scenario(rank, world, mixed, "sgd", batches=batches)


def column_orders(rank: int, world: int, count: int) -> None:
    """Random column-shard orders, for sequence and pooled tables alike."""
    for i, (tables, plan) in enumerate(random_column_orders(world, count, seed=7)):
        check_sequence(rank, world, f"random {i}", tables, plan, "sgd")
        pooled = [
            EmbeddingBagConfig(t.name, t.num_embeddings, t.embedding_dim, t.feature_names)
            for t in tables
        ]
        check_scenario(rank, world, Scenario(f"random pooled {i}", pooled, plan), "sgd")


def state_round_trip(rank: int, world: int) -> None:
    """state_dict keys and offsets, load of a full state, and gathering it back."""
    tables, plan = scenarios(world)["mixed"]
    sharded = shard_modules(EmbeddingCollection(tables, device="meta"), plan=plan)
    source = EmbeddingCollection(tables, seed=99)
    full = {k: v.detach().clone() for k, v in source.state_dict().items()}
    sharded.load_state_dict(full)
    gathered = sharded.gather_state_dict()
    assert list(gathered) == list(full) == list(sharded.state_dict())
    assert all(k.startswith("embeddings.") for k in full)
    for key, value in full.items():
        assert torch.equal(gathered[key], value), key
    whole, parts = global_batch(tables, [4] * world, world, 0)  # type: ignore[arg-type]
    got, want = sharded(parts[rank]), source(whole)
    for feature, jt in want.items():
        rows = _rows(whole, feature, 4 * rank, 4 * rank + 4)
        assert torch.equal(got[feature].values(), jt.values()[rows]), feature


# --------------------------------------------------------------------------- one plan, two modules


class TwoCollections(nn.Module):
    """Pooled and sequence features side by side: each sample's pooled embeddings and the
    mean of its sequence rows."""

    def __init__(self, device: str | None = None) -> None:
        super().__init__()
        self.pooled = EmbeddingBagCollection(
            [
                EmbeddingBagConfig("user", 31, 8),
                EmbeddingBagConfig("item", 17, 8, pooling=PoolingType.MEAN),
            ],
            device,
            seed=SEED,
        )
        self.towers = nn.ModuleDict(
            {
                "history": EmbeddingCollection(
                    [EmbeddingConfig("clicks", 23, 8), EmbeddingConfig("queries", 5, 8)],
                    device,
                    seed=SEED + 1,
                )
            }
        )

    def features(self) -> list[str]:
        return ["user", "item", "clicks", "queries"]

    def forward(self, batch: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.pooled(batch).values()
        rows = self.towers["history"](batch)
        means = []
        for jt in rows.values():
            sums = torch.zeros(jt.lengths().numel(), jt.values().shape[1])
            sample = torch.repeat_interleave(torch.arange(jt.lengths().numel()), jt.lengths())
            sums = sums.index_add(0, sample, jt.values())
            means.append(sums / jt.lengths().clamp(min=1).unsqueeze(1))
        return torch.cat([pooled, *means], dim=1)


def two_collections_plan(world: int) -> ModulePlan:
    tables = [
        EmbeddingBagConfig("user", 31, 8),
        EmbeddingBagConfig("item", 17, 8),
        EmbeddingConfig("clicks", 23, 8),
        EmbeddingConfig("queries", 5, 8),
    ]
    per_table = {
        "user": row_wise(),
        "item": column_wise([world - 1, 0]),
        "clicks": row_wise(),
        "queries": table_wise(world - 1),
    }
    return construct_module_plan(tables, per_table, world_size=world)


def two_collections(rank: int, world: int) -> None:
    """One plan shards both collections of a model in place; the model's output for the
    rank's samples and its tables after three SGD steps match the unsharded model."""
    plan = two_collections_plan(world)
    reference = TwoCollections()
    model = TwoCollections()
    model.load_state_dict(reference.state_dict())
    sharded = shard_modules(model, plan=plan, fused_params=fused_params("sgd"))
    assert sharded is model
    assert type(model.pooled).__name__ == "ShardedEmbeddingBagCollection"
    assert type(model.towers["history"]).__name__ == "ShardedEmbeddingCollection"
    tables = [
        EmbeddingBagConfig("user", 31, 8),
        EmbeddingBagConfig("item", 17, 8),
        EmbeddingBagConfig("clicks", 23, 8),
        EmbeddingBagConfig("queries", 5, 8),
    ]
    batches = [3 + r for r in range(world)]
    start = sum(batches[:rank])
    optimizers = [
        ReferenceOptimizer("sgd", reference.pooled, plan),
        ReferenceOptimizer("sgd", reference.towers["history"], plan),  # type: ignore[arg-type]
    ]
    for step in range(STEPS):
        whole, parts = global_batch(tables, batches, world, step)
        expected = reference(whole)
        got = model(parts[rank])
        want = expected[start : start + batches[rank]]
        diff = (got - want).abs().max().item()
        assert diff <= ATOL, f"rank {rank} step {step}: model output off by {diff}"
        weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(step))
        (expected * weights).sum().backward()
        for opt in optimizers:
            opt.step(whole)
        (got * weights[start : start + batches[rank]]).sum().backward()
    for collection, ref in (
        (model.pooled, reference.pooled),
        (model.towers["history"], reference.towers["history"]),
    ):
        for key, held in collection.state_dict().items():
            full = ref.state_dict()[key]
            for (r0, c0), shard in held.local_shards:
                want = full[r0 : r0 + shard.shape[0], c0 : c0 + shard.shape[1]]
                assert (shard - want).abs().max().item() <= ATOL, (rank, key, (r0, c0))
