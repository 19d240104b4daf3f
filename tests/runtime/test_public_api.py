"""The runtime's public surface: what ``runtime`` exports is what docs/runtime.md's API list
documents, the enums a config, ``fused_params`` or a plan builder takes are among it, and
every enum-typed parameter of a public constructor takes the member or its string value and
refuses anything else."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import sys
import typing
from collections.abc import Callable
from pathlib import Path

import pydantic
import pytest
import torch

import runtime
from planner_service.plan import types
from runtime import (
    BaseEmbeddingConfig,
    CheckpointManifest,
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingConfig,
    KeyedJaggedTensor,
    ModulePlan,
    PlanMismatchError,
    ShardedEmbeddingBagCollection,
    column_wise,
    construct_module_plan,
    measure,
    row_wise,
    shard_modules,
    table_column_wise,
    table_row_wise,
    table_wise,
)
from runtime.calibrate.profile import CalibrateSettings

API_PAGE = Path(__file__).resolve().parents[2] / "docs" / "runtime.md"


def _api_section() -> str:
    text = API_PAGE.read_text()
    start = text.index("\n## API\n")
    return text[start : text.index("\n## ", start + 1)]


def test_every_exported_name_has_its_own_entry_in_the_api_list():
    entries = set(re.findall(r"^- `(\w+)", _api_section(), flags=re.MULTILINE))
    exported = set(runtime.__all__)
    assert exported - entries == set(), "exported but not in docs/runtime.md's API list"
    methods = {"state_dict", "load_state_dict", "gather_state_dict", "optimizer_step"}
    assert entries - exported == methods, "in the API list but not exported"
    assert all(hasattr(runtime, name) for name in exported)


def test_the_enums_a_config_fused_params_and_a_plan_take_are_the_planner_s():
    from runtime import (
        ComputeKernel,
        DataType,
        EmbeddingBagConfig,
        OptimizerType,
        PoolingType,
        ShardingType,
    )

    assert (DataType, PoolingType, OptimizerType) == (
        types.DataType,
        types.PoolingType,
        types.OptimizerType,
    )
    assert (ShardingType, ComputeKernel) == (types.ShardingType, types.ComputeKernel)
    table = EmbeddingBagConfig("t", 4, 8, pooling=PoolingType.MEAN, data_type=DataType.FP16)
    assert table.pooling is types.PoolingType.MEAN and table.data_type is types.DataType.FP16


# --------------------------------------------------------------------------- choices
#
# Every enum-typed parameter of a public constructor takes the member or its string value
# ("mean" holds PoolingType.MEAN) and refuses anything else naming the field and the
# accepted values. The walk below finds those parameters; CASES says how to pass each one
# and where the constructed object keeps it, so a new enum parameter fails the walk until
# it has a case.


def _public() -> dict[str, object]:
    names = {name: getattr(runtime, name) for name in runtime.__all__}
    names |= {f"measure.{name}": getattr(measure, name) for name in measure.__all__}
    return names | {"calibrate.CalibrateSettings": CalibrateSettings}


def _enums_in(annotation: object) -> list[type[enum.Enum]]:
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [annotation]
    return [e for arg in typing.get_args(annotation) for e in _enums_in(arg)]


def _resolved(annotation: object, owner: object) -> object:
    """A parameter's annotation, evaluated where it was written (a name imported only for
    type checkers is no enum)."""
    if not isinstance(annotation, str):
        return annotation
    try:
        return eval(annotation, vars(sys.modules[owner.__module__]))  # noqa: S307
    except NameError:
        return None


def _annotations(obj: object) -> dict[str, object]:
    if isinstance(obj, type) and issubclass(obj, pydantic.BaseModel):
        return {name: f.annotation for name, f in obj.model_fields.items()}
    if isinstance(obj, type) and dataclasses.is_dataclass(obj):
        return {f.name: _resolved(f.type, obj) for f in dataclasses.fields(obj) if f.init}
    target = obj.__init__ if isinstance(obj, type) else obj
    parameters = inspect.signature(target).parameters.values()  # type: ignore[arg-type]
    return {p.name: _resolved(p.annotation, target) for p in parameters}


def _enum_parameters() -> set[tuple[str, str]]:
    found = set()
    for name, obj in _public().items():
        if isinstance(obj, type) and issubclass(obj, enum.Enum | BaseException):
            continue
        if callable(obj):
            found |= {(name, p) for p, a in _annotations(obj).items() if _enums_in(a)}
    return found


class Case(typing.NamedTuple):
    build: Callable[[object], object]  # the public call, given the parameter's value
    read: Callable[[object], object]  # what the built object holds for it
    accepted: tuple[enum.Enum, ...]


TABLE = EmbeddingBagConfig("t", 4, 8)
TRAINED = (types.DataType.FP32, types.DataType.FP16, types.DataType.BF16)


def _builder_case(builder: Callable[..., object], *args: object) -> Case:
    """A plan builder's ``kernel``: refused when the builder is called, not when it builds."""
    return Case(
        lambda kernel: builder(*args, kernel=kernel),
        lambda build: build(TABLE, 2, 2).compute_kernel,  # type: ignore[operator]
        tuple(types.ComputeKernel),
    )


def _model_case(base: pydantic.BaseModel, field: str) -> Case:
    model = type(base)
    kind = _enums_in(model.model_fields[field].annotation)[0]
    return Case(
        lambda value: model.model_validate({**base.model_dump(), field: value}),
        lambda built: getattr(built, field),
        tuple(kind),
    )


def _sharded_optimizer(optimizer: object) -> object:
    plan = construct_module_plan([TABLE], {"t": table_wise(0)}, world_size=1)
    module = EmbeddingBagCollection([TABLE], device="meta")
    return shard_modules(module, plan=plan, fused_params={"optimizer": optimizer})


SHARDING = table_wise(0)(TABLE, 1, 1)
MACHINE = measure.report.Machine(
    hostname="h", cpu_count=1, device_name="cpu", torch_version="t", fbgemm_version="f"
)
REPORT = measure.MeasureReport(
    plan_id="p",
    request_hash="r",
    world_size=1,
    backend=measure.report.Backend.GLOO,
    settings=measure.MeasureSettings(),
    machine=MACHINE,
    ranks=[],
    job_step_ms=1.0,
    slowest_rank=0,
    predicted_job_ms=None,
    relative_error=None,
)
CASES: dict[tuple[str, str], Case] = {
    ("BaseEmbeddingConfig", "data_type"): Case(
        lambda v: BaseEmbeddingConfig("t", 4, 8, data_type=v), lambda c: c.data_type, TRAINED
    ),
    ("EmbeddingBagConfig", "data_type"): Case(
        lambda v: EmbeddingBagConfig("t", 4, 8, data_type=v), lambda c: c.data_type, TRAINED
    ),
    ("EmbeddingBagConfig", "pooling"): Case(
        lambda v: EmbeddingBagConfig("t", 4, 8, pooling=v),
        lambda c: c.pooling,
        (types.PoolingType.SUM, types.PoolingType.MEAN),
    ),
    ("EmbeddingConfig", "data_type"): Case(
        lambda v: EmbeddingConfig("t", 4, 8, data_type=v), lambda c: c.data_type, TRAINED
    ),
    ("table_wise", "kernel"): _builder_case(table_wise, 0),
    ("column_wise", "kernel"): _builder_case(column_wise, [0, 1]),
    ("table_column_wise", "kernel"): _builder_case(table_column_wise, 0),
    ("row_wise", "kernel"): _builder_case(row_wise),
    ("table_row_wise", "kernel"): _builder_case(table_row_wise, 0),
    ("ParameterSharding", "sharding_type"): _model_case(SHARDING, "sharding_type"),
    ("ParameterSharding", "compute_kernel"): _model_case(SHARDING, "compute_kernel"),
    ("CheckpointManifest", "optimizer"): _model_case(
        CheckpointManifest(plan_id=None, world_size=1, optimizer="sgd", optimizer_step=0),
        "optimizer",
    ),
    ("measure.MeasureSettings", "device"): _model_case(measure.MeasureSettings(), "device"),
    ("measure.MeasureReport", "backend"): _model_case(REPORT, "backend"),
    ("calibrate.CalibrateSettings", "device"): Case(
        lambda v: CalibrateSettings(budget_s=10.0, device=v, world_sizes=(2,), name="n"),
        lambda settings: settings.device,
        tuple(types.ComputeDevice),
    ),
    # Not a parameter of its own: fused_params' "optimizer", read by every sharded module.
    ("shard_modules", "fused_params['optimizer']"): Case(
        _sharded_optimizer, lambda sharded: sharded.optimizer, tuple(types.OptimizerType)
    ),
}


def test_every_enum_parameter_of_a_public_constructor_has_a_case():
    found = _enum_parameters()
    assert found - set(CASES) == set(), "enum parameters with no case in CASES"
    assert len(found) >= 15  # the walk still finds them


@pytest.mark.parametrize("key", sorted(CASES), ids="/".join)
def test_an_enum_parameter_takes_the_member_or_its_string_value(key):
    case = CASES[key]
    for member in case.accepted:
        assert case.read(case.build(member)) is member, member
        assert case.read(case.build(member.value)) is member, member.value


@pytest.mark.parametrize("key", sorted(CASES), ids="/".join)
def test_an_enum_parameter_refuses_anything_else_naming_the_field_and_the_accepted(key):
    case = CASES[key]
    kind = type(case.accepted[0])
    others = [m for m in kind if m not in case.accepted]
    field = key[1].removeprefix("fused_params['").removesuffix("']")
    for bad in ["bogus", case.accepted[0].value.upper(), 3, None, *others]:
        with pytest.raises(ValueError) as refused:
            case.build(bad)
        message = str(refused.value)
        assert field in message, (bad, message)
        assert all(f"'{m.value}'" in message for m in case.accepted), (bad, message)


def test_a_mean_pooled_table_given_as_a_string_pools_the_mean():
    """The reproducer: ``pooling="mean"`` held the string, failed the ``is`` check and
    sum-pooled (a bag of 3 ids came out 3x its mean)."""
    tables = [EmbeddingBagConfig("t", 8, 4, pooling="mean")]  # type: ignore[arg-type]
    ebc = EmbeddingBagCollection(tables, seed=0)
    kjt = KeyedJaggedTensor.from_lengths_sync(["t"], torch.tensor([1, 2, 3]), torch.tensor([3]))
    weight = ebc.embedding_bags["t"].weight
    expected = weight[[1, 2, 3]].mean(dim=0)
    assert torch.allclose(ebc(kjt).values()[0], expected)
    plan = construct_module_plan(tables, {"t": table_wise(0)}, world_size=1)
    sharded = shard_modules(ebc, plan=plan)
    assert torch.allclose(sharded(kjt).values()[0], expected)


def test_a_module_plan_reads_a_table_s_sharding_from_its_json_data():
    data = SHARDING.model_dump(mode="json")
    assert ModulePlan(1, {"t": data}).tables["t"] == SHARDING
    with pytest.raises(
        PlanMismatchError, match=r"table 't': sharding_type = 'sideways': Input should be"
    ):
        ModulePlan(1, {"t": {**data, "sharding_type": "sideways"}})
    with pytest.raises(PlanMismatchError, match=r"table 't': its sharding is a str"):
        ModulePlan(1, {"t": "table_wise"})  # type: ignore[dict-item]


def test_a_sharded_module_takes_its_device_as_a_string():
    plan = construct_module_plan([TABLE], {"t": table_wise(0)}, world_size=1)
    module = EmbeddingBagCollection([TABLE], device="meta")
    sharded = ShardedEmbeddingBagCollection(module, plan, None, "cpu")
    assert sharded.device == torch.device("cpu")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"is_weighted": "false"}, r"table 't': is_weighted 'false' is not supported"),
        ({"feature_names": "f1"}, r"table 't': feature_names 'f1' is a string"),
    ],
)
def test_a_config_refuses_what_it_would_misread(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EmbeddingBagConfig("t", 4, 8, **kwargs)
