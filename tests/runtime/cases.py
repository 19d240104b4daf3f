"""Equivalence scenarios for the sharded runtime, run on every rank of a gloo group.

Each scenario is a set of tables and a hand-built plan. On every rank the unsharded module
(the same seed, so the same weights) sees the *global* batch; the sharded module sees the
rank's slice of it (ranks have different batch sizes). Pooled outputs must match the
reference's rows for that rank, and after three training steps (loss = sum of outputs times
a fixed random matrix) every local shard must equal the matching slice of the reference
trained by the same optimizer rule on the global batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from planner_service.plan.shards import row_block_size
from planner_service.plan.types import ParameterSharding, PoolingType, ShardingType
from runtime import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    KeyedJaggedTensor,
    ModulePlan,
    ShardedEmbeddingBagCollection,
    SubgroupTimeoutError,
    column_wise,
    construct_module_plan,
    data_parallel,
    row_wise,
    shard_modules,
    table_column_wise,
    table_row_wise,
    table_wise,
)
from runtime.comm import Group
from runtime.modules import BaseEmbeddingConfig
from tests.support.distributed import COLLECTIVE_TIMEOUT_S

ATOL = 1e-5
LEARNING_RATE = 0.1
EPS = 1e-8
STEPS = 3
ADAM_BETAS = (0.9, 0.999)  # FBGEMM's defaults
WEIGHT_DECAY = 0.01  # adam only
# Adam's step g / (|g| + eps) turns a rounding difference in a near-zero gradient (sums of
# products that nearly cancel: 5e-7 occurs in these batches) into a large weight change, so
# its equivalence is checked with an eps that keeps that amplification below 100.
ADAM_EPS = 1e-2
SEED = 1234


@dataclass
class Scenario:
    name: str
    tables: list[EmbeddingBagConfig]
    plan: ModulePlan


def _shuffled_column_wise(table: EmbeddingBagConfig, ranks: list[int]) -> ParameterSharding:
    """Column shards listed out of column order (the last first), several on one rank."""
    built = column_wise(ranks)(table, 0, 0)
    shards = built.shards[::-1]
    return ParameterSharding(
        sharding_type=ShardingType.COLUMN_WISE,
        compute_kernel=built.compute_kernel,
        ranks=[s.rank for s in shards],
        shards=shards,
    )


def scenarios(world: int) -> list[Scenario]:
    local = 2 if world == 4 else world  # two hosts of two ranks at world size 4
    last_host = world // local - 1
    last = world - 1
    t = {
        "tw_a": EmbeddingBagConfig("tw_a", 20, 8),
        "tw_mean": EmbeddingBagConfig("tw_mean", 13, 4, pooling=PoolingType.MEAN),
        "tw_two": EmbeddingBagConfig("tw_two", 25, 8, feature_names=["f1", "f2"]),
        "cw": EmbeddingBagConfig("cw", 16, 16),
        "cw_b": EmbeddingBagConfig("cw_b", 9, 8, pooling=PoolingType.MEAN),
        "twcw": EmbeddingBagConfig("twcw", 11, 12),
        "rw": EmbeddingBagConfig("rw", 37, 8),
        "rw_tiny": EmbeddingBagConfig("rw_tiny", 2, 4),  # fewer rows than ranks
        "rw_w": EmbeddingBagConfig("rw_w", 15, 8, is_weighted=True, pooling=PoolingType.MEAN),
        "twrw": EmbeddingBagConfig("twrw", 29, 8),
        "twrw_tiny": EmbeddingBagConfig("twrw_tiny", 1, 4, pooling=PoolingType.MEAN),
        "dp": EmbeddingBagConfig("dp", 9, 4),
        "dp_w": EmbeddingBagConfig("dp_w", 6, 8, is_weighted=True),
        "tw_w": EmbeddingBagConfig("tw_w", 10, 4, is_weighted=True),
    }
    builders: dict[str, Callable[..., ParameterSharding]] = {
        "tw_a": table_wise(0),
        "tw_mean": table_wise(last),
        "tw_two": table_wise(1),
        "tw_w": table_wise(last),
        "cw": lambda table, world, local: _shuffled_column_wise(table, [0, 1, 0]),
        "cw_b": column_wise([last, 0]),
        "twcw": table_column_wise(last_host),
        "rw": row_wise(),
        "rw_tiny": row_wise(),
        "rw_w": row_wise(),
        "twrw": table_row_wise(last_host),
        "twrw_tiny": table_row_wise(0),  # one row: the host's other blocks are empty
        "dp": data_parallel(),
        "dp_w": data_parallel(),
    }
    groups = {
        "table_wise": ["tw_a", "tw_mean", "tw_two", "tw_w"],
        "column_wise": ["cw", "cw_b"],
        "table_column_wise": ["twcw"],
        "row_wise": ["rw", "rw_tiny", "rw_w"],
        "table_row_wise": ["twrw", "twrw_tiny"],
        "data_parallel": ["dp", "dp_w"],
        "mixed": list(t),
    }
    result = []
    for name, members in groups.items():
        tables = [t[m] for m in members]
        plan = construct_module_plan(
            tables, {m: builders[m] for m in members}, world_size=world, local_world_size=local
        )
        result.append(Scenario(name, tables, plan))
    return result


# --------------------------------------------------------------------------- batches


def _ids(table: EmbeddingBagConfig, count: int, world: int, generator: torch.Generator):
    """Ids half uniform, half on row-block boundaries (for every block count up to world)."""
    rows = table.num_embeddings
    edges = {0, rows - 1}
    for blocks in range(1, world + 1):
        block = row_block_size(rows, blocks)
        edges |= {min(rows - 1, b * block + d) for b in range(blocks) for d in (-1, 0)}
    edges_t = torch.tensor(sorted(e for e in edges if 0 <= e < rows))
    uniform = torch.randint(0, rows, (count,), generator=generator)
    pick = edges_t[torch.randint(0, len(edges_t), (count,), generator=generator)]
    coin = torch.rand(count, generator=generator) < 0.5
    return torch.where(coin, pick, uniform)


def global_batch(
    tables: list[EmbeddingBagConfig],
    batches: list[int],
    world: int,
    step: int,
    edge_blocks: int | None = None,
) -> tuple[KeyedJaggedTensor, list[KeyedJaggedTensor]]:
    """The global batch and each rank's slice of it (rank r has batches[r] samples); ids
    favour the row-block boundaries of up to ``edge_blocks`` (default ``world``) blocks."""
    generator = torch.Generator().manual_seed(SEED + step)
    total = sum(batches)
    keys, per_key = [], []
    for table in tables:
        for name in table.feature_names:
            lengths = torch.randint(0, 5, (total,), generator=generator)  # empty bags included
            ids = _ids(table, int(lengths.sum()), edge_blocks or world, generator)
            weights = torch.rand(ids.numel(), generator=generator) + 0.5
            keys.append(name)
            per_key.append((lengths, ids, weights))

    def build(start: int, end: int) -> KeyedJaggedTensor:
        lengths, values, weights = [], [], []
        for key_lengths, ids, w in per_key:
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64), key_lengths.cumsum(0)])
            lengths.append(key_lengths[start:end])
            values.append(ids[offsets[start] : offsets[end]])
            weights.append(w[offsets[start] : offsets[end]])
        return KeyedJaggedTensor.from_lengths_sync(
            keys, torch.cat(values), torch.cat(lengths), torch.cat(weights)
        )

    bounds = [0]
    for b in batches:
        bounds.append(bounds[-1] + b)
    return build(0, total), [build(bounds[r], bounds[r + 1]) for r in range(world)]


# --------------------------------------------------------------------------- reference


def configs_of(module: EmbeddingBagCollection | EmbeddingCollection) -> list[Any]:
    if isinstance(module, EmbeddingBagCollection):
        return list(module.embedding_bag_configs())
    return list(module.embedding_configs())


def column_blocks(plan: ModulePlan, table: BaseEmbeddingConfig) -> list[tuple[int, int]]:
    """The column ranges an optimizer row spans: the column shards for column-split tables
    (FBGEMM keeps row-wise state per shard), else the whole row."""
    sharding = plan.tables[table.name]
    if sharding.sharding_type in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
        return sorted({(s.offsets[1], s.offsets[1] + s.sizes[1]) for s in sharding.shards})
    return [(0, table.embedding_dim)]


class ReferenceOptimizer:
    """SGD, FBGEMM's exact row-wise Adagrad and FBGEMM's Adam written out in torch, on dense
    gradients. Like every fused TBE optimizer, Adam updates only the rows the step looked up
    (its moments decay only there)."""

    def __init__(
        self,
        name: str,
        module: EmbeddingBagCollection | EmbeddingCollection,
        plan: ModulePlan,
    ) -> None:
        self.name = name
        self.module = module
        self.tables = configs_of(module)
        self.blocks = {t.name: column_blocks(plan, t) for t in self.tables}
        self.state = {
            t.name: torch.zeros(t.num_embeddings, len(self.blocks[t.name])) for t in self.tables
        }
        self.moments = {
            t.name: (torch.zeros(t.num_embeddings, t.embedding_dim),) * 2 for t in self.tables
        }
        self.steps = 0

    @torch.no_grad()
    def step(self, batch: KeyedJaggedTensor) -> None:
        self.steps += 1
        ids = batch.to_dict()
        for table in self.tables:
            name = table.name
            weight = self.module.table_weight(name)
            grad = weight.grad
            if grad is None:
                continue
            if self.name == "sgd":
                weight -= LEARNING_RATE * grad
            elif self.name == "adam":
                rows = torch.unique(torch.cat([ids[f].values() for f in table.feature_names]))
                m, v = (x.clone() for x in self.moments[name])
                g = grad[rows]
                m[rows] = ADAM_BETAS[0] * m[rows] + (1 - ADAM_BETAS[0]) * g
                v[rows] = ADAM_BETAS[1] * v[rows] + (1 - ADAM_BETAS[1]) * g * g
                self.moments[name] = (m, v)
                m_hat = m[rows] / (1 - ADAM_BETAS[0] ** self.steps)
                v_hat = v[rows] / (1 - ADAM_BETAS[1] ** self.steps)
                update = m_hat / (v_hat.sqrt() + ADAM_EPS) + WEIGHT_DECAY * weight[rows]
                weight[rows] -= LEARNING_RATE * update
            else:
                for b, (c0, c1) in enumerate(self.blocks[name]):
                    g = grad[:, c0:c1]
                    self.state[name][:, b] += (g * g).mean(dim=1)
                    scale = LEARNING_RATE / (self.state[name][:, b].sqrt() + EPS)
                    weight[:, c0:c1] -= scale.unsqueeze(1) * g
            weight.grad = None


def _targets(total: int, width: int, step: int) -> torch.Tensor:
    return torch.randn(total, width, generator=torch.Generator().manual_seed(SEED * 7 + step))


def fused_params(optimizer: str) -> dict[str, object]:
    """The sharded module's optimizer, as ReferenceOptimizer runs it."""
    return {
        "optimizer": optimizer,
        "learning_rate": LEARNING_RATE,
        "eps": ADAM_EPS if optimizer == "adam" else EPS,
        **({"weight_decay": WEIGHT_DECAY} if optimizer == "adam" else {}),
    }


def check_scenario(
    rank: int,
    world: int,
    scenario: Scenario,
    optimizer: str,
    pg: ProcessGroup | None = None,
    batches: list[int] | None = None,
) -> tuple[ShardedEmbeddingBagCollection, ReferenceOptimizer]:
    """Train both modules ``STEPS`` steps, checking outputs each step and the local shards
    at the end; the trained sharded module and the reference's optimizer, for more checks."""
    batches = batches or [3 + r for r in range(world)]
    start = sum(batches[:rank])
    rows = slice(start, start + batches[rank])
    reference = EmbeddingBagCollection(scenario.tables, seed=SEED)
    sharded = shard_modules(
        reference, plan=scenario.plan, pg=pg, fused_params=fused_params(optimizer)
    )
    ref_opt = ReferenceOptimizer(optimizer, reference, scenario.plan)
    width = sum(t.embedding_dim * len(t.feature_names) for t in scenario.tables)
    for step in range(STEPS):
        whole, parts = global_batch(scenario.tables, batches, world, step)
        target = _targets(sum(batches), width, step)
        expected = reference(whole)
        got = sharded(parts[rank])
        assert got.keys() == expected.keys(), (scenario.name, got.keys(), expected.keys())
        assert got.values().shape == expected.values()[rows].shape, (scenario.name, rank)
        gap = (got.values() - expected.values()[rows]).abs()
        diff = gap.max().item() if gap.numel() else 0.0
        assert diff <= ATOL, (
            f"{scenario.name}/{optimizer} rank {rank} step {step}: output off by {diff}"
        )
        (expected.values() * target).sum().backward()
        ref_opt.step(whole)
        (got.values() * target[rows]).sum().backward()
    state = sharded.state_dict()
    for table in scenario.tables:
        full = reference.embedding_bags[table.name].weight.detach()
        for (r0, c0), shard in state[f"embedding_bags.{table.name}.weight"].local_shards:
            want = full[r0 : r0 + shard.shape[0], c0 : c0 + shard.shape[1]]
            diff = (shard - want).abs().max().item() if shard.numel() else 0.0
            assert diff <= ATOL, (
                f"{scenario.name}/{optimizer} rank {rank}: table {table.name} shard at "
                f"{(r0, c0)} off by {diff} after {STEPS} steps"
            )
    return sharded, ref_opt


def equivalence(rank: int, world: int, optimizer: str, names: list[str] | None = None) -> None:
    for scenario in scenarios(world):
        if names is None or scenario.name in names:
            check_scenario(rank, world, scenario, optimizer)


def attribute_named(world: int) -> Scenario:
    """Tables named like attributes of ``nn.Module`` and ``nn.ModuleDict`` (methods, a flag,
    the child registry), which the planner accepts, under every sharding type, with mean
    pooling and a weighted table among them."""
    last = world - 1
    builders: dict[str, Callable[..., ParameterSharding]] = {
        "items": table_wise(last),
        "keys": column_wise([0, last]),
        "values": row_wise(),
        "train": table_row_wise(0),
        "forward": table_column_wise(0),
        "weight": data_parallel(),
        "to": table_wise(0),
        "training": row_wise(),
        "_modules": data_parallel(),
        "__dict__": table_wise(last),
    }
    tables = [
        EmbeddingBagConfig(
            name,
            7 + 3 * i,
            8,
            pooling=PoolingType.MEAN if i % 3 == 1 else PoolingType.SUM,
            is_weighted=name == "values",
        )
        for i, name in enumerate(builders)
    ]
    plan = construct_module_plan(tables, builders, world_size=world)
    return Scenario("attribute_named", tables, plan)


def attribute_names(rank: int, world: int) -> None:
    """Tables named like module attributes shard, train and round-trip their state."""
    scenario = attribute_named(world)
    check_scenario(rank, world, scenario, "sgd")
    check_state_round_trip(rank, world, scenario)


def host_patterns(world: int) -> list[Scenario]:
    """Hosts of two ranks; table-row-wise tables on one host, on some, on all and on none,
    beside table-wise, row-wise, column-wise (ranks 2 and 3) and data-parallel tables. The
    host-local exchange needs subgroups of hosts and of local indices whichever hosts hold
    such tables, so every rank must create the same ones."""
    local, hosts = 2, world // 2
    patterns = {
        "one host": [0],
        "some hosts": list(range(1, hosts)),
        "all hosts": list(range(hosts)),
        "no host": [],
    }
    result = []
    for name, on in patterns.items():
        builders: dict[str, Callable[..., ParameterSharding]] = {
            "tw": table_wise(0),
            "rw": row_wise(),
            "cw": column_wise([2, 3]),
            "dp": data_parallel(),
        }
        builders |= {f"twrw_h{h}": table_row_wise(h) for h in on}
        shapes = {"tw": (7, 4), "rw": (11, 4), "cw": (6, 8), "dp": (3, 4)}
        shapes |= {f"twrw_h{h}": (9 + h, 4) for h in on}
        tables = [EmbeddingBagConfig(t, rows, dim) for t, (rows, dim) in shapes.items()]
        plan = construct_module_plan(tables, builders, world_size=world, local_world_size=local)
        result.append(Scenario(name, tables, plan))
    return result


def table_row_wise_on_hosts(rank: int, world: int) -> None:
    """Every host pattern matches the unsharded module, outputs and training steps. Each
    runs on a fresh process group over all ranks, so its subgroups are created afresh."""
    for scenario in host_patterns(world):
        pg = dist.new_group(list(range(world)), timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        check_scenario(rank, world, scenario, "sgd", pg)


def subgroup_deadline(rank: int, world: int) -> None:
    """Ranks 2 and 3 skip the host subgroups (as a rank sharding another plan would), so
    their count of process groups, which torch names subgroups by, falls behind: creating
    the cross-host subgroups fails on every rank, naming its members, instead of hanging."""
    assert world == 4
    group = Group(dist.group.WORLD, timeout=timedelta(seconds=2))
    if rank < 2:
        group.subgroup_of([[0, 1], [2, 3]])
    members = [rank % 2, rank % 2 + 2]
    try:
        group.subgroup_of([[0, 2], [1, 3]])
    except SubgroupTimeoutError as error:
        assert f"rank {rank} waited 2 s for ranks {members}" in str(error), str(error)
    else:
        raise AssertionError(f"rank {rank} created subgroup {members} its peer names otherwise")


def exchange_layout(rank: int, world: int) -> None:
    """World size 4 as two hosts of two: table-row-wise sums are reduce-scattered inside the
    host and then cross hosts among the ranks with one local index; row-wise sums are
    reduce-scattered over all ranks."""
    assert world == 4
    by_name = {s.name: s for s in scenarios(world)}
    host = [0, 1] if rank < 2 else [2, 3]
    cross = [rank % 2, rank % 2 + 2]
    everyone = [0, 1, 2, 3]
    expected = {
        "table_wise": [("all_to_all", everyone)],
        "row_wise": [("all_to_all", everyone), ("reduce_scatter", everyone)],
        # twrw_tiny on host 0 and twrw on host 1: both hosts reduce
        "table_row_wise": [
            ("all_to_all", everyone),
            ("reduce_scatter", host),
            ("all_to_all", cross),
        ],
        "mixed": [
            ("all_to_all", everyone),
            ("reduce_scatter", everyone),
            ("reduce_scatter", host),
            ("all_to_all", cross),
        ],
    }
    for name, steps in expected.items():
        scenario = by_name[name]
        module = EmbeddingBagCollection(scenario.tables, device="meta")
        sharded = shard_modules(module, plan=scenario.plan, device="cpu")
        assert sharded.output_exchanges() == steps, (name, rank, sharded.output_exchanges())


def state_round_trip(rank: int, world: int) -> None:
    """state_dict offsets, load of a full state, and gathering the full tables back."""
    check_state_round_trip(rank, world, next(s for s in scenarios(world) if s.name == "mixed"))


def check_state_round_trip(rank: int, world: int, scenario: Scenario) -> None:
    meta = EmbeddingBagCollection(scenario.tables, device="meta")
    sharded = shard_modules(meta, plan=scenario.plan)
    source = EmbeddingBagCollection(scenario.tables, seed=99)
    full = {k: v.detach().clone() for k, v in source.state_dict().items()}
    sharded.load_state_dict(full)
    gathered = sharded.gather_state_dict()
    assert list(gathered) == list(full) == list(sharded.state_dict())
    for key, value in full.items():
        assert torch.equal(gathered[key], value), key
    for table in scenario.tables:
        sharding = scenario.plan.tables[table.name]
        mine = sorted(
            tuple(s.offsets)
            for s in sharding.shards
            if s.rank == rank and s.sizes[0] and s.sizes[1]
        )
        held = sharded.state_dict()[f"embedding_bags.{table.name}.weight"]
        assert held.size == (table.num_embeddings, table.embedding_dim)
        assert sorted(offset for offset, _ in held.local_shards) == mine, table.name
    # The sharded module computes what the module it was loaded from computes.
    whole, parts = global_batch(scenario.tables, [4] * world, world, 0)
    got = sharded(parts[rank]).values()
    want = source(whole).values()[4 * rank : 4 * rank + 4]
    assert (got - want).abs().max().item() <= ATOL


def plan_mismatch(rank: int, world: int) -> None:
    """A plan for another world size fails on every rank before any collective."""
    tables = [EmbeddingBagConfig("t", 10, 8)]
    plan = construct_module_plan(tables, {"t": table_wise(0)}, world_size=world + 1)
    try:
        shard_modules(EmbeddingBagCollection(tables, device="meta"), plan=plan)
    except ValueError as error:
        assert f"world_size {world + 1}" in str(error) and f"{world} ranks" in str(error)
    else:
        raise AssertionError("a plan for the wrong world size was accepted")


def plan_mismatch_expecting_success(rank: int, world: int) -> None:
    """Shards with a plan for the wrong world size, unguarded: the harness must report it."""
    tables = [EmbeddingBagConfig("t", 10, 8)]
    plan = construct_module_plan(tables, {"t": table_wise(0)}, world_size=world + 1)
    shard_modules(EmbeddingBagCollection(tables, device="meta"), plan=plan)


def fetch_and_check(rank: int, world: int, url: str, request_json: str) -> None:
    """A training worker at startup: fetch the plan over HTTP, shard, and compute what the
    unsharded module computes for this rank's samples."""
    import httpx

    from planner_service.plan.codec import parse_request

    response = httpx.get(url, timeout=30)
    response.raise_for_status()
    request = parse_request(request_json)
    tables = [EmbeddingBagConfig.from_table(t) for t in request.tables]
    reference = EmbeddingBagCollection(tables, seed=SEED)
    sharded = shard_modules(reference, plan=response.content)
    assert sharded.plan_id == response.headers["X-Shardplan-Plan-Id"]
    whole, parts = global_batch(tables, [5] * world, world, 0)
    got = sharded(parts[rank]).values()
    want = reference(whole).values()[5 * rank : 5 * rank + 5]
    assert (got - want).abs().max().item() <= ATOL
