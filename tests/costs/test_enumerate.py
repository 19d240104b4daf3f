"""Enumeration: which options exist, how they split tables, and which tables fit nowhere."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_service.costs.enumerate import column_widths, enumerate_options, fit_options
from planner_service.costs.options import Placement, ShardingOption
from planner_service.plan.types import (
    MAX_EMBEDDING_DIM,
    ComputeKernel,
    ParameterSharding,
    Shard,
    ShardingType,
    TableProblemCode,
    ViolationCode,
)
from planner_service.validate.validator import validate_plan
from tests.support import builders
from tests.support.builders import request, table

GIB = 2**30


def _kinds(req) -> set[tuple[str, str]]:
    return {
        (o.sharding_type.value, o.compute_kernel.value)
        for entry in enumerate_options(req)
        for o in entry.options
    }


@pytest.mark.parametrize(
    ("dim", "min_partition", "widths"),
    [
        (512, 128, [512, 256, 128]),
        (128, 128, [128]),
        (100, 128, [100]),
        (10, 128, [10]),
        (256, 64, [256, 128, 64]),
        (384, 128, [384, 192, 128]),
        (200, 128, [200]),
        (96, 4, [96, 48, 32, 24, 16, 12, 8, 4]),
    ],
)
def test_column_widths(dim, min_partition, widths):
    assert column_widths(dim, min_partition) == widths


def test_column_widths_are_the_aligned_divisors_up_to_the_largest_dim():
    """Divisors by trial division up to sqrt(dim) give exactly the widths the definition
    does (every multiple of 4 from min_partition to dim / 2 that divides dim)."""

    def by_definition(dim: int, min_partition: int) -> list[int]:
        aligned = range(4, dim // 2 + 1, 4)
        return [dim, *(w for w in reversed(aligned) if dim % w == 0 and w >= min_partition)]

    dims = [*range(1, 1025), 3 * 2**14, 2 * 3 * 5 * 7 * 11 * 13, MAX_EMBEDDING_DIM]
    for dim in dims:
        for min_partition in (1, 4, 6, 128, MAX_EMBEDDING_DIM):
            assert column_widths(dim, min_partition) == by_definition(dim, min_partition)
    assert column_widths(MAX_EMBEDDING_DIM, 128) == [2**k for k in range(16, 6, -1)]


def test_every_type_and_kernel_on_cuda():
    req = request([table("t", dim=512)], world_size=4)
    options = enumerate_options(req)[0].options
    assert (
        len(options) == 3 * 3 + 2 * 3 * 3 + 1
    )  # tw, rw, twrw x3 kernels; cw, twcw x3 x3 widths; dp
    cw = [
        o
        for o in options
        if o.sharding_type is ShardingType.COLUMN_WISE and o.compute_kernel is ComputeKernel.FUSED
    ]
    assert [[s.sizes[1] for s in o.shards] for o in cw] == [[512], [256, 256], [128] * 4]
    assert cw[2].offsets() == [(0, 0), (0, 128), (0, 256), (0, 384)]


@pytest.mark.parametrize(
    ("rows", "world", "local", "rw", "twrw"),
    [
        (10, 4, 2, [3, 3, 3, 1], [5, 5]),
        (5, 4, 4, [2, 2, 1, 0], [2, 2, 1, 0]),
        (1, 4, 2, [1, 0, 0, 0], [1, 0]),
        (3, 8, 4, [1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 0]),
        (7, 1, 1, [7], [7]),
    ],
)
def test_row_splits(rows, world, local, rw, twrw):
    req = request([table("t", rows=rows)], world_size=world, topology={"local_world_size": local})
    by_kind = {
        o.sharding_type: o
        for o in enumerate_options(req)[0].options
        if o.compute_kernel in (ComputeKernel.FUSED, ComputeKernel.DENSE)
    }
    assert [s.sizes[0] for s in by_kind[ShardingType.ROW_WISE].shards] == rw
    assert [s.sizes[0] for s in by_kind[ShardingType.TABLE_ROW_WISE].shards] == twrw
    assert len(by_kind[ShardingType.DATA_PARALLEL].shards) == world


def test_constraints_filter_types_kernels_and_widths():
    req = request(
        [table("a", dim=512), table("b", dim=512)],
        constraints={
            "tables": {
                "a": {
                    "sharding_types": ["column_wise", "data_parallel"],
                    "compute_kernels": ["fused_uvm", "dense"],
                    "min_partition": 256,
                }
            }
        },
    )
    a = enumerate_options(req)[0].options
    assert [(o.sharding_type.value, o.compute_kernel.value, len(o.shards)) for o in a] == [
        ("column_wise", "fused_uvm", 1),
        ("column_wise", "fused_uvm", 2),
        ("data_parallel", "dense", 4),
    ]


def test_pins_rule_out_options_that_need_every_rank_or_a_whole_host():
    req = request(
        [table("t")],
        world_size=4,
        topology={"local_world_size": 2},
        constraints={"tables": {"t": {"ranks": [0, 1]}}},
    )
    kinds = {o.sharding_type for o in enumerate_options(req)[0].options}
    assert kinds == {
        ShardingType.TABLE_WISE,
        ShardingType.COLUMN_WISE,
        ShardingType.TABLE_ROW_WISE,
        ShardingType.TABLE_COLUMN_WISE,
    }
    split_host = request(
        [table("t")],
        world_size=4,
        topology={"local_world_size": 2},
        constraints={"tables": {"t": {"ranks": [1, 2]}}},
    )
    kinds = {o.sharding_type for o in enumerate_options(split_host)[0].options}
    assert ShardingType.TABLE_ROW_WISE not in kinds


def test_sequence_tables_get_every_sharding_type_the_runtime_runs():
    """TorchRec's EmbeddingCollection runs four types; shardplan's runtime the host-local
    two as well, so a sequence table is offered all six (on two hosts: table-row-wise
    differs from row-wise there, see ``prepare``)."""
    req = request([table("s", pooling="none")], topology={"local_world_size": 2})
    assert {kind for kind, _ in _kinds(req)} == {kind.value for kind in ShardingType}


def test_identical_shapes_share_options_but_keep_their_names():
    req = request([table("a"), table("b"), table("c", rows=7)])
    a, b, c = enumerate_options(req)
    assert (a.table.name, b.table.name) == ("a", "b")
    assert a.options is b.options or all(x is y for x, y in zip(a.options, b.options, strict=True))
    assert c.options[0] is not a.options[0]


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 5000),
    dim=st.sampled_from([4, 8, 12, 64, 128, 256, 384, 512]),
    hosts=st.integers(1, 3),
    local=st.integers(1, 4),
)
def test_every_option_tiles_its_table(rows, dim, hosts, local):
    """Turn each option into a plan entry (fixed shards on their ranks, the rest on host 0)
    and let the validator check tiling and layout."""
    world = hosts * local
    req = request(
        [table("t", rows=rows, dim=dim)], world_size=world, topology={"local_world_size": local}
    )
    for option in enumerate_options(req)[0].options:
        sharding = _as_sharding(option, req)
        plan = builders.plan(req, {"t": sharding})
        bad = [
            v
            for v in validate_plan(req, plan)
            if v.code
            in {
                ViolationCode.TILING,
                ViolationCode.SHARD_LAYOUT,
                ViolationCode.COLUMN_WIDTH,
                ViolationCode.NOT_ONE_HOST,
            }
        ]
        assert bad == [], (option.sharding_type, option.compute_kernel, bad)


def _as_sharding(option: ShardingOption, req) -> ParameterSharding:
    local = req.topology.num_local_ranks
    if option.placement is Placement.FIXED:
        ranks = list(range(len(option.shards)))
    elif option.sharding_type is ShardingType.TABLE_ROW_WISE:
        ranks = list(range(local))
    else:
        ranks = [i % local for i in range(len(option.shards))]
    shards = [
        Shard(offsets=offsets, sizes=shard.sizes, rank=rank)
        for offsets, shard, rank in zip(option.offsets(), option.shards, ranks, strict=True)
    ]
    return builders.sharding(
        option.sharding_type, option.compute_kernel, shards, option.cache_load_factor
    )


# --------------------------------------------------------------------------- fit


def test_fit_drops_options_no_rank_can_hold():
    # 1 GiB HBM per rank, 15% headroom: a 2 GiB table fits only row-wise over 4 ranks or in DDR.
    req = request([table("big", rows=2**24, dim=32)], world_size=4, topology={"hbm_bytes": GIB})
    fitted = fit_options(req, enumerate_options(req))
    kinds = {(o.sharding_type.value, o.compute_kernel.value) for o in fitted.tables[0].options}
    assert ("table_wise", "fused") not in kinds
    assert ("row_wise", "fused") in kinds and ("table_wise", "fused_uvm") in kinds
    assert fitted.problems == []


def test_table_that_fits_nowhere_is_reported_with_numbers():
    req = request(
        [table("huge", rows=2**26, dim=64), table("ok")],
        world_size=2,
        topology={"hbm_bytes": GIB, "ddr_bytes": 4 * GIB},
    )
    fitted = fit_options(req, enumerate_options(req))
    (problem,) = fitted.problems
    assert problem.code is TableProblemCode.DOES_NOT_FIT and problem.table == "huge"
    assert problem.largest_rank_hbm_bytes == GIB - int(GIB * 0.15)
    assert problem.largest_rank_ddr_bytes == 4 * GIB
    assert problem.needed_ddr_bytes > 4 * GIB
    assert "fits no rank under any allowed option" in problem.message
    assert "needs 260.00 KiB HBM and 8.00 GiB DDR for one shard" in problem.message
    assert "offers 870.40 MiB HBM and 4.00 GiB DDR after the reservation" in problem.message
    assert fitted.tables[1].options  # the other table is unaffected


def test_constraints_that_empty_a_table_are_named():
    req = request(
        [table("s")],
        constraints={
            "tables": {"s": {"sharding_types": ["data_parallel"], "compute_kernels": ["fused"]}}
        },
    )
    (problem,) = fit_options(req, enumerate_options(req)).problems
    assert problem.code is TableProblemCode.NO_ALLOWED_OPTION
    assert (
        "constraints sharding_types ['data_parallel'] and compute_kernels ['fused'] leave no "
        "sharding option" in problem.message
    )
    assert "data_parallel runs only on dense" in problem.message


# --------------------------------------------------------------------------- CLI


def test_options_command_prints_estimates(run_cli, tmp_path):
    path = tmp_path / "request.json"
    path.write_text(
        request(
            [table("t", rows=100, dim=10)], world_size=2, options={"cost_model": "torchrec-1.8"}
        ).model_dump_json()
    )
    result = run_cli("options", path)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["cost_model"] == "torchrec-1.8"
    first = document["tables"]["t"][0]
    assert (first["sharding_type"], first["compute_kernel"]) == ("table_wise", "fused")
    shard = first["shards"][0]
    assert shard["offsets"] == [0, 0] and shard["sizes"] == [100, 10]
    assert shard["perf"]["fwd_compute"] == pytest.approx(3.27460077428233e-04, rel=1e-12)
    assert set(shard["perf"]) == {
        "fwd_compute",
        "fwd_comms",
        "bwd_compute",
        "bwd_comms",
        "prefetch",
        "input_dist",
        "total",
    }
    assert set(shard["storage"]) == {"hbm_bytes", "ddr_bytes"}
    reservation = document["reservation"]["ranks"][0]
    assert reservation["ranks"] == "0-1"
    assert reservation["headroom_bytes"] == int(32 * GIB * 0.15)
    assert document["problems"] == []


def test_options_command_exits_3_when_a_table_fits_nowhere(run_cli, tmp_path):
    path = tmp_path / "request.json"
    path.write_text(
        json.dumps(
            {
                "topology": {"world_size": 2, "hbm_bytes": GIB, "ddr_bytes": GIB},
                "tables": [{"name": "huge", "num_embeddings": 2**28, "embedding_dim": 64}],
            }
        )
    )
    result = run_cli("options", path)
    assert result.returncode == 3
    assert json.loads(result.stdout)["problems"][0]["table"] == "huge"
    assert "does_not_fit: table 'huge' fits no rank" in result.stderr


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 5_000_000),
            st.sampled_from([16, 64, 128]),
            st.sampled_from([1.0, 4.0]),
            st.booleans(),
        ),
        min_size=2,
        max_size=5,
    )
)
def test_perf_shared_across_shapes_is_what_each_table_gets_alone(shapes):
    # Perf is estimated once per shard width for tables that differ only in rows; every
    # table's options must still cost what they cost when it is enumerated alone.
    tables = [
        table(f"t{i}", rows=rows, dim=dim, pooling_factors=[factor], is_weighted=weighted)
        for i, (rows, dim, factor, weighted) in enumerate(shapes)
    ]
    together = enumerate_options(request(tables, world_size=4, topology={"local_world_size": 2}))
    for entry, alone_table in zip(together, tables, strict=True):
        (alone,) = enumerate_options(
            request([alone_table], world_size=4, topology={"local_world_size": 2})
        )
        assert [[s.perf for s in o.shards] for o in entry.options] == [
            [s.perf for s in o.shards] for o in alone.options
        ]
