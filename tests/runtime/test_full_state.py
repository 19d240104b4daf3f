"""Full tables and optimizer state of sharded modules (``full_state``): in one process, then
on 2 and 3 gloo ranks against the unsharded model (tests/runtime/full_state_cases.py)."""

from __future__ import annotations

import pytest
import torch

from runtime import (
    DataType,
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    KeyedJaggedTensor,
    construct_module_plan,
    full_state,
    shard_modules,
    table_wise,
)
from tests.runtime import full_state_cases
from tests.support.distributed import run_ranks

# Adam on CPU runs FBGEMM's dense lookup, whose backward torch warns about on every call
# (runtime/kernels.py filters it at import; pytest's "error" filter comes first).
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*dense_embedding_codegen_lookup_function. an autograd kernel:UserWarning"
)


def _trained(optimizer: str) -> torch.nn.Module:
    tables = [
        EmbeddingBagConfig("a", 6, 8),
        EmbeddingBagConfig("b", 5, 4, data_type=DataType.FP16),
    ]
    plan = construct_module_plan(tables, {"a": table_wise(0), "b": table_wise(0)}, world_size=1)
    module = shard_modules(
        EmbeddingBagCollection(tables, seed=1),
        plan=plan,
        fused_params={"optimizer": optimizer, "learning_rate": 0.1},
    )
    batch = KeyedJaggedTensor.from_lengths_sync(
        ["a", "b"], torch.tensor([0, 5, 5, 1, 4]), torch.tensor([2, 1, 1, 1])
    )
    module(batch).values().sum().backward()
    return module


@pytest.mark.parametrize(
    ("optimizer", "state"),
    [
        ("sgd", {}),
        ("adagrad", {"momentum1": (6, 8)}),
        ("adam", {"momentum1": (6, 8), "momentum2": (6, 8)}),
        ("rowwise_adagrad", {"momentum1.columns_0_8": (6,)}),
    ],
)
def test_full_state_keys_shapes_and_types_per_optimizer(optimizer, state):
    module = _trained(optimizer)
    got = module.full_state()
    want = {"embedding_bags.a.weight": (6, 8)}
    want |= {f"embedding_bags.a.weight.{name}": shape for name, shape in state.items()}
    want |= {"embedding_bags.b.weight": (5, 4)}
    want |= {
        f"embedding_bags.b.weight.{name}": (5, 4) if len(shape) == 2 else (5,)
        for name, shape in {k.replace("0_8", "0_4"): v for k, v in state.items()}.items()
    }
    assert {key: tuple(value.shape) for key, value in got.items()} == want
    assert list(got) == list(want)  # table by table: weight, then its state
    assert got["embedding_bags.b.weight"].dtype == torch.float16
    assert all(v.dtype == torch.float32 for k, v in got.items() if k != "embedding_bags.b.weight")
    assert all(v.device.type == "cpu" for v in got.values())
    trained = [s for s in module.shard_states() if s.table.name == "a"][0]
    assert torch.equal(got["embedding_bags.a.weight"], trained.weight)
    if optimizer == "rowwise_adagrad":
        assert torch.equal(got["embedding_bags.a.weight.momentum1.columns_0_8"], trained.rowwise)
        # rows 0 and 5 were looked up: their accumulators moved, the others did not
        moved = got["embedding_bags.a.weight.momentum1.columns_0_8"].nonzero().flatten()
        assert moved.tolist() == [0, 5]


def test_full_state_of_a_model_keys_by_path_and_refuses_what_it_cannot_gather():
    model = torch.nn.Module()
    model.sparse = _trained("adagrad")
    got = full_state(model)
    assert list(got) == [f"sparse.{key}" for key in model.sparse.full_state()]
    assert full_state(model, optimizer_state=False).keys() == {
        "sparse.embedding_bags.a.weight",
        "sparse.embedding_bags.b.weight",
    }
    with pytest.raises(ValueError, match=r"dst 1 is not a rank of the module's process group "):
        full_state(model, dst=1)
    with pytest.raises(TypeError, match="holds no sharded collection; shard it with"):
        full_state(torch.nn.Linear(2, 2))


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_full_state_after_training_equals_the_unsharded_model_under_every_optimizer(world_size):
    run_ranks(full_state_cases.pooled, world_size)


@pytest.mark.slow
def test_full_state_of_a_model_with_two_collections_is_its_checkpoint_keys(tmp_path):
    run_ranks(full_state_cases.model, 2, str(tmp_path / "checkpoint"))
