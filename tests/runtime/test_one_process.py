"""The runtime on one process: sparse containers, the unsharded module, plan checks and the
sharded module on a single rank (no process group), all with real FBGEMM kernels."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections.abc import Callable

import pytest
import torch

from planner_service.plan.canonical import plan_id_of
from planner_service.plan.codec import parse_plan, plan_bytes
from planner_service.plan.shards import row_wise_shards
from planner_service.plan.types import (
    ParameterSharding,
    PlanRequest,
    PoolingType,
    ShardingPlan,
    ShardingType,
    Table,
)
from planner_service.solve.pipeline import solve
from runtime import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
    KeyedTensor,
    ModulePlan,
    PlanMismatchError,
    ShardedEmbeddingBagCollection,
    ShardedEmbeddingCollection,
    check_plan,
    column_wise,
    construct_module_plan,
    data_parallel,
    row_wise,
    shard_modules,
    table_wise,
)
from runtime.modules import config_of
from runtime.sharding.layout import build_layouts, subgroup_families
from tests.runtime import cases as runtime_cases

# --------------------------------------------------------------------------- sparse


def _kjt(weights: bool = False) -> KeyedJaggedTensor:
    # keys a, b; batch 3: a = [1, 2], [], [3]; b = [4], [5, 6], [7]
    return KeyedJaggedTensor.from_lengths_sync(
        ["a", "b"],
        torch.tensor([1, 2, 3, 4, 5, 6, 7]),
        torch.tensor([2, 0, 1, 1, 2, 1]),
        torch.arange(7, dtype=torch.float32) if weights else None,
    )


def test_kjt_accessors_follow_torchrec_layout():
    kjt = _kjt(weights=True)
    assert kjt.keys() == ["a", "b"] and kjt.stride() == 3
    assert kjt.offsets().tolist() == [0, 2, 2, 3, 4, 6, 7]
    assert kjt.length_per_key() == [3, 4] and kjt.offset_per_key() == [0, 3, 7]
    b = kjt.to_dict()["b"]
    assert b.values().tolist() == [4, 5, 6, 7] and b.lengths().tolist() == [1, 2, 1]
    assert b.weights().tolist() == [3.0, 4.0, 5.0, 6.0]
    assert [t.tolist() for t in kjt["a"].to_dense()] == [[1, 2], [], [3]]


def test_kjt_split_and_permute():
    first, second = _kjt(weights=True).split([1, 1])
    assert first.keys() == ["a"] and first.values().tolist() == [1, 2, 3]
    assert second.lengths().tolist() == [1, 2, 1] and second.weights().tolist() == [3, 4, 5, 6]
    swapped = _kjt().permute([1, 0])
    assert swapped.keys() == ["b", "a"]
    assert swapped.values().tolist() == [4, 5, 6, 7, 1, 2, 3]
    assert swapped.lengths().tolist() == [1, 2, 1, 2, 0, 1]
    with pytest.raises(ValueError, match="sum to the 2 keys"):
        _kjt().split([1])


@pytest.mark.parametrize(
    ("values", "lengths", "message"),
    [
        (torch.tensor([1, 2]), torch.tensor([1, 1, 1, 0]), "lengths sum to 3 but there are 2"),
        (torch.tensor([1, 2]), torch.tensor([1, 1, 0]), "3 lengths for 2 keys"),
    ],
)
def test_kjt_rejects_inconsistent_lengths(values, lengths, message):
    with pytest.raises(ValueError, match=message):
        KeyedJaggedTensor.from_lengths_sync(["a", "b"], values, lengths)


def test_keyed_tensor():
    kt = KeyedTensor(["x", "y"], [2, 3], torch.arange(10.0).view(2, 5))
    assert kt.to_dict()["y"].tolist() == [[2, 3, 4], [7, 8, 9]]
    with pytest.raises(ValueError, match="do not match dims"):
        KeyedTensor(["x"], [4], torch.zeros(2, 5))


# --------------------------------------------------------------------------- the module


def test_config_from_the_planner_table():
    table = Table(
        name="t",
        num_embeddings=10,
        embedding_dim=8,
        feature_names=["f", "g"],
        pooling=PoolingType.MEAN,
        is_weighted=True,
    )
    config = EmbeddingBagConfig.from_table(table)
    assert config.feature_names == ["f", "g"] and config.pooling is PoolingType.MEAN
    assert config.is_weighted


def test_unsharded_pooling_sum_mean_weighted_and_empty_bags():
    tables = [
        EmbeddingBagConfig("a", 8, 4),
        EmbeddingBagConfig("b", 8, 4, pooling=PoolingType.MEAN, is_weighted=True),
    ]
    ebc = EmbeddingBagCollection(tables, seed=0)
    wa, wb = ebc.embedding_bags["a"].weight, ebc.embedding_bags["b"].weight
    out = ebc(_kjt(weights=True)).to_dict()
    assert torch.allclose(out["a"][0], wa[1] + wa[2]) and torch.equal(out["a"][1], torch.zeros(4))
    # b's second bag: ids 5 and 6 with weights 4 and 5, mean over 2 ids
    assert torch.allclose(out["b"][1], (4 * wb[5] + 5 * wb[6]) / 2)


def test_meta_device_module_allocates_nothing():
    ebc = EmbeddingBagCollection([EmbeddingBagConfig("huge", 10**9, 128)], device="meta")
    assert ebc.embedding_bags["huge"].weight.device.type == "meta"


# --------------------------------------------------------------------------- table names

ATTRIBUTE_TABLES = runtime_cases.attribute_named(1).tables


def test_tables_named_like_module_attributes_are_held_under_their_names():
    names = [t.name for t in ATTRIBUTE_TABLES]
    keys = [f"embedding_bags.{name}.weight" for name in names]
    ebc = EmbeddingBagCollection(ATTRIBUTE_TABLES, seed=5)
    assert list(ebc.state_dict()) == keys
    assert [key for key, _ in ebc.named_parameters()] == keys
    assert list(ebc.embedding_bags) == names and list(dict(ebc.embedding_bags.items())) == names
    assert "items" in ebc.embedding_bags and ebc.embedding_bags["to"].weight.shape == (25, 8)
    # The same weights (same seed, same shapes) under plain names pool the same.
    plain = [dataclasses.replace(t, name=f"t{i}") for i, t in enumerate(ATTRIBUTE_TABLES)]
    batch, _ = runtime_cases.global_batch(ATTRIBUTE_TABLES, [5], 1, 0)
    expected = EmbeddingBagCollection(plain, seed=5)(batch)
    assert torch.equal(ebc(batch).values(), expected.values())


def test_tables_named_like_module_attributes_load_and_move():
    ebc = EmbeddingBagCollection(ATTRIBUTE_TABLES, seed=5)
    other = EmbeddingBagCollection(ATTRIBUTE_TABLES, seed=6)
    other.load_state_dict(ebc.state_dict())
    for key, value in ebc.state_dict().items():
        assert torch.equal(other.state_dict()[key], value), key
    other.eval()
    assert not any(module.training for module in other.modules())
    other.train()
    assert all(module.training for module in other.modules())
    other.to(torch.float64)
    assert {p.dtype for p in other.parameters()} == {torch.float64}
    assert len(list(other.parameters())) == len(ATTRIBUTE_TABLES)
    meta = EmbeddingBagCollection(ATTRIBUTE_TABLES, device="meta")
    assert meta.embedding_bags["items"].weight.device.type == "meta"


def test_tables_named_like_module_attributes_shard_train_and_round_trip_on_one_rank():
    runtime_cases.attribute_names(0, 1)


@pytest.mark.parametrize("name", ["", ".", "users.v2"])
def test_a_name_the_state_dict_cannot_key_is_refused_naming_the_table(name):
    with pytest.raises(ValueError, match=rf"table {re.escape(repr(name))}: .*'\.'"):
        EmbeddingBagConfig(name, 10, 8)


def test_a_planner_table_with_a_dotted_name_is_refused_on_conversion():
    table = Table(name="users.v2", num_embeddings=10, embedding_dim=8)
    with pytest.raises(ValueError, match=r"table 'users.v2': .*users_v2"):
        EmbeddingBagConfig.from_table(table)


# --------------------------------------------------------------------------- plans


TABLES = [EmbeddingBagConfig("a", 8, 4), EmbeddingBagConfig("b", 12, 8)]


@pytest.mark.parametrize(
    ("per_table", "world", "message"),
    [
        ({"a": table_wise(0)}, 1, r"no sharding for tables \['b'\]"),
        (
            {"a": table_wise(0), "b": table_wise(3)},
            2,
            r"table 'b' \(table_wise\): shard 0 is on rank 3, but ranks are 0..1",
        ),
        (
            {"a": table_wise(0), "b": column_wise([0, 1], widths=[4, 0])},
            2,
            r"table 'b' \(column_wise\): columns 4..8 are not covered",
        ),
        ({"a": table_wise(0), "b": column_wise([0, 1], widths=[6, 2])}, 2, "multiples of 4"),
    ],
)
def test_plan_checks_name_the_table_and_numbers(per_table, world, message):
    plan = construct_module_plan(TABLES, per_table, world_size=world)
    with pytest.raises(PlanMismatchError, match=message):
        check_plan(plan, TABLES, world)


def _row_blocks(kind: ShardingType, table: EmbeddingBagConfig, ranks: list[int]):
    shards = row_wise_shards(table.num_embeddings, table.embedding_dim, ranks)
    return ParameterSharding(sharding_type=kind, compute_kernel="fused", ranks=ranks, shards=shards)


@pytest.mark.parametrize(
    ("a_ranks", "b_ranks", "message"),
    [
        ([1, 2], [0, 1], r"table 'a' \(table_row_wise\).*ranks \[1, 2\].*one host"),
        ([0, 1, 2], [0, 1, 2], "hosts of 3 ranks, which do not divide world_size 4"),
        ([2, 3], [0, 1, 2, 3], "table 'b' .* host of 4 ranks but table 'a' spans 2"),
    ],
)
def test_table_row_wise_must_span_one_host_of_a_common_size(a_ranks, b_ranks, message):
    a, b = TABLES
    kind = ShardingType.TABLE_ROW_WISE
    plan = ModulePlan(4, {"a": _row_blocks(kind, a, a_ranks), "b": _row_blocks(kind, b, b_ranks)})
    with pytest.raises(PlanMismatchError, match=message):
        check_plan(plan, TABLES, 4)


def test_row_wise_must_put_a_block_on_every_rank():
    a, b = TABLES
    plan = ModulePlan(
        3,
        {"a": table_wise(0)(a, 3, 3), "b": _row_blocks(ShardingType.ROW_WISE, b, [0, 2])},
    )
    with pytest.raises(
        PlanMismatchError, match=r"row blocks \[4, 4, 4\] on ranks \[0, 1, 2\] .* on ranks \[0, 2\]"
    ):
        check_plan(plan, TABLES, 3)


def test_plan_for_a_differently_shaped_table_is_refused_before_allocating():
    other = [EmbeddingBagConfig("a", 8, 4), EmbeddingBagConfig("b", 20, 8)]
    plan = construct_module_plan(other, {"a": table_wise(0), "b": row_wise()}, world_size=1)
    ebc = EmbeddingBagCollection(TABLES, device="meta")
    with pytest.raises(
        PlanMismatchError, match=r"table 'b' \(row_wise\): rows 0..20 run past the table's 12"
    ):
        shard_modules(ebc, plan=plan)


def test_unknown_table_in_plan_is_named():
    plan = construct_module_plan(
        TABLES + [EmbeddingBagConfig("c", 4, 4)],
        {"a": table_wise(0), "b": table_wise(0), "c": table_wise(0)},
        world_size=1,
    )
    with pytest.raises(PlanMismatchError, match=r"tables \['c'\] that the module does not have"):
        shard_modules(EmbeddingBagCollection(TABLES, device="meta"), plan=plan)


@pytest.mark.parametrize(
    ("fused_params", "message"),
    [
        ({"optimizer": "adam", "momentum": 0.9}, r"keys \['momentum'\] that adam does not use"),
        ({"optimizer": "lamb"}, "'lamb' is not supported"),
        ({"optimizer": "sgd", "lr": 0.1}, r"unknown keys \['lr'\]"),
    ],
)
def test_fused_params_errors(fused_params, message):
    plan = construct_module_plan(TABLES, {"a": table_wise(0), "b": table_wise(0)}, world_size=1)
    with pytest.raises(ValueError, match=message):
        shard_modules(
            EmbeddingBagCollection(TABLES, device="meta"), plan=plan, fused_params=fused_params
        )


def test_subgroups_are_the_same_whichever_hosts_hold_table_row_wise_tables():
    families = {s.name: subgroup_families(s.plan) for s in runtime_cases.host_patterns(6)}
    hosts_then_local_indices = [[[0, 1], [2, 3], [4, 5]], [[0, 2, 4], [1, 3, 5]]]
    assert families == {
        "one host": hosts_then_local_indices,
        "some hosts": hosts_then_local_indices,
        "all hosts": hosts_then_local_indices,
        "no host": [],
    }


# --------------------------------------------------------------------------- one rank


def test_single_rank_matches_and_trains_like_the_unsharded_module():
    plan = construct_module_plan(
        TABLES, {"a": data_parallel(), "b": column_wise([0, 0], widths=[4, 4])}, world_size=1
    )
    ebc = EmbeddingBagCollection(TABLES, seed=3)
    sharded = shard_modules(ebc, plan=plan, fused_params={"optimizer": "sgd", "learning_rate": 0.5})
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["a", "b"], torch.tensor([1, 7, 0, 11, 3]), torch.tensor([2, 1, 0, 2])
    )
    expected = ebc(kjt).values()
    got = sharded(kjt).values()
    assert torch.allclose(got, expected, atol=1e-6)
    got.sum().backward()
    expected.sum().backward()
    with torch.no_grad():
        for bag in ebc.embedding_bags.values():
            bag.weight -= 0.5 * bag.weight.grad
    gathered = sharded.gather_state_dict()
    for key, value in ebc.state_dict().items():
        assert torch.allclose(gathered[key], value, atol=1e-6), key


@pytest.mark.filterwarnings(
    "ignore:.*dense_embedding_codegen_lookup_function. an autograd kernel:UserWarning"
)
@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad", "adam"])
def test_two_column_shards_of_a_two_feature_table_on_one_rank_train_like_the_unsharded(
    optimizer,
):
    """Both column shards of a table with features f1, f2 in one kernel: FBGEMM's CPU
    row-wise Adagrad backward raised "num of rows processed by adagrad: 0 does not match
    c_block size" when the kernel's features went back to an earlier table ([0, 1, 0, 1])."""
    table = EmbeddingBagConfig("two", 20, 16, feature_names=["f1", "f2"])
    plan = construct_module_plan([table], {"two": column_wise([0, 0])}, world_size=1)
    scenario = runtime_cases.Scenario("two features, two column shards", [table], plan)
    sharded, reference = runtime_cases.check_scenario(0, 1, scenario, optimizer)
    if optimizer != "rowwise_adagrad":
        return
    state = sharded.full_state()
    for block, (c0, c1) in enumerate(runtime_cases.column_blocks(plan, table)):
        got = state[f"embedding_bags.two.weight.momentum1.columns_{c0}_{c1}"]
        want = reference.state["two"][:, block]
        assert got.count_nonzero() > 0
        assert torch.allclose(got, want, atol=runtime_cases.ATOL), (block, got, want)


def test_every_kernel_takes_its_tables_features_table_by_table():
    """FBGEMM's CPU backward walks a kernel's features table by table, so a kernel's
    ``feature_table_map`` must never go back to an earlier table (pooled and sequence, on
    CPU and CUDA layouts)."""
    two = EmbeddingBagConfig("two", 20, 24, feature_names=["f1", "f2", "f3"])
    other = EmbeddingBagConfig("other", 9, 8, feature_names=["g1", "g2"])
    builders = {"two": column_wise([0, 1, 0]), "other": table_wise(0)}
    plans = [(s.tables, s.plan) for world in (2, 3, 4) for s in runtime_cases.scenarios(world)]
    plans.append(([two, other], construct_module_plan([two, other], builders, world_size=2)))
    for tables, plan in plans:
        for cuda, sequence in itertools.product((False, True), repeat=2):
            for layout in build_layouts(plan, tables, cuda=cuda, sequence=sequence):
                for group in layout.groups:
                    order = group.feature_table_map()
                    assert order == sorted(order), (plan.tables, cuda, sequence, order)


def test_ids_outside_the_table_are_refused_with_the_feature_named():
    plan = construct_module_plan(TABLES, {"a": table_wise(0), "b": row_wise()}, world_size=1)
    sharded = shard_modules(EmbeddingBagCollection(TABLES, device="meta"), plan=plan)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["a", "b"], torch.tensor([1, 12]), torch.tensor([1, 1])
    )
    with pytest.raises(ValueError, match=r"feature 'b' has id 12; table 'b' has 12 rows"):
        sharded(kjt)


def test_a_plan_from_the_solver_applies_as_json():
    request = PlanRequest.model_validate(
        {
            "topology": {"world_size": 1, "compute_device": "cpu", "hbm_bytes": 2**30},
            "tables": [
                {"name": "a", "num_embeddings": 8, "embedding_dim": 4},
                {"name": "b", "num_embeddings": 12, "embedding_dim": 8},
            ],
            "options": {"time_limit_s": 0.01},
        }
    )
    outcome = solve(request)
    assert outcome.plan is not None
    module = EmbeddingBagCollection(
        [EmbeddingBagConfig.from_table(t) for t in request.tables], seed=1
    )
    sharded = shard_modules(module, plan=plan_bytes(outcome.plan))
    assert sharded.plan_id == outcome.plan.plan_id
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["a", "b"], torch.tensor([0, 7, 11]), torch.tensor([2, 1])
    )
    assert torch.allclose(sharded(kjt).values(), module(kjt).values(), atol=1e-6)


# --------------------------------------------------------------------------- plan integrity

INTEGRITY_TABLES = [EmbeddingBagConfig("a", 8, 4), EmbeddingBagConfig("wide", 16, 128)]


@pytest.fixture(scope="module")
def sealed() -> bytes:
    """A plan as the service serves it: solved and sealed for ``INTEGRITY_TABLES``."""
    request = PlanRequest.model_validate(
        {
            "topology": {"world_size": 1, "compute_device": "cpu", "hbm_bytes": 2**30},
            "tables": [
                {
                    "name": t.name,
                    "num_embeddings": t.num_embeddings,
                    "embedding_dim": t.embedding_dim,
                }
                for t in INTEGRITY_TABLES
            ],
            "options": {"time_limit_s": 0.01},
        }
    )
    outcome = solve(request)
    assert outcome.plan is not None
    assert outcome.plan.tables["wide"].sharding_type is ShardingType.TABLE_WISE
    return plan_bytes(outcome.plan)


def _one_byte(field: str) -> Callable[[bytes], bytes]:
    """Add one to the last digit of the first number after ``"field":``."""

    def edit(data: bytes) -> bytes:
        # a number, or the first of a list of them (schema 2.0's rank_stats columns)
        match = re.search(rb'"' + field.encode() + rb'":\[?[0-9.e+-]*?([0-8])[,}\]]', data)
        assert match is not None, field
        at = match.start(1)
        return data[:at] + bytes([data[at] + 1]) + data[at + 1 :]

    return edit


def _edit_json(change: Callable[[dict], None]) -> Callable[[bytes], bytes]:
    def edit(data: bytes) -> bytes:
        document = json.loads(data)
        change(document)
        return json.dumps(document).encode()

    return edit


def _kernel_to_dense(document: dict) -> None:
    document["tables"]["wide"]["compute_kernel"] = "dense"


def _split_columns(document: dict) -> None:
    """The table-wise 16 x 128 table as two column shards of 64 on the same rank."""
    document["tables"]["wide"].update(
        sharding_type="column_wise", ranks=[0, 0], column_widths=[[64, 2]]
    )


EDITS = {
    "solver.objective": _one_byte("objective"),
    "rank_stats": _one_byte("ddr_bytes"),
    "kernel fused -> dense": _edit_json(_kernel_to_dense),
    "column shard 64 + 64": _edit_json(_split_columns),
}
FORMS: dict[str, Callable[[bytes], object]] = {
    "bytes": lambda data: data,
    "str": lambda data: data.decode(),
    "dict": json.loads,
    "ShardingPlan": ShardingPlan.model_validate_json,
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("edit", EDITS)
def test_an_edited_plan_is_refused_naming_both_ids(sealed, edit, form):
    tampered = EDITS[edit](sealed)
    claimed = parse_plan(sealed).plan_id
    actual = plan_id_of(json.loads(tampered))
    assert actual != claimed and parse_plan(tampered).plan_id == claimed
    module = EmbeddingBagCollection(INTEGRITY_TABLES, device="meta")
    with pytest.raises(PlanMismatchError, match=f"plan_id {claimed}.*{actual}"):
        shard_modules(module, plan=FORMS[form](tampered))


def test_a_plan_object_with_a_wrong_plan_id_is_refused(sealed):
    plan = parse_plan(sealed)
    wrong = plan.model_copy(update={"plan_id": "0" * 64})
    module = EmbeddingBagCollection(INTEGRITY_TABLES, device="meta")
    with pytest.raises(PlanMismatchError, match=f"plan_id {'0' * 64}.*{plan.plan_id}"):
        shard_modules(module, plan=wrong)


@pytest.mark.parametrize("form", FORMS)
def test_a_sealed_plan_is_accepted_in_every_form(sealed, form):
    module = EmbeddingBagCollection(INTEGRITY_TABLES, device="meta")
    sharded = shard_modules(module, plan=FORMS[form](sealed))
    assert sharded.plan_id == parse_plan(sealed).plan_id


# --------------------------------------------------------------------------- sequence


SEQUENCE = [EmbeddingConfig("s", 9, 8), EmbeddingConfig("t", 5, 16, feature_names=["u", "v"])]


def _sequence_batch() -> KeyedJaggedTensor:
    # s = [1, 2], [], [8]; u = [4], [0, 3], []; v = [], [], [2, 2]
    return KeyedJaggedTensor.from_lengths_sync(
        ["v", "s", "u"],  # any key order
        torch.tensor([2, 2, 1, 2, 8, 4, 0, 3]),
        torch.tensor([0, 0, 2, 2, 0, 1, 1, 2, 0]),
    )


def test_unsharded_sequence_rows_are_the_ids_rows_with_the_input_lengths():
    ec = EmbeddingCollection(SEQUENCE, seed=3)
    out = ec(_sequence_batch())
    assert list(out) == ["s", "u", "v"]  # table order, then feature order
    s_weight, t_weight = ec.table_weight("s"), ec.table_weight("t")
    assert torch.equal(out["s"].values(), s_weight[torch.tensor([1, 2, 8])])
    assert out["s"].lengths().tolist() == [2, 0, 1]
    assert torch.equal(out["u"].values(), t_weight[torch.tensor([4, 0, 3])])
    assert out["v"].values().shape == (2, 16) and out["v"].lengths().tolist() == [0, 0, 2]
    assert list(ec.state_dict()) == ["embeddings.s.weight", "embeddings.t.weight"]


@pytest.mark.parametrize(
    "per_table",
    [
        {"s": table_wise(0), "t": column_wise([0, 0, 0, 0])},
        {"s": row_wise(), "t": data_parallel()},
    ],
)
def test_single_rank_sequence_matches_and_trains_like_the_unsharded_module(per_table):
    reference = EmbeddingCollection(SEQUENCE, seed=3)
    plan = construct_module_plan(SEQUENCE, per_table, world_size=1)
    sharded = shard_modules(reference, plan=plan, fused_params={"learning_rate": 0.5})
    assert isinstance(sharded, ShardedEmbeddingCollection)
    batch = _sequence_batch()
    for _ in range(2):
        want, got = reference(batch), sharded(batch)
        assert list(got) == list(want)
        for feature, jt in want.items():
            assert torch.allclose(got[feature].values(), jt.values(), atol=1e-6), feature
            assert torch.equal(got[feature].lengths(), jt.lengths())
        sum(jt.values().sum() for jt in got.values()).backward()
        sum(jt.values().sum() for jt in want.values()).backward()
        with torch.no_grad():
            for table in SEQUENCE:
                weight = reference.table_weight(table.name)
                weight -= 0.5 * weight.grad
                weight.grad = None
    gathered = sharded.gather_state_dict()
    for key, value in reference.state_dict().items():
        assert torch.allclose(gathered[key], value, atol=1e-6), key


def test_sequence_config_errors_name_the_table():
    with pytest.raises(ValueError, match=r"table 'a' has pooling 'sum'.*sequence table"):
        EmbeddingConfig.from_table(Table(name="a", num_embeddings=4, embedding_dim=4))
    with pytest.raises(ValueError, match=r"table 'b' has pooling 'none'.*EmbeddingConfig"):
        EmbeddingBagConfig("b", 4, 4, pooling=PoolingType.NONE)
    with pytest.raises(TypeError, match=r"'c' is a EmbeddingBagConfig.*EmbeddingConfig"):
        EmbeddingCollection([EmbeddingBagConfig("c", 4, 4)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"'embeddings.<name>.weight'"):
        EmbeddingConfig("d.e", 4, 4)
    sequence = config_of(Table(name="f", num_embeddings=4, embedding_dim=4, pooling="none"))
    assert isinstance(sequence, EmbeddingConfig) and sequence.feature_names == ["f"]


class _Model(torch.nn.Module):
    def __init__(self, pooled: list[EmbeddingBagConfig], sequence: list[EmbeddingConfig]):
        super().__init__()
        self.pooled = EmbeddingBagCollection(pooled, device="meta")
        self.inner = torch.nn.Sequential(EmbeddingCollection(sequence, device="meta"))


def test_one_plan_shards_every_collection_in_a_model_in_place():
    pooled = [EmbeddingBagConfig("p", 6, 4)]
    plan = construct_module_plan(
        [*pooled, *SEQUENCE],
        {"p": row_wise(), "s": table_wise(0), "t": table_wise(0)},
        world_size=1,
    )
    model = _Model(pooled, SEQUENCE)
    assert shard_modules(model, plan=plan) is model
    assert isinstance(model.pooled, ShardedEmbeddingBagCollection)
    assert isinstance(model.inner[0], ShardedEmbeddingCollection)
    assert model.pooled.plan_id == model.inner[0].plan_id == plan.plan_id


def test_a_model_plan_must_cover_exactly_the_models_tables():
    pooled = [EmbeddingBagConfig("p", 6, 4)]
    everything = {"p": row_wise(), "s": table_wise(0), "t": table_wise(0)}
    extra = [*pooled, *SEQUENCE, EmbeddingBagConfig("x", 3, 4)]
    plan = construct_module_plan(extra, {**everything, "x": table_wise(0)}, world_size=1)
    with pytest.raises(
        PlanMismatchError, match=r"tables \['x'\] that no collection.*\['p', 's', 't'\]"
    ):
        shard_modules(_Model(pooled, SEQUENCE), plan=plan)
    partial = construct_module_plan(
        [*pooled, *SEQUENCE], {"p": row_wise(), "s": table_wise(0)}, world_size=1
    )
    model = _Model(pooled, SEQUENCE)
    with pytest.raises(PlanMismatchError, match=r"no sharding for tables \['t'\]"):
        shard_modules(model, plan=partial)
    assert isinstance(model.pooled, EmbeddingBagCollection)  # nothing replaced
    clash = _Model([EmbeddingBagConfig("s", 6, 4)], SEQUENCE)
    with pytest.raises(PlanMismatchError, match=r"table 's' is in both 'pooled' and 'inner.0'"):
        shard_modules(
            clash,
            plan=construct_module_plan(
                SEQUENCE, {"s": table_wise(0), "t": table_wise(0)}, world_size=1
            ),
        )
    with pytest.raises(
        TypeError, match="no EmbeddingBagCollection or EmbeddingCollection in Linear"
    ):
        shard_modules(torch.nn.Linear(2, 2), plan=plan)
