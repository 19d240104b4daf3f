"""Canonical JSON, content addresses, schema versions and the lossless round trip."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_service.plan.canonical import canonical_bytes, plan_id_of
from planner_service.plan.codec import (
    json_depth,
    parse_plan,
    parse_request,
    plan_bytes,
    request_hash,
)
from planner_service.plan.compact import compact_sharding, expand_plan
from planner_service.plan.errors import InputError
from planner_service.plan.schema_version import SCHEMA_VERSION, SCHEMA_VERSION_WITHOUT_MIGRATION
from planner_service.plan.types import (
    MAX_EMBEDDING_DIM,
    MAX_JSON_DEPTH,
    MAX_MEMORY_BYTES,
    MAX_NUM_EMBEDDINGS,
    MAX_POOLING_FACTOR,
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
from planner_service.solve.pipeline import solve
from tests.support import builders
from tests.support.builders import request, table
from tests.support.layouts import layouts

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


@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(alphabet='-0.,:[]{}"ab', max_size=8),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(st.text(alphabet="-0.ab", max_size=4), inner, max_size=4)
        ),
        max_leaves=12,
    )
)
def test_canonical_bytes_write_negative_zero_as_zero_wherever_it_is(value):
    # The fast path dumps once and normalises only when the text holds "-0.0"; the result
    # must be what normalising first gives, strings that read "-0.0" included.
    def normalised(data):
        if isinstance(data, float):
            return 0.0 if data == 0.0 else data
        if isinstance(data, dict):
            return {k: normalised(v) for k, v in data.items()}
        if isinstance(data, list):
            return [normalised(v) for v in data]
        return data

    expected = json.dumps(
        normalised(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode()
    assert canonical_bytes(value) == expected


def test_a_sealed_plan_is_served_as_the_bytes_it_was_hashed_from():
    req = request([table("a"), table("b", rows=5_000_000)], world_size=4)
    outcome = solve(req)
    assert outcome.plan is not None
    sealed = plan_bytes(outcome.plan)  # kept from sealing
    assert sealed == canonical_bytes(outcome.plan)  # what serialising it again gives
    assert parse_plan(sealed) == outcome.plan
    assert plan_id_of(json.loads(sealed)) == outcome.plan.plan_id


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
    edited["tables"]["a"]["ranks"] = [1]
    assert plan_id_of(edited) != plan.plan_id


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("3.0", "reads plan schemas 1.0 to 1.2 and 2.0; upgrade shardplan"),
        ("2.1", "upgrade shardplan"),
        ("0.9", "re-plan"),
        ("1.7", "upgrade shardplan"),
        ("one", 'must be a string like "2.0"'),
        (3, 'must be a string like "2.0"'),
    ],
)
def test_unknown_schema_versions_are_refused(version, message):
    _, plan = _two_table_plan()
    document = json.loads(plan_bytes(plan))
    document["schema_version"] = version
    with pytest.raises(InputError, match="schema_version") as caught:
        parse_plan(json.dumps(document), source="plan.json")
    assert message in caught.value.render()


@pytest.mark.parametrize("version", ["1." + "1" * 4301, "1.²", "١.٠", "1.0 ", "1234567890.0", "1"])
def test_schema_versions_are_read_without_unbounded_int(version):
    _, plan = _two_table_plan()
    document = json.loads(plan_bytes(plan))
    document["schema_version"] = version
    with pytest.raises(InputError) as caught:
        parse_plan(json.dumps(document))
    (problem,) = caught.value.problems
    assert problem.path == "schema_version"
    assert problem.message == f'must be a string like "{SCHEMA_VERSION}"'


def test_current_schema_version_reads():
    _, plan = _two_table_plan()
    assert plan.schema_version == SCHEMA_VERSION == "2.0"
    assert parse_plan(plan.model_dump_json()) == plan


def test_a_1x_plan_still_reads_and_its_id_checks_against_its_own_bytes():
    _, plan = _two_table_plan()
    old = expand_plan(plan)
    assert old.schema_version == SCHEMA_VERSION_WITHOUT_MIGRATION
    assert "shards" in json.loads(plan_bytes(old))["tables"]["b"]
    assert parse_plan(plan_bytes(old)) == old
    assert plan_id_of(json.loads(plan_bytes(old))) == old.plan_id != plan.plan_id


# --------------------------------------------------------------------------- round trip

_finite = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)
_count = st.integers(min_value=0, max_value=MAX_MEMORY_BYTES)
_rows = st.integers(min_value=0, max_value=MAX_NUM_EMBEDDINGS)
_cols = st.integers(min_value=0, max_value=MAX_EMBEDDING_DIM)
_hex = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
# Any name a plan may hold: no control characters or bidi controls, no surrounding spaces.
_names = st.text(
    st.characters(
        blacklist_categories=("Cc", "Cs"),
        blacklist_characters="\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069",
    ),
    min_size=1,
    max_size=12,
).filter(lambda name: name == name.strip())
_WORLD = 65536


@st.composite
def _shardings(draw: st.DrawFn) -> ParameterSharding:
    """A sharding whose shards tile its table: a row split on ranks of the plan (the
    plan's own consistency check refuses anything else)."""
    rows, cols = draw(_rows.filter(bool)), draw(_cols.filter(bool))
    cuts = sorted(draw(st.sets(st.integers(1, rows), max_size=4)) - {rows})
    bounds = [0, *cuts, rows]
    ranks = draw(
        st.lists(st.integers(0, _WORLD - 1), min_size=len(bounds) - 1, max_size=len(bounds) - 1)
    )
    shards = [
        Shard(offsets=(start, 0), sizes=(end - start, cols), rank=rank)
        for start, end, rank in zip(bounds[:-1], bounds[1:], ranks, strict=True)
    ]
    return ParameterSharding(
        sharding_type=draw(
            st.sampled_from(ShardingType).filter(lambda t: t is not ShardingType.DATA_PARALLEL)
        ),
        compute_kernel=draw(st.sampled_from(ComputeKernel)),
        ranks=ranks,
        shards=shards,
        cache_load_factor=draw(st.none() | st.floats(min_value=1e-9, max_value=1.0)),
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


@st.composite
def _plans(draw: st.DrawFn) -> ShardingPlan:
    """A plan at 1.1 (shard lists) or 2.0 (the same tables as runs)."""
    plan = draw(_explicit_plans)
    if not draw(st.booleans()):
        return plan
    drawn = draw(st.dictionaries(_names, layouts(), min_size=1, max_size=4))
    tables = {name: compact_sharding(sharding) for name, sharding in drawn.items()}
    return plan.model_copy(update={"schema_version": SCHEMA_VERSION, "tables": tables})


_explicit_plans = st.builds(
    ShardingPlan,
    schema_version=st.just(SCHEMA_VERSION_WITHOUT_MIGRATION),
    plan_id=_hex,
    request_hash=_hex,
    planner_version=_names,
    world_size=st.just(_WORLD),
    tables=st.dictionaries(_names, _shardings(), min_size=1, max_size=4),
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
@given(_plans())
def test_plan_round_trips_losslessly(plan):
    assert ShardingPlan.model_validate_json(plan.model_dump_json()) == plan
    encoded = plan_bytes(plan)
    decoded = parse_plan(encoded)
    assert decoded == plan
    assert plan_bytes(decoded) == encoded


@settings(max_examples=100)
@given(
    rows=st.integers(1, MAX_NUM_EMBEDDINGS),
    dim=st.integers(1, MAX_EMBEDDING_DIM),
    factor=st.floats(min_value=0.0, max_value=MAX_POOLING_FACTOR),
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


# --------------------------------------------------------------------------- hostile JSON


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1_000, 100_000])
def test_nesting_deeper_than_the_limit_is_refused_before_parsing(depth):
    body = '{"topology": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"
    with pytest.raises(InputError) as caught:
        parse_request(body, source="req.json")
    (problem,) = caught.value.problems
    assert problem.as_dict() == {
        "path": "",
        "message": f"arrays and objects nest {depth} deep; shardplan documents nest at most "
        "64 (MAX_JSON_DEPTH)",
        "value": str(depth),
    }


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("{}", 1),
        ('{"a": [[1], {"b": [2]}]}', 4),
        (r'["[[[", "]", "\\"]', 1),  # brackets and escapes inside strings do not count
        (r'["\\\"[[", {"k\\": []}]', 3),
        ("7", 0),
    ],
)
def test_json_depth_counts_only_structure(text, depth):
    assert json_depth(text) == depth == json_depth(text.encode())
    json.loads(text)  # the cases are valid JSON


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab/\n'),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet='[]{}"\\k'), inner, max_size=3)
    ),
    max_leaves=12,
)


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


@settings(max_examples=300)
@given(_json, st.booleans())
def test_json_depth_is_the_depth_of_any_json(value, ascii_only):
    assert json_depth(json.dumps(value, ensure_ascii=ascii_only)) == _depth(value)


def test_plans_nest_far_less_than_the_limit():
    _, plan = _two_table_plan()
    assert json_depth(plan_bytes(plan)) == 4 < MAX_JSON_DEPTH  # 5 with a [first, last] run
    assert json_depth(plan_bytes(expand_plan(plan))) == 6


def test_integers_too_long_to_convert_are_named_by_path():
    body = '{"topology": {"world_size": 4}, "tables": [{"name": "t", "num_embeddings": %s}]}'
    with pytest.raises(InputError) as caught:
        parse_request(body % ("-" + "9" * 5000))
    (problem,) = caught.value.problems
    assert problem.as_dict() == {
        "path": "tables[0].num_embeddings",
        "message": "an integer of 5000 digits is too long to read; no field accepts more than "
        "19 digits",
        "value": "-99999999999... (5000 digits)",
    }


def test_long_integers_within_int_limits_name_the_field_and_limit():
    body = '{"topology": {"world_size": 4}, "tables": [{"name": "t", "num_embeddings": %d, "embedding_dim": 8}]}'
    with pytest.raises(InputError) as caught:
        parse_request(body % 10**4000)
    (problem,) = caught.value.problems
    assert problem.render() == (
        "tables[0].num_embeddings = 100000000000... (4001 digits): Input should be less than "
        "or equal to 1099511627776"
    )
