"""Canonical JSON, content addresses, schema versions and the lossless round trip."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_service.codec import (
    canonical_bytes,
    parse_plan,
    parse_request,
    plan_bytes,
    plan_id_of,
    request_hash,
)
from planner_service.errors import InputError
from planner_service.types import (
    SCHEMA_VERSION,
    ComputeKernel,
    ParameterSharding,
    Perf,
    RankStats,
    Shard,
    ShardingPlan,
    ShardingType,
    SolverReport,
    SolverStatus,
)
from tests import builders
from tests.builders import request, table

MiB = 1024**2
GIB = 1024**3


def _two_table_plan() -> tuple:
    req = request([table("a"), table("b")], world_size=2)
    plan = builders.plan(
        req, {"a": builders.table_wise(req, "a", 0), "b": builders.row_wise(req, "b")}
    )
    return req, plan


def test_canonical_bytes_sorted_compact_and_stable():
    assert canonical_bytes({"b": 1, "a": [1.5, -0.0]}) == b'{"a":[1.5,0.0],"b":1}'
    _, plan = _two_table_plan()
    first = plan_bytes(plan)
    assert first == plan_bytes(parse_plan(first))
    assert b" " not in first and first.index(b'"plan_id"') < first.index(b'"planner_version"')


def test_request_hash_ignores_memory_jitter_and_table_order():
    base = request([table("a"), table("b")], topology={"hbm_bytes": 80 * 1024**3})
    jitter = request([table("b"), table("a")], topology={"hbm_bytes": 80 * 1024**3 + 4096})
    assert request_hash(base) == request_hash(jitter)
    explicit_defaults = request(
        [table("a", pooling="sum"), table("b")],
        topology={"hbm_bytes": 80 * 1024**3, "compute_device": "cuda"},
        batch_size=512,
    )
    assert request_hash(base) == request_hash(explicit_defaults)


_GROUPS = {"colocate": [["a", "b"], ["c", "d"]], "separate": [["a", "c"], ["b", "d"]]}
_OVERRIDES = [
    {"rank": 0, "hbm_bytes": 16 * GIB, "ddr_bytes": 64 * GIB},
    {"rank": 1, "hbm_bytes": 8 * GIB, "hbm_bw_bytes_per_s": 1e11},
]


def _hashed(groups=None, overrides=None, **memory) -> str:
    """The hash of a four-table request on two ranks with link groups and overrides."""
    topology = {
        "hbm_bytes": memory.get("hbm_bytes", 80 * GIB),
        "ddr_bytes": memory.get("ddr_bytes", 512 * GIB),
        "rank_overrides": _OVERRIDES if overrides is None else overrides,
    }
    constraints = {
        **(_GROUPS if groups is None else groups),
        "dense_bytes_per_rank": memory.get("dense_bytes_per_rank", 2 * GIB),
    }
    tables = [table(name) for name in "abcd"]
    return request_hash(request(tables, world_size=2, topology=topology, constraints=constraints))


def _jitter(record: dict, field: str, num_bytes: int) -> dict:
    return {**record, field: record[field] + num_bytes}


@pytest.mark.parametrize(
    ("name", "same"),
    [
        ("groups in another order", {"groups": {k: v[::-1] for k, v in _GROUPS.items()}}),
        (
            "tables in a group in another order",
            {"groups": {k: [g[::-1] for g in v] for k, v in _GROUPS.items()}},
        ),
        ("overrides in another order", {"overrides": _OVERRIDES[::-1]}),
        ("hbm_bytes 4 KiB over", {"hbm_bytes": 80 * GIB + 4096}),
        ("hbm_bytes 4 KiB under (rounded to the nearest MiB)", {"hbm_bytes": 80 * GIB - 4096}),
        ("ddr_bytes 4 KiB over", {"ddr_bytes": 512 * GIB + 4096}),
        ("ddr_bytes 4 KiB under", {"ddr_bytes": 512 * GIB - 4096}),
        ("dense_bytes_per_rank 4 KiB under", {"dense_bytes_per_rank": 2 * GIB - 4096}),
        (
            "an override's hbm_bytes 4 KiB under",
            {"overrides": [_jitter(_OVERRIDES[0], "hbm_bytes", -4096), _OVERRIDES[1]]},
        ),
        (
            "an override's ddr_bytes 4 KiB over",
            {"overrides": [_jitter(_OVERRIDES[0], "ddr_bytes", 4096), _OVERRIDES[1]]},
        ),
    ],
)
def test_request_hash_normalises_order_and_memory_jitter(name, same):
    assert _hashed(**same) == _hashed(), name


@pytest.mark.parametrize(
    ("name", "different"),
    [
        ("another group", {"groups": {"colocate": [["a", "c"]], "separate": [["b", "d"]]}}),
        ("ddr_bytes 1 MiB more", {"ddr_bytes": 512 * GIB + MiB}),
        ("dense_bytes_per_rank 1 MiB more", {"dense_bytes_per_rank": 2 * GIB + MiB}),
        (
            "an override's hbm_bytes 1 MiB less",
            {"overrides": [_jitter(_OVERRIDES[0], "hbm_bytes", -MiB), _OVERRIDES[1]]},
        ),
        ("an override fewer", {"overrides": _OVERRIDES[:1]}),
    ],
)
def test_request_hash_changes_with_groups_and_whole_mebibytes(name, different):
    assert _hashed(**different) != _hashed(), name


@pytest.mark.parametrize(
    "change",
    [
        {"topology": {"hbm_bytes": 80 * 1024**3 + MiB}},
        {"batch_size": 1024},
        {"tables_extra": table("c")},
        {"options": {"seed": 1}},
    ],
)
def test_request_hash_changes_with_meaningful_changes(change):
    tables = [table("a"), table("b")]
    base = request(tables, topology={"hbm_bytes": 80 * 1024**3})
    change = dict(change)
    if "tables_extra" in change:
        tables = [*tables, change.pop("tables_extra")]
    topology = {"hbm_bytes": 80 * 1024**3, **change.pop("topology", {})}
    assert request_hash(base) != request_hash(request(tables, topology=topology, **change))


def test_plan_id_is_hash_of_body_and_detects_edits():
    req, plan = _two_table_plan()
    assert plan.plan_id == plan_id_of(plan.model_dump(mode="json"))
    assert plan.request_hash == request_hash(req)
    edited = json.loads(plan_bytes(plan))
    edited["tables"]["a"]["shards"][0]["rank"] = 1
    assert plan_id_of(edited) != plan.plan_id


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("2.0", "reads plan schema 1.x up to 1.1; upgrade shardplan"),
        ("0.9", "re-plan"),
        ("1.7", "upgrade shardplan"),
        ("one", 'must be a string like "1.1"'),
        (3, 'must be a string like "1.1"'),
    ],
)
def test_unknown_schema_versions_are_refused(version, message):
    _, plan = _two_table_plan()
    document = json.loads(plan_bytes(plan))
    document["schema_version"] = version
    with pytest.raises(InputError, match="schema_version") as caught:
        parse_plan(json.dumps(document), source="plan.json")
    assert message in caught.value.render()


def test_current_schema_version_reads():
    _, plan = _two_table_plan()
    assert plan.schema_version == SCHEMA_VERSION
    assert parse_plan(plan.model_dump_json()) == plan


# --------------------------------------------------------------------------- round trip

_finite = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)
_count = st.integers(min_value=0, max_value=2**53)
_hex = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
_names = st.text(min_size=1, max_size=12)

_shards = st.builds(
    Shard,
    offsets=st.tuples(_count, _count),
    sizes=st.tuples(_count, _count),
    rank=st.integers(0, 65535),
)
_shardings = st.builds(
    ParameterSharding,
    sharding_type=st.sampled_from(ShardingType),
    compute_kernel=st.sampled_from(ComputeKernel),
    ranks=st.lists(st.integers(0, 65535), max_size=5),
    shards=st.lists(_shards, min_size=1, max_size=5),
    cache_load_factor=st.none() | st.floats(min_value=1e-9, max_value=1.0),
)
_perfs = st.builds(
    Perf,
    fwd_compute=_finite,
    fwd_comms=_finite,
    bwd_compute=_finite,
    bwd_comms=_finite,
    prefetch=_finite,
    input_dist=_finite,
    total=_finite,
)
_plans = st.builds(
    ShardingPlan,
    plan_id=_hex,
    request_hash=_hex,
    planner_version=_names,
    world_size=st.integers(1, 65536),
    tables=st.dictionaries(_names, _shardings, min_size=1, max_size=4),
    rank_stats=st.lists(
        st.builds(
            RankStats, rank=st.integers(0, 65535), hbm_bytes=_count, ddr_bytes=_count, perf=_perfs
        ),
        max_size=4,
    ),
    solver=st.builds(
        SolverReport,
        status=st.sampled_from(SolverStatus),
        objective=_finite,
        lower_bound=_finite,
        gap=_finite,
    ),
)


@settings(max_examples=300)
@given(_plans)
def test_plan_round_trips_losslessly(plan):
    assert ShardingPlan.model_validate_json(plan.model_dump_json()) == plan
    encoded = plan_bytes(plan)
    decoded = parse_plan(encoded)
    assert decoded == plan
    assert plan_bytes(decoded) == encoded


@settings(max_examples=100)
@given(
    rows=st.integers(1, 10**12),
    dim=st.integers(1, 4096),
    factor=_finite,
    headroom=st.floats(min_value=0.0, max_value=0.99),
    hbm=_count,
)
def test_request_round_trips_losslessly(rows, dim, factor, headroom, hbm):
    req = request(
        [table("t", rows=rows, dim=dim, pooling_factors=[factor])],
        topology={"hbm_bytes": hbm},
        constraints={"hbm_headroom_fraction": headroom},
    )
    assert type(req).model_validate_json(req.model_dump_json()) == req
    assert parse_request(canonical_bytes(req)) == req
