"""The validator: plans that must pass, and plans that must fail with the right reasons."""

from __future__ import annotations

import pytest

from planner_service.codec import seal_plan
from planner_service.types import (
    ComputeKernel,
    ParameterSharding,
    Shard,
    ShardingType,
    SolverReport,
    SolverStatus,
    ViolationCode,
)
from planner_service.validator import validate_plan
from tests import builders
from tests.builders import request, table

CW = ShardingType.COLUMN_WISE
TWCW = ShardingType.TABLE_COLUMN_WISE


def _codes(req, plan) -> list[ViolationCode]:
    return [violation.code for violation in validate_plan(req, plan)]


def _mixed():
    req = request(
        [
            table("tw", rows=1000, dim=64),
            table("rw", rows=10, dim=32),
            table("cw", rows=50, dim=512),
            table("twrw", rows=5, dim=16),
            table("twcw", rows=7, dim=256),
            table("dp", rows=3, dim=8),
            table("uvm", rows=100, dim=16),
        ],
        world_size=4,
        topology={"local_world_size": 2},
    )
    tables = {
        "tw": builders.table_wise(req, "tw", 3),
        "rw": builders.row_wise(req, "rw"),
        "cw": builders.column_wise(req, "cw", [128, 256, 128], [0, 1, 0]),
        "twrw": builders.table_row_wise(req, "twrw", host=1),
        "twcw": builders.column_wise(req, "twcw", [128, 128], [2, 3], kind=TWCW),
        "dp": builders.data_parallel(req, "dp"),
        "uvm": builders.table_wise(req, "uvm", 1, ComputeKernel.FUSED_UVM_CACHING),
    }
    return req, tables


def test_mixed_plan_with_every_sharding_type_is_valid():
    req, tables = _mixed()
    assert validate_plan(req, builders.plan(req, tables)) == []


@pytest.mark.parametrize(("rows", "world"), [(1, 4), (5, 4), (10, 4), (3, 3), (1, 1), (4, 8)])
def test_row_wise_edge_cases_are_valid(rows, world):
    req = request([table("t", rows=rows)], world_size=world)
    assert validate_plan(req, builders.plan(req, {"t": builders.row_wise(req, "t")})) == []


def test_missing_and_unknown_tables():
    req, tables = _mixed()
    tables["ghost"] = tables.pop("tw")
    violations = validate_plan(req, builders.plan(req, tables))
    assert [(v.code, v.table) for v in violations] == [
        (ViolationCode.TABLE_MISSING, "tw"),
        (ViolationCode.TABLE_UNKNOWN, "ghost"),
    ]


def _replace_shards(req, name, kind, shards, kernel=ComputeKernel.FUSED):
    return builders.sharding(kind, kernel, shards)


@pytest.mark.parametrize(
    ("name", "shards", "kind", "expected", "text"),
    [
        (
            "cw",
            [
                Shard(offsets=(0, 0), sizes=(50, 256), rank=0),
                Shard(offsets=(0, 384), sizes=(50, 128), rank=1),
            ],
            CW,
            ViolationCode.TILING,
            "columns 256..384 are not covered",
        ),
        (
            "cw",
            [
                Shard(offsets=(0, 0), sizes=(50, 256), rank=0),
                Shard(offsets=(0, 128), sizes=(50, 384), rank=1),
            ],
            CW,
            ViolationCode.TILING,
            "columns 128..256 are covered more than once",
        ),
        (
            "cw",
            [
                Shard(offsets=(0, 0), sizes=(50, 510), rank=0),
                Shard(offsets=(0, 510), sizes=(50, 2), rank=1),
            ],
            CW,
            ViolationCode.COLUMN_WIDTH,
            "is 510 columns wide; column shard widths must be multiples of 4",
        ),
        (
            "cw",
            [Shard(offsets=(0, 0), sizes=(40, 512), rank=0)],
            CW,
            ViolationCode.SHARD_LAYOUT,
            "covers rows 0..40, must cover all 50 rows",
        ),
        (
            "tw",
            [Shard(offsets=(0, 0), sizes=(1000, 64), rank=4)],
            ShardingType.TABLE_WISE,
            ViolationCode.RANK_OUT_OF_RANGE,
            "shard 0 is on rank 4, but ranks are 0..3",
        ),
        (
            "tw",
            [Shard(offsets=(0, 0), sizes=(999, 64), rank=0)],
            ShardingType.TABLE_WISE,
            ViolationCode.TILING,
            "sizes [999, 64]; a full copy needs offsets [0, 0] sizes [1000, 64]",
        ),
        (
            "rw",
            [
                Shard(offsets=(0, 0), sizes=(5, 32), rank=0),
                Shard(offsets=(5, 0), sizes=(5, 32), rank=1),
                Shard(offsets=(10, 0), sizes=(0, 32), rank=2),
                Shard(offsets=(10, 0), sizes=(0, 32), rank=3),
            ],
            ShardingType.ROW_WISE,
            ViolationCode.SHARD_LAYOUT,
            "row_wise must put row blocks [3, 3, 3, 1] on ranks [0, 1, 2, 3] in order",
        ),
        (
            "rw",
            [
                Shard(offsets=(0, 0), sizes=(3, 32), rank=0),
                Shard(offsets=(3, 0), sizes=(3, 32), rank=1),
                Shard(offsets=(6, 0), sizes=(3, 32), rank=2),
                Shard(offsets=(8, 0), sizes=(2, 32), rank=3),
            ],
            ShardingType.ROW_WISE,
            ViolationCode.TILING,
            "rows 8..9 are covered more than once",
        ),
        (
            "twcw",
            [
                Shard(offsets=(0, 0), sizes=(7, 128), rank=1),
                Shard(offsets=(0, 128), sizes=(7, 128), rank=2),
            ],
            TWCW,
            ViolationCode.NOT_ONE_HOST,
            "found hosts [0, 1]",
        ),
        (
            "dp",
            [Shard(offsets=(0, 0), sizes=(3, 8), rank=r) for r in (0, 1, 2)],
            ShardingType.DATA_PARALLEL,
            ViolationCode.SHARD_LAYOUT,
            "data_parallel needs one full replica on every rank 0..3, got replicas on ranks [0, 1, 2]",
        ),
    ],
)
def test_bad_shards_are_named(name, shards, kind, expected, text):
    req, tables = _mixed()
    kernel = ComputeKernel.DENSE if kind is ShardingType.DATA_PARALLEL else ComputeKernel.FUSED
    tables[name] = builders.sharding(kind, kernel, shards)
    violations = validate_plan(req, builders.plan(req, tables))
    matching = [v for v in violations if v.code is expected]
    assert matching, violations
    assert any(text in v.message and v.table == name for v in matching), matching


def test_kernel_rules():
    req, tables = _mixed()
    tables["dp"] = tables["dp"].model_copy(update={"compute_kernel": ComputeKernel.FUSED})
    tables["tw"] = tables["tw"].model_copy(update={"compute_kernel": ComputeKernel.DENSE})
    codes = _codes(req, builders.plan(req, tables))
    assert codes.count(ViolationCode.KERNEL_INCOMPATIBLE) == 2

    cpu = request([table("t")], world_size=2, topology={"compute_device": "cpu"})
    uvm = builders.table_wise(cpu, "t", 0, ComputeKernel.FUSED_UVM)
    violations = validate_plan(cpu, builders.plan(cpu, {"t": uvm}))
    assert [v.code for v in violations] == [ViolationCode.KERNEL_INCOMPATIBLE]
    assert "needs a GPU; on compute_device cpu use fused" in violations[0].message


def test_ranks_field_must_match_shards():
    req, tables = _mixed()
    tables["cw"] = tables["cw"].model_copy(update={"ranks": [0, 1, 2]})
    violations = validate_plan(req, builders.plan(req, tables))
    assert [v.code for v in violations] == [ViolationCode.RANKS_MISMATCH]
    assert (
        "[0, 1, 2] must list each shard's rank in shard order: [0, 1, 0]" in violations[0].message
    )


def test_capacity_uses_plan_stats_after_headroom_and_dense_reservation():
    gib = 1024**3
    req = request(
        [table("t")],
        world_size=2,
        topology={"hbm_bytes": 10 * gib, "ddr_bytes": 20 * gib},
        constraints={"hbm_headroom_fraction": 0.1, "dense_bytes_per_rank": gib},
    )
    tables = {"t": builders.table_wise(req, "t", 0)}
    usable = 9 * gib - gib
    assert validate_plan(req, builders.plan(req, tables, hbm_bytes=[usable, 0])) == []
    violations = validate_plan(
        req, builders.plan(req, tables, hbm_bytes=[usable + 1, 0], ddr_bytes=[0, 20 * gib + 5])
    )
    assert [(v.code, v.rank) for v in violations] == [
        (ViolationCode.HBM_CAPACITY, 0),
        (ViolationCode.DDR_CAPACITY, 1),
    ]
    assert "over by 1 bytes" in violations[0].message
    assert "after reserving 2.000 GiB" in violations[0].message


def test_heterogeneous_capacity():
    req = request(
        [table("t")],
        world_size=2,
        topology={"hbm_bytes": 1000, "rank_overrides": [{"rank": 1, "hbm_bytes": 100}]},
        constraints={"hbm_headroom_fraction": 0.0},
    )
    plan = builders.plan(req, {"t": builders.table_wise(req, "t", 0)}, hbm_bytes=[500, 500])
    assert [(v.code, v.rank) for v in validate_plan(req, plan)] == [(ViolationCode.HBM_CAPACITY, 1)]


def test_constraints_are_enforced_and_all_reported():
    req = request(
        [table("a", dim=256), table("b"), table("c"), table("d")],
        world_size=4,
        constraints={
            "tables": {
                "a": {"sharding_types": ["table_wise"], "min_partition": 256},
                "b": {"compute_kernels": ["fused_uvm"], "ranks": [2, 3]},
                "c": {"cache_load_factor": 0.5},
            },
            "colocate": [["a", "b"]],
            "separate": [["c", "d"]],
        },
    )
    tables = {
        "a": builders.column_wise(req, "a", [128, 128], [0, 1]),
        "b": builders.table_wise(req, "b", 1),
        "c": builders.table_wise(req, "c", 3, ComputeKernel.FUSED_UVM_CACHING),
        "d": builders.table_wise(req, "d", 3),
    }
    violations = validate_plan(req, builders.plan(req, tables))
    got = sorted((v.code.value, v.table) for v in violations)
    assert got == sorted(
        [
            ("sharding_type_not_allowed", "a"),
            ("min_partition", "a"),
            ("min_partition", "a"),
            ("compute_kernel_not_allowed", "b"),
            ("pinned_ranks", "b"),
            ("cache_load_factor", "c"),
            ("colocate", "a"),
            ("separate", "c"),
        ]
    )
    messages = "\n".join(v.message for v in violations)
    assert "pinned to ranks [2, 3] but has shards on [1]" in messages
    assert "'a' on [0, 1]; 'b' on [1]" in messages
    assert "tables 'c' and 'd' share rank(s) [3]" in messages
    assert "cache_load_factor 0.2 differs from the constraint's 0.5" in messages


def test_tampered_plan_and_bad_report():
    req, tables = _mixed()
    plan = builders.plan(
        req,
        tables,
        report=SolverReport(status=SolverStatus.FEASIBLE, objective=1.0, lower_bound=2.0, gap=0.5),
    )
    codes = _codes(req, plan)
    assert codes.count(ViolationCode.SOLVER_REPORT) == 2
    tampered = plan.model_copy(update={"world_size": 8})
    assert {ViolationCode.PLAN_ID_MISMATCH, ViolationCode.WORLD_SIZE_MISMATCH} <= set(
        _codes(req, tampered)
    )


def test_rank_stats_must_cover_every_rank():
    req, tables = _mixed()
    plan = builders.plan(req, tables)
    sealed = seal_plan(
        request=req,
        planner_version="test",
        tables=plan.tables,
        rank_stats=plan.rank_stats[:3],
        solver=plan.solver,
    )
    violations = validate_plan(req, sealed)
    assert [v.code for v in violations] == [ViolationCode.RANK_STATS]
    assert "every rank 0..3 once; got ranks [0, 1, 2]" in violations[0].message


def test_many_violations_at_once():
    req, tables = _mixed()
    shard = Shard(offsets=(0, 0), sizes=(1, 1), rank=9)
    for name in ("tw", "rw"):
        tables[name] = ParameterSharding(
            sharding_type=ShardingType.TABLE_WISE,
            compute_kernel=ComputeKernel.FUSED,
            ranks=[9],
            shards=[shard],
        )
    violations = validate_plan(req, builders.plan(req, tables))
    assert {v.table for v in violations} == {"tw", "rw"}
    assert len(violations) >= 4
