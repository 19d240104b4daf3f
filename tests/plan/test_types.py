"""The plan vocabulary: defaults, derived topology facts, and clear errors for bad input."""

from __future__ import annotations

import json

import pytest

from planner_service.plan.codec import parse_request
from planner_service.plan.errors import InputError
from planner_service.plan.types import (
    DEFAULT_HBM_BYTES,
    MAX_BANDWIDTH_BYTES_PER_S,
    MAX_BATCH_SIZE,
    MAX_EMBEDDING_DIM,
    MAX_FEATURES_PER_TABLE,
    MAX_MEMORY_BYTES,
    MAX_MIN_PARTITION,
    MAX_NUM_EMBEDDINGS,
    MAX_POOLING_FACTOR,
    MAX_SEED,
    MAX_TIME_LIMIT_S,
    MAX_WORLD_SIZE,
    MIN_BANDWIDTH_BYTES_PER_S,
    ComputeDevice,
    DataType,
    OptimizerType,
    PlanRequest,
    PoolingType,
    ShardingType,
)
from tests.support.builders import request, table


def _problem_text(document: dict) -> str:
    with pytest.raises(InputError) as caught:
        parse_request(json.dumps(document), source="req.json")
    text = caught.value.render()
    assert text.startswith("req.json: ")
    return text


def _doc(**overrides) -> dict:
    document = {"topology": {"world_size": 4}, "tables": [table("t0")]}
    document.update(overrides)
    return document


def test_defaults_follow_torchrec():
    req = request([table("t0")], world_size=4)
    topology = req.topology
    assert topology.local_world_size == 4  # one host unless told otherwise
    assert topology.compute_device is ComputeDevice.CUDA
    assert topology.hbm_bytes == DEFAULT_HBM_BYTES == 32 * 1024**3
    assert topology.ddr_bytes == 128 * 1024**3
    assert topology.hbm_bw_bytes_per_s == 897 * 1024**3
    t0 = req.tables[0]
    assert t0.feature_names == ["t0"]
    assert t0.pooling_factors == [1.0]
    assert t0.pooling is PoolingType.SUM
    assert t0.data_type is DataType.FP32 and t0.data_type.size_bytes == 4
    assert t0.optimizer is OptimizerType.SGD
    assert req.batch_size == 512
    assert req.options.time_limit_s == 10.0
    assert req.constraints.hbm_headroom_fraction == 0.15


def test_cpu_topology_has_no_hbm():
    req = request([table("t0")], topology={"compute_device": "cpu"})
    assert req.topology.hbm_bytes == 0
    assert all(device.hbm_bytes == 0 for device in req.topology.devices())


def test_hosts_and_rank_overrides():
    req = request(
        [table("t0")],
        world_size=8,
        topology={
            "local_world_size": 4,
            "rank_overrides": [{"rank": 5, "hbm_bytes": 1000, "ddr_bw_bytes_per_s": 7e9}],
        },
    )
    topology = req.topology
    assert topology.num_hosts == 2
    assert topology.host_of(5) == 1
    assert list(topology.host_ranks(1)) == [4, 5, 6, 7]
    assert topology.device(5).hbm_bytes == 1000
    assert topology.device(5).ddr_bw_bytes_per_s == 7e9
    assert topology.device(5).ddr_bytes == topology.ddr_bytes  # not overridden: inherited
    assert topology.device(4).hbm_bytes == DEFAULT_HBM_BYTES


def test_enums_inside_strings_outside():
    req = request([table("t0")], constraints={"tables": {"t0": {"sharding_types": ["row_wise"]}}})
    assert req.constraints.for_table("t0").sharding_types == [ShardingType.ROW_WISE]
    assert json.loads(req.model_dump_json())["constraints"]["tables"]["t0"]["sharding_types"] == [
        "row_wise"
    ]


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            _doc(tables=[table("t0", rows=-5)]),
            "tables[0].num_embeddings = -5: Input should be greater than or equal to 1",
        ),
        (
            _doc(tables=[table("t0", dim=0)]),
            "tables[0].embedding_dim = 0: Input should be greater than or equal to 1",
        ),
        (
            _doc(topology={"world_size": 0}),
            "topology.world_size = 0: Input should be greater than or equal to 1",
        ),
        (
            _doc(topology={"world_size": 6, "local_world_size": 4}),
            "local_world_size 4 does not divide world_size 6",
        ),
        (_doc(tables=[table("a"), table("a")]), "tables[1].name 'a' duplicates tables[0].name"),
        (
            _doc(tables=[table("a", feature_names=["f"]), table("b", feature_names=["f"])]),
            "tables[1] ('b') uses feature 'f', already used by tables[0]",
        ),
        (
            _doc(tables=[table("a", feature_names=["f", "f"])]),
            "feature_names of table 'a' lists 'f' more than once",
        ),
        (
            _doc(tables=[table("a", feature_names=["f", "g"], pooling_factors=[1.0])]),
            "pooling_factors of table 'a' has 1 entries but the table has 2 feature_names",
        ),
        (
            _doc(tables=[table("s", pooling="none", is_weighted=True)]),
            "table 's' has is_weighted true with pooling none",
        ),
        (
            _doc(tables=[table("t0", colour="red")]),
            "tables[0].colour = 'red': unknown field; accepted fields here: name, num_embeddings",
        ),
        (_doc(surprise=1), "surprise = 1: unknown field; accepted fields here: topology, tables"),
        (
            _doc(tables=[table("t0", pooling="max")]),
            "tables[0].pooling = 'max': Input should be 'sum', 'mean' or 'none'",
        ),
        (_doc(batch_size="512"), "batch_size = '512': Input should be a valid integer"),
        (_doc(tables=[]), "tables: List should have at least 1 item"),
        (_doc(topology={}), "topology.world_size: required field is missing"),
        (
            _doc(constraints={"tables": {"nope": {"ranks": [0]}}}),
            "constraints.tables.nope names table 'nope', which is not in tables; known tables: t0",
        ),
        (
            _doc(constraints={"tables": {"t0": {"ranks": [9]}}}),
            "constraints.tables.t0.ranks has rank 9, out of range for world_size 4",
        ),
        (
            _doc(constraints={"colocate": [["t0", "ghost"]]}),
            "constraints.colocate[0] names table 'ghost'",
        ),
        (
            _doc(topology={"world_size": 2, "rank_overrides": [{"rank": 2, "hbm_bytes": 1}]}),
            "rank_overrides[0].rank 2 is out of range; ranks are 0..1",
        ),
        (
            _doc(constraints={"hbm_headroom_fraction": 1.5}),
            "constraints.hbm_headroom_fraction = 1.5: Input should be less than 1",
        ),
        (
            _doc(options={"gap_limit": 1.0}),
            "options.gap_limit = 1.0: Input should be less than 1",
        ),
        (
            _doc(options={"gap_limit": -0.01}),
            "options.gap_limit = -0.01: Input should be greater than or equal to 0",
        ),
    ],
)
def test_bad_input_names_field_value_and_fix(document, expected):
    assert expected in _problem_text(document)


@pytest.mark.parametrize("field", ["colocate", "separate"])
def test_a_table_twice_in_one_group_is_refused_at_the_group(field):
    """``separate: [["a", "a"]]`` was accepted, and the plan stored for it failed our own
    validator (a table always shares its ranks with itself)."""
    document = _doc(tables=[table("a"), table("b")], constraints={field: [["b", "a"], ["a", "a"]]})
    with pytest.raises(InputError) as caught:
        parse_request(json.dumps(document))
    [problem] = caught.value.problems
    assert problem.path == f"constraints.{field}[1]"
    assert problem.message == f"names table 'a' twice; list each table of a {field} group once"


def test_every_problem_is_reported_at_once():
    text = _problem_text(_doc(tables=[table("a", rows=0, dim=0)], batch_size=-1))
    assert "tables[0].num_embeddings = 0" in text
    assert "tables[0].embedding_dim = 0" in text
    assert "batch_size = -1" in text


def test_malformed_json_and_duplicate_keys():
    with pytest.raises(InputError, match="not valid JSON: Expecting"):
        parse_request(b'{"topology": {"world_size": 4}, ', source="req.json")
    with pytest.raises(InputError, match="key 'world_size' appears twice"):
        parse_request(b'{"topology": {"world_size": 4, "world_size": 8}, "tables": []}')


def test_nan_is_refused():
    document = json.dumps(_doc(tables=[table("t0", pooling_factors=[1.0])])).replace("1.0", "NaN")
    with pytest.raises(InputError, match="pooling_factors"):
        parse_request(document)


# --------------------------------------------------------------------------- limits


def _at(document: dict, path: tuple, value) -> dict:
    """``document`` with ``value`` placed at ``path`` (missing objects are created)."""
    node = document
    for key in path[:-1]:
        node = node[key] if isinstance(key, int) or key in node else node.setdefault(key, {})
    node[path[-1]] = value
    return document


# (where, the largest value accepted, the smallest refused, the limit as the message says it);
# the error's path is ``where`` as a JSON path, into the list for per-feature values.
LIMITS = [
    (("tables", 0, "embedding_dim"), MAX_EMBEDDING_DIM, MAX_EMBEDDING_DIM + 1, "65536"),
    (("tables", 0, "num_embeddings"), MAX_NUM_EMBEDDINGS, MAX_NUM_EMBEDDINGS + 1, "1099511627776"),
    (("topology", "world_size"), MAX_WORLD_SIZE, MAX_WORLD_SIZE + 1, "131072"),
    (("topology", "hbm_bytes"), MAX_MEMORY_BYTES, MAX_MEMORY_BYTES + 1, "9007199254740992"),
    (("topology", "ddr_bytes"), MAX_MEMORY_BYTES, MAX_MEMORY_BYTES + 1, "9007199254740992"),
    (
        ("constraints", "dense_bytes_per_rank"),
        MAX_MEMORY_BYTES,
        MAX_MEMORY_BYTES + 1,
        "9007199254740992",
    ),
    (
        ("topology", "hbm_bw_bytes_per_s"),
        MAX_BANDWIDTH_BYTES_PER_S,
        1.0000001e16,
        "10000000000000000",
    ),
    (("topology", "inter_host_bw_bytes_per_s"), MIN_BANDWIDTH_BYTES_PER_S, 999_999.9, "1000000"),
    (("tables", 0, "pooling_factors"), [MAX_POOLING_FACTOR], [1_000_000.1], "1000000"),
    (("batch_size",), MAX_BATCH_SIZE, MAX_BATCH_SIZE + 1, "16777216"),
    (("tables", 0, "batch_sizes"), [MAX_BATCH_SIZE], [MAX_BATCH_SIZE + 1], "16777216"),
    (("options", "time_limit_s"), MAX_TIME_LIMIT_S, MAX_TIME_LIMIT_S + 0.5, "86400"),
    (("options", "seed"), MAX_SEED, MAX_SEED + 1, "2147483647"),
    (
        ("constraints", "tables", "t0", "min_partition"),
        MAX_MIN_PARTITION,
        MAX_MIN_PARTITION + 1,
        "65536",
    ),
    (
        ("tables", 0, "feature_names"),
        [f"f{i}" for i in range(MAX_FEATURES_PER_TABLE)],
        [f"f{i}" for i in range(MAX_FEATURES_PER_TABLE + 1)],
        "4096",
    ),
]


@pytest.mark.parametrize(
    ("where", "largest", "refused", "limit"), LIMITS, ids=lambda v: str(v)[:40]
)
def test_every_number_has_a_documented_maximum(where, largest, refused, limit):
    def document(value):
        base = _doc(topology={"world_size": 1}, tables=[table("t0")])
        if where[-1] in ("pooling_factors", "batch_sizes"):
            base["tables"][0]["feature_names"] = ["t0"]
        return _at(base, where, value)

    parse_request(json.dumps(document(largest)))
    with pytest.raises(InputError) as caught:
        parse_request(json.dumps(document(refused)))
    (problem,) = caught.value.problems
    path = ".".join(map(str, where)).replace(".0.", "[0].")
    assert problem.path == (
        path + "[0]" if where[-1] in ("pooling_factors", "batch_sizes") else path
    )
    assert limit in problem.message
    assert problem.as_dict()["value"]


def test_limits_are_in_the_json_schema():
    schema = json.dumps(PlanRequest.model_json_schema())
    for limit in ("65536", "1099511627776", "131072", "9007199254740992", "1e+16", "16777216"):
        assert limit in schema


@pytest.mark.parametrize(
    ("document", "path", "value", "message"),
    [
        (
            _doc(topology={"world_size": 4, "local_world_size": 8}),
            "topology.local_world_size",
            "8",
            "local_world_size 8 is more than world_size 4",
        ),
        (
            _doc(topology={"world_size": 2, "rank_overrides": [{"rank": 0}, {"rank": 0}]}),
            "topology.rank_overrides[1].rank",
            "0",
            "appears twice",
        ),
        (
            _doc(constraints={"tables": {"t0": {"ranks": [3, 1, 3]}}}),
            "constraints.tables.t0.ranks",
            "3",
            "lists rank 3 more than once; list each rank once (at most world_size 4 ranks)",
        ),
        (
            _doc(tables=[table("a"), table("a")]),
            "tables[1].name",
            "'a'",
            "duplicates tables[0].name",
        ),
        (
            _doc(tables=[table("a", feature_names=["f", "g", "f"])]),
            "tables[0].feature_names",
            "'f'",
            "lists 'f' more than once",
        ),
        (
            _doc(constraints={"separate": [["t0", "ghost"]]}),
            "constraints.separate[0]",
            "'ghost'",
            "names table 'ghost'",
        ),
    ],
)
def test_checks_across_fields_name_the_field_and_value(document, path, value, message):
    with pytest.raises(InputError) as caught:
        parse_request(json.dumps(document))
    (problem,) = caught.value.problems
    assert problem.as_dict() == {"path": path, "message": problem.message, "value": value}
    assert message in problem.message


# --------------------------------------------------------------------------- byte sizes

SIZED = {
    "topology": {
        "world_size": 2,
        "hbm_bytes": "80GiB",
        "ddr_bytes": "0.5 TB",
        "rank_overrides": [{"rank": 1, "hbm_bytes": "40 GiB", "ddr_bytes": "256000MB"}],
    },
    "tables": [table("t0", rows=100_000, dim=64)],
    "constraints": {"dense_bytes_per_rank": "1.5GiB"},
}
COUNTED = {
    "topology": {
        "world_size": 2,
        "hbm_bytes": 80 * 2**30,
        "ddr_bytes": 500 * 10**9,
        "rank_overrides": [{"rank": 1, "hbm_bytes": 40 * 2**30, "ddr_bytes": 256 * 10**9}],
    },
    "tables": [table("t0", rows=100_000, dim=64)],
    "constraints": {"dense_bytes_per_rank": 3 * 2**29},
}


def test_byte_sizes_read_as_their_integers_with_the_same_hash_and_plan():
    from planner_service.plan.codec import request_hash
    from planner_service.solve.pipeline import solve

    sized, counted = parse_request(json.dumps(SIZED)), parse_request(json.dumps(COUNTED))
    assert sized == counted
    assert sized.model_dump() == counted.model_dump()  # the integer is the canonical form
    assert request_hash(sized) == request_hash(counted)
    sized_plan, counted_plan = solve(sized).plan, solve(counted).plan
    assert sized_plan is not None and counted_plan is not None
    assert sized_plan.plan_id == counted_plan.plan_id


@pytest.mark.parametrize(
    ("written", "size"),
    [
        ("1B", 1),
        ("1KB", 1000),
        ("1KiB", 1024),
        ("2MB", 2 * 10**6),
        ("2MiB", 2 * 2**20),
        ("80GB", 80 * 10**9),
        ("80GiB", 80 * 2**30),
        ("3TB", 3 * 10**12),
        ("3TiB", 3 * 2**40),
        (" 512 MB ", 512 * 10**6),
        ("1.5KiB", 1536),
        ("0.25GiB", 2**28),
        ("8192TiB", MAX_MEMORY_BYTES),
        ("0B", 0),
    ],
)
def test_every_unit(written, size):
    document = _doc(topology={"world_size": 1, "hbm_bytes": written})
    assert parse_request(json.dumps(document)).topology.hbm_bytes == size


@pytest.mark.parametrize(
    ("where", "written", "message"),
    [
        (("topology", "hbm_bytes"), "80gib", "has unknown unit 'gib' (units are case-sensitive"),
        (("topology", "ddr_bytes"), "80Gb", "units are case-sensitive: 'GB'"),
        (("topology", "hbm_bytes"), "9PiB", "has unknown unit 'PiB'; units: B, KB, MB"),
        (("topology", "hbm_bytes"), "80", "write an integer number of bytes, or a number and"),
        (("topology", "hbm_bytes"), "-1GiB", "is not a byte size"),
        (("topology", "hbm_bytes"), "1e9B", "is not a byte size"),
        (("topology", "hbm_bytes"), "0.3B", "is 0.300 bytes, not a whole number"),
        (
            ("topology", "hbm_bytes"),
            "8193TiB",
            "is 9,008,298,766,368,768 bytes, more than the most accepted, 9007199254740992",
        ),
        (("constraints", "dense_bytes_per_rank"), "9008TB", "more than the most accepted"),
        (("topology", "rank_overrides", 0, "ddr_bytes"), "1" * 30 + "GB", "is not a byte size"),
    ],
)
def test_a_bad_size_names_the_field_the_value_as_written_and_what_is_accepted(
    where, written, message
):
    document = _doc(topology={"world_size": 1, "rank_overrides": [{"rank": 0}]})
    with pytest.raises(InputError) as caught:
        parse_request(json.dumps(_at(document, where, written)))
    (problem,) = caught.value.problems
    assert problem.path == ".".join(map(str, where)).replace(".0.", "[0].")
    assert problem.as_dict()["value"] == repr(written)
    assert message in problem.message


def test_sizes_are_only_for_byte_fields():
    with pytest.raises(InputError, match="batch_size = '512': Input should be a valid integer"):
        parse_request(json.dumps(_doc(batch_size="512")))
    with pytest.raises(InputError, match="hbm_bw_bytes_per_s"):
        parse_request(json.dumps(_doc(topology={"world_size": 1, "hbm_bw_bytes_per_s": "1GB"})))


def test_the_json_schema_offers_integers_and_size_strings():
    topology = PlanRequest.model_json_schema()["$defs"]["Topology"]["properties"]
    integer, string = topology["ddr_bytes"]["anyOf"]
    assert integer == {"type": "integer", "minimum": 0, "maximum": MAX_MEMORY_BYTES}
    assert string["type"] == "string" and "80GiB" in string["examples"]
