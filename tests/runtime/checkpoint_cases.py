"""Checkpoints and resharding across plans, run on every rank of a gloo group.

A case trains a module under an old plan for three steps, then carries its state to a new
plan (another world size and other sharding types) — through a checkpoint on disk, or in
place — and checks on the new plan: every table, gathered, identical to the old one's;
per-element optimizer state (Adagrad, Adam's moments) identical; row-wise Adagrad state
equal to the width-weighted mean of the old accumulators over each new shard's columns;
Adam's step count carried. Then both sides train two more steps on the same global
batches: the new plan's tables must match the old plan's continuation (for row-wise Adagrad
only where neither plan splits columns, since the accumulator belongs to a shard's columns).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from planner_service.plan.codec import parse_request
from planner_service.plan.transfers import Element, boxes, table_transfers
from planner_service.plan.types import ShardingType
from runtime import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
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
from runtime.checkpoint import MANIFEST, CheckpointError, load_checkpoint, save_checkpoint
from runtime.comm import Group
from runtime.reshard import Resharded, reshard
from runtime.sharding.module import ShardedTables
from tests.runtime.cases import SEED, _targets, fused_params, global_batch

OPTIMIZERS = ("sgd", "rowwise_adagrad", "adagrad", "adam")
STEPS_BEFORE = 3
STEPS_AFTER = 2
TOTAL_BATCH = 12  # samples per global batch, split over the ranks of either world
EDGE_BLOCKS = 4  # ids favour row-block edges of up to 4 blocks in both worlds
ATOL = 1e-5


def tables(sequence: bool = False) -> list[Any]:
    config = EmbeddingConfig if sequence else EmbeddingBagConfig
    shapes = [("t0", 40, 16), ("t1", 13, 8), ("t2", 7, 12), ("t3", 25, 16)]
    return [config(name, rows, dim, [f"f_{name}"]) for name, rows, dim in shapes]


PLANS: dict[str, Callable[[int], dict[str, Any]]] = {
    "table_wise": lambda w: {f"t{i}": table_wise(rank=(i + 1) % w) for i in range(4)},
    "row_wise": lambda w: {f"t{i}": row_wise() for i in range(4)},
    "column_wise": lambda w: {
        "t0": column_wise([0, 1, 0]),
        "t1": column_wise([1, 0]),
        "t2": column_wise([w - 1, 0], widths=[8, 4]),
        "t3": column_wise([w - 1, 0, 1, w - 1]),
    },
    "data_parallel": lambda w: {f"t{i}": data_parallel() for i in range(4)},
    "mixed": lambda w: {
        "t0": table_row_wise(host=1) if w == 4 else column_wise([1, 0]),
        "t1": column_wise([w - 1, 1]),
        "t2": data_parallel() if w != 3 else table_wise(rank=2),
        "t3": table_column_wise(host=0) if w == 4 else row_wise(),
    },
}


def module_plan(name: str, world: int, sequence: bool = False) -> ModulePlan:
    local = 2 if world == 4 else world
    return construct_module_plan(
        tables(sequence), PLANS[name](world), world_size=world, local_world_size=local
    )


def batches_of(world: int) -> list[int]:
    base, extra = divmod(TOTAL_BATCH, world)
    return [base + (r < extra) for r in range(world)]


def column_split(plan: ModulePlan) -> bool:
    return any(s.sharding_type.value.endswith("column_wise") for s in plan.tables.values())


# --------------------------------------------------------------------------- training


def build(plan: ModulePlan, optimizer: str, sequence: bool, meta: bool) -> ShardedTables:
    collection = EmbeddingCollection if sequence else EmbeddingBagCollection
    unsharded = collection(tables(sequence), device="meta" if meta else None, seed=SEED)
    sharded = shard_modules(unsharded, plan=plan, fused_params=fused_params(optimizer))
    assert isinstance(sharded, ShardedTables)
    return sharded


def train(module: ShardedTables, rank: int, world: int, steps: range, sequence: bool) -> None:
    batches = batches_of(world)
    start = sum(batches[:rank])
    rows = slice(start, start + batches[rank])
    configs = tables(sequence)
    for step in steps:
        _, parts = global_batch(configs, batches, world, step, edge_blocks=EDGE_BLOCKS)
        out = module(parts[rank])
        if sequence:
            loss = sum((jt.values() * (i + 1)).sum() for i, jt in enumerate(out.values()))
        else:
            width = sum(t.embedding_dim for t in configs)
            loss = (out.values() * _targets(TOTAL_BATCH, width, step)[rows]).sum()
        loss.backward()


def gather(module: ShardedTables) -> dict[str, torch.Tensor]:
    """Every table's weight, per-element state and row-wise state (spread over the columns
    each accumulator covers), assembled from all ranks; and the optimizer step."""
    mine = []
    for s in module.shard_states():
        rowwise = None if s.rowwise is None else s.rowwise.clone()
        mine.append(
            (s.table.name, s.region, s.weight.clone(), [e.clone() for e in s.elementwise], rowwise)
        )
    full: dict[str, torch.Tensor] = {}
    for t in module.tables:
        full[t.name] = torch.full((t.num_embeddings, t.embedding_dim), float("nan"))
    for shards in Group(module.group.pg).all_gather_object(mine):
        for name, (r0, c0, rows, cols), weight, elementwise, rowwise in shards:
            at = (slice(r0, r0 + rows), slice(c0, c0 + cols))
            full[name][at] = weight.float()
            for i, state in enumerate(elementwise):
                full.setdefault(f"{name}.momentum{i + 1}", torch.zeros_like(full[name]))[at] = state
            if rowwise is not None:
                key = f"{name}.rowwise"
                full.setdefault(key, torch.zeros_like(full[name]))[at] = rowwise.unsqueeze(1)
    steps = Group(module.group.pg).all_gather_object(module.optimizer_step)
    full["step"] = torch.tensor(max(steps))
    return full


def check_carried(
    before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], new: ShardedTables, what: str
) -> None:
    """``after`` (gathered on the new plan) holds ``before`` (gathered on the old one)."""
    for key, want in before.items():
        if key.endswith(".rowwise"):
            continue
        assert key in after, f"{what}: {key} missing after the move"
        assert torch.equal(after[key], want), f"{what}: {key} differs after the move"
    for s in new.shard_states():
        if s.rowwise is None:
            continue
        r0, c0, rows, cols = s.region
        old = before[f"{s.table.name}.rowwise"][r0 : r0 + rows, c0 : c0 + cols]
        want = old.double().mean(dim=1).float()
        gap = (s.rowwise - want).abs().max().item() if rows else 0.0
        assert gap <= 1e-6 * max(1.0, want.abs().max().item()), (
            f"{what}: row-wise state of {s.table.name} at {(r0, c0)} off by {gap}"
        )


def check_continued(
    before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], what: str
) -> None:
    for key, want in before.items():
        if key == "step" or "." in key:
            continue
        gap = (after[key] - want).abs().max().item()
        assert gap <= ATOL, f"{what}: table {key} off by {gap} after training on"


# --------------------------------------------------------------------------- phases


def old_side(rank: int, world: int, old: str, directory: str, sequence: bool) -> None:
    """Train under the old plan, save a checkpoint per optimizer, record what was saved and
    what two more steps make of it."""
    plan = module_plan(old, world, sequence)
    for optimizer in OPTIMIZERS:
        module = build(plan, optimizer, sequence, meta=False)
        train(module, rank, world, range(STEPS_BEFORE), sequence)
        saved = gather(module)
        save_checkpoint(module, Path(directory) / optimizer)
        train(module, rank, world, range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER), sequence)
        continued = gather(module)
        if rank == 0:
            torch.save(
                {"saved": saved, "continued": continued, "split": column_split(plan)},
                Path(directory) / f"{optimizer}.expected.pt",
            )


def new_side(rank: int, world: int, new: str, directory: str, sequence: bool) -> None:
    """Load each checkpoint under the new plan into a module whose own weights differ;
    check what arrived, train on, check the continuation."""
    plan = module_plan(new, world, sequence)
    for optimizer in OPTIMIZERS:
        expected = torch.load(Path(directory) / f"{optimizer}.expected.pt")
        module = build(plan, optimizer, sequence, meta=True)
        manifest = load_checkpoint(module, Path(directory) / optimizer)
        assert manifest.optimizer == optimizer
        what = f"{optimizer} -> {new}@{world}"
        check_carried(expected["saved"], gather(module), module, what)
        train(module, rank, world, range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER), sequence)
        exact = optimizer != "rowwise_adagrad" or not (expected["split"] or column_split(plan))
        if exact:
            check_continued(expected["continued"], gather(module), what)


class Model(nn.Module):
    """A model with a pooled and a sequence collection and a dense layer."""

    def __init__(self, meta: bool) -> None:
        super().__init__()
        device = "meta" if meta else None
        pooled = [EmbeddingBagConfig(f"p{i}", 11 + i, 8, [f"fp{i}"]) for i in range(2)]
        sequence = [EmbeddingConfig(f"s{i}", 9 + i, 4, [f"fs{i}"]) for i in range(2)]
        self.sparse = nn.ModuleDict(
            {
                "pooled": EmbeddingBagCollection(pooled, device=device, seed=SEED),
                "sequence": EmbeddingCollection(sequence, device=device, seed=SEED),
            }
        )
        self.dense = nn.Linear(4, 2)


def model_round_trip(rank: int, world: int, directory: str, save: bool) -> None:
    """A model's collections and dense layer saved under one plan, loaded under another."""
    names = ["p0", "p1", "s0", "s1"]
    if save:
        kinds = [table_wise(rank=0), row_wise(), column_wise([1, 0]), data_parallel()]
    else:
        kinds = [row_wise(), table_wise(rank=world - 1), table_wise(rank=0), row_wise()]
    model = Model(meta=not save)
    configs = [*model.sparse["pooled"].embedding_bag_configs()]
    configs += [*model.sparse["sequence"].embedding_configs()]
    plan = construct_module_plan(configs, dict(zip(names, kinds, strict=True)), world_size=world)
    if save:
        torch.manual_seed(7)
        model.dense.reset_parameters()
    sharded = shard_modules(model, plan=plan, fused_params=fused_params("rowwise_adagrad"))
    gathered = {
        name: part.gather_state_dict()
        for name, part in sharded.named_modules()
        if isinstance(part, ShardedTables)
    }
    expected_file = Path(directory) / "model.expected.pt"
    if save:
        save_checkpoint(sharded, Path(directory) / "model")
        if rank == 0:
            torch.save({"tables": gathered, "dense": sharded.dense.state_dict()}, expected_file)
        return
    load_checkpoint(sharded, Path(directory) / "model")
    expected = torch.load(expected_file)
    for name, part in sharded.named_modules():
        if isinstance(part, ShardedTables):
            for key, want in expected["tables"][name].items():
                assert torch.equal(part.gather_state_dict()[key], want), (name, key)
    for key, want in expected["dense"].items():
        assert torch.equal(sharded.dense.state_dict()[key], want), key


def refusals(rank: int, world: int, directory: str) -> None:
    """What cannot be loaded is refused before anything is read, naming what differs."""
    plan = module_plan("table_wise", world)
    module = build(plan, "adagrad", sequence=False, meta=False)
    path = Path(directory) / "refusals"
    save_checkpoint(module, path)
    other = build(plan, "sgd", sequence=False, meta=True)
    _refused(lambda: load_checkpoint(other, path), "holds adagrad optimizer state")
    load_checkpoint(other, path, optimizer_state=False)  # weights only
    assert torch.equal(
        other.gather_state_dict()["embedding_bags.t0.weight"],
        module.gather_state_dict()["embedding_bags.t0.weight"],
    )
    resized = _table_wise(world, [(t.name, t.num_embeddings + (t.name == "t2")) for t in tables()])
    _refused(
        lambda: load_checkpoint(resized, path), "table 't2' is 8 x 12 in the module and 7 x 12"
    )
    unknown = _table_wise(world, [("u" + t.name, t.num_embeddings) for t in tables()])
    _refused(
        lambda: load_checkpoint(unknown, path), "table 'ut0' (embedding_bags.ut0.weight) is not in"
    )
    Group(module.group.pg).all_gather_object(None)
    if rank == 0:
        (path / MANIFEST).unlink()
    Group(module.group.pg).all_gather_object(None)
    _refused(lambda: load_checkpoint(module, path), f"has no {MANIFEST}")


def _table_wise(world: int, names_rows: list[tuple[str, int]]) -> nn.Module:
    """``tables()`` renamed or resized, table-wise, trained with adagrad."""
    configs = [
        EmbeddingBagConfig(name, rows, t.embedding_dim, [f"f_{name}"])
        for (name, rows), t in zip(names_rows, tables(), strict=True)
    ]
    plan = construct_module_plan(
        configs,
        {c.name: table_wise(rank=i % world) for i, c in enumerate(configs)},
        world_size=world,
    )
    module = EmbeddingBagCollection(configs, device="meta")
    return shard_modules(module, plan=plan, fused_params=fused_params("adagrad"))


def _refused(call: Callable[[], object], message: str) -> None:
    try:
        call()
    except CheckpointError as error:
        assert message in str(error), str(error)
    else:
        raise AssertionError(f"not refused: expected {message!r}")


# --------------------------------------------------------------------------- in place


def in_place(rank: int, world: int, old: str, new: str, sequence: bool) -> None:
    """Reshard a trained module to another plan on the same ranks: the state arrives as a
    checkpoint would carry it, every rank sends and receives exactly the transfers of
    ``table_transfers`` (the regions ``shardplan migrate`` prints), and training goes on as
    under the old plan."""
    before_plan, after_plan = module_plan(old, world, sequence), module_plan(new, world, sequence)
    for optimizer in OPTIMIZERS:
        module = build(before_plan, optimizer, sequence, meta=False)
        train(module, rank, world, range(STEPS_BEFORE), sequence)
        saved = gather(module)
        moved = reshard(module, plan=after_plan)
        assert isinstance(moved.module, ShardedTables)
        what = f"{optimizer}: {old} -> {new} in place"
        check_carried(saved, gather(moved.module), moved.module, what)
        check_bytes(rank, module, after_plan, moved, what)
        later = range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER)
        train(module, rank, world, later, sequence)
        train(moved.module, rank, world, later, sequence)
        split = column_split(before_plan) or column_split(after_plan)
        if optimizer != "rowwise_adagrad" or not split:
            check_continued(gather(module), gather(moved.module), what)


def check_bytes(
    rank: int, old: ShardedTables, plan: ModulePlan, moved: Resharded, what: str
) -> None:
    """Sent and received bytes per peer are the planner's transfers; what one rank sent
    another received; and the weights moved are the elements of each new shard that its
    rank did not hold, counted from the shapes alone."""
    sent: dict[int, int] = {}
    received: dict[int, int] = {}
    elements = 0
    for table in old.tables:
        was, now = old.plan.tables[table.name], plan.tables[table.name]
        element = Element(table.data_type.size_bytes, old.optimizer)
        replicated = was.sharding_type is ShardingType.DATA_PARALLEL
        for t in table_transfers(
            table.name, boxes(was), boxes(now), old_replicated=replicated, element=element
        ):
            if t.src == rank:
                sent[t.dst] = sent.get(t.dst, 0) + t.bytes
            if t.dst == rank:
                received[t.src] = received.get(t.src, 0) + t.bytes
        for shard in now.shards:
            if shard.rank != rank:
                continue
            held = [s for s in was.shards if s.rank == rank]
            area = shard.sizes[0] * shard.sizes[1]
            kept = sum(_overlap_area(shard, s) for s in held)
            elements += area - kept
    assert {r: b for r, b in moved.sent.items() if b} == sent, (what, moved.sent, sent)
    assert moved.received == received, (what, moved.received, received)
    element_bytes = 4 + 4 * _elementwise_count(old.optimizer.value)
    rowwise = sum(received.values()) - elements * element_bytes
    if old.optimizer.value == "rowwise_adagrad":
        assert rowwise >= 0 and rowwise % 4 == 0, (what, rowwise)
    else:
        assert rowwise == 0, (what, sum(received.values()), elements, element_bytes)
    matrix = Group(old.group.pg).all_gather_object((moved.sent, moved.received))
    for src, (out, _) in enumerate(matrix):
        for dst, count in out.items():
            assert matrix[dst][1].get(src, 0) == count, (what, src, dst, count)


def _elementwise_count(optimizer: str) -> int:
    return {"sgd": 0, "rowwise_adagrad": 0, "adagrad": 1, "adam": 2}[optimizer]


def _overlap_area(a: Any, b: Any) -> int:
    rows = min(a.offsets[0] + a.sizes[0], b.offsets[0] + b.sizes[0]) - max(
        a.offsets[0], b.offsets[0]
    )
    cols = min(a.offsets[1] + a.sizes[1], b.offsets[1] + b.sizes[1]) - max(
        a.offsets[1], b.offsets[1]
    )
    return max(rows, 0) * max(cols, 0)


def model_in_place(rank: int, world: int) -> None:
    """A model's collections resharded in place: each replaced by its new form, tables
    carried, the plan's unknown tables refused first."""
    model = Model(meta=False)
    configs = [*model.sparse["pooled"].embedding_bag_configs()]
    configs += [*model.sparse["sequence"].embedding_configs()]
    names = ["p0", "p1", "s0", "s1"]
    before = [table_wise(rank=0), row_wise(), column_wise([1, 0]), data_parallel()]
    after = [row_wise(), table_wise(rank=world - 1), table_wise(rank=0), row_wise()]
    plan = construct_module_plan(configs, dict(zip(names, before, strict=True)), world_size=world)
    new_plan = construct_module_plan(
        configs, dict(zip(names, after, strict=True)), world_size=world
    )
    sharded = shard_modules(model, plan=plan, fused_params=fused_params("adagrad"))
    parts = {n: m for n, m in sharded.named_modules() if isinstance(m, ShardedTables)}
    want = {n: m.gather_state_dict() for n, m in parts.items()}
    stray = EmbeddingBagConfig("stray", 4, 4, ["f_stray"])
    wrong = construct_module_plan(
        [*configs, stray], {"stray": table_wise(rank=0)}, world_size=world
    )
    try:
        reshard(sharded, plan=ModulePlan(world, {**new_plan.tables, **wrong.tables}))
    except ValueError as error:
        assert "['stray'] that no collection in the model has" in str(error), str(error)
    else:
        raise AssertionError("a plan with a table the model lacks was not refused")
    moved = reshard(sharded, plan=new_plan)
    assert moved.module is sharded
    for name, part in sharded.named_modules():
        if isinstance(part, ShardedTables):
            assert part is not parts[name] and part.plan.tables == {
                n: s for n, s in new_plan.tables.items() if n in {t.name for t in part.tables}
            }
            for key, value in part.gather_state_dict().items():
                assert torch.equal(value, want[name][key]), (name, key)


def as_migrate_prints(
    rank: int, world: int, old: str, new: str, request: str, printed: str
) -> None:
    """Sealed plans as training jobs get them (JSON bytes): ``reshard`` sends and receives,
    peer by peer, the bytes ``shardplan migrate --format json`` printed for them."""
    configs = [
        EmbeddingBagConfig.from_table(t) for t in parse_request(Path(request).read_bytes()).tables
    ]
    fused = fused_params("rowwise_adagrad")
    module = shard_modules(
        EmbeddingBagCollection(configs, seed=SEED), plan=Path(old).read_bytes(), fused_params=fused
    )
    want = module.gather_state_dict()
    moved = reshard(module, plan=Path(new).read_bytes())
    document = json.loads(Path(printed).read_text())
    sent = {p["dst"]: p["bytes"] for p in document["pairs"] if p["src"] == rank}
    received = {p["src"]: p["bytes"] for p in document["pairs"] if p["dst"] == rank}
    assert {r: b for r, b in moved.sent.items() if b} == sent, (moved.sent, sent)
    assert moved.received == received, (moved.received, received)
    assert isinstance(moved.module, ShardedTables)
    assert moved.module.plan_id == document["new"]["plan_id"]
    got = moved.module.gather_state_dict()
    for key, value in want.items():
        assert torch.equal(got[key], value), key
