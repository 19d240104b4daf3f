"""The runtime's public surface: what ``runtime`` exports is what docs/runtime.md's API list
documents, and the enums a config, ``fused_params`` or a plan builder takes are among it."""

from __future__ import annotations

import re
from pathlib import Path

import runtime
from planner_service.plan import types

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
