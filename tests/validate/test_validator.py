"""The validator: plans that must pass, and plans that must fail with the right reasons."""

from __future__ import annotations

import tracemalloc

import pytest

from planner_service import PLANNER_VERSION
from planner_service.costs.enumerate import enumerate_options
from planner_service.plan.codec import request_hash
from planner_service.plan.types import (
    MAX_WORLD_SIZE,
    CompactSharding,
    ComputeKernel,
    ParameterSharding,
    Shard,
    ShardingType,
    ViolationCode,
)
from planner_service.validate.validator import check_layout, runnable_violations, validate_plan
from tests.support import builders
from tests.support.builders import request, seal_plan, table

GIB = 2**30
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
    return req, _mixed_tables_for(req)


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
    violations = validate_plan(req, builders.plan(req, tables, explicit=True))
    matching = [v for v in violations if v.code is expected]
    assert matching, violations
    assert any(text in v.message and v.table == name for v in matching), matching


def _runs(name: str, kind: ShardingType, **fields: object) -> CompactSharding:
    kernel = "dense" if kind is ShardingType.DATA_PARALLEL else "fused"
    data = {"sharding_type": kind.value, "compute_kernel": kernel, **fields}
    return CompactSharding.model_validate(data)


@pytest.mark.parametrize(
    ("name", "sharding", "expected", "text"),
    [
        (
            "tw",
            _runs("tw", ShardingType.TABLE_WISE, shape=[1000, 64], ranks=[4]),
            ViolationCode.RANK_OUT_OF_RANGE,
            "ranks name rank 4, but ranks are 0..3",
        ),
        (
            "tw",
            _runs("tw", ShardingType.TABLE_WISE, shape=[999, 64], ranks=[0]),
            ViolationCode.TILING,
            "shape [999, 64] is not the table's [1000, 64]",
        ),
        (
            "rw",
            _runs("rw", ShardingType.ROW_WISE, shape=[10, 32], ranks=[[0, 3]], rows_per_shard=5),
            ViolationCode.SHARD_LAYOUT,
            "row_wise must put row blocks of 3 rows ([3, 3, 3, 1]) on ranks [0, 1, 2, 3] in "
            "order; got blocks of rows_per_shard 5 on ranks [0..3]",
        ),
        (
            "rw",
            _runs(
                "rw", ShardingType.ROW_WISE, shape=[10, 32], ranks=[1, 0, 2, 3], rows_per_shard=3
            ),
            ViolationCode.SHARD_LAYOUT,
            "got blocks of rows_per_shard 3 on ranks [1, 0, 2, 3]",
        ),
        (
            "cw",
            _runs(
                "cw",
                ShardingType.COLUMN_WISE,
                shape=[50, 512],
                ranks=[0, 1],
                column_widths=[[510, 1], [2, 1]],
            ),
            ViolationCode.COLUMN_WIDTH,
            "is 510 columns wide; column shard widths must be multiples of 4",
        ),
        (
            "twcw",
            _runs(
                "twcw",
                ShardingType.TABLE_COLUMN_WISE,
                shape=[7, 256],
                ranks=[1, 2],
                column_widths=[[128, 2]],
            ),
            ViolationCode.NOT_ONE_HOST,
            "found ranks 1..2 on hosts 0..1",
        ),
        (
            "dp",
            _runs("dp", ShardingType.DATA_PARALLEL, shape=[3, 8], ranks=[[0, 2]]),
            ViolationCode.SHARD_LAYOUT,
            "one full replica on every rank 0..3, got replicas on ranks [0, 1, 2]",
        ),
    ],
)
def test_bad_runs_are_named(name, sharding, expected, text):
    req, tables = _mixed()
    tables[name] = sharding
    violations = validate_plan(req, builders.plan(req, tables))
    matching = [v for v in violations if v.code is expected]
    assert matching, violations
    assert any(text in v.message and v.table == name for v in matching), matching


def test_a_row_split_over_every_rank_is_checked_on_its_runs():
    req = request([table("big", rows=10**9, dim=128)], world_size=4096)
    rows_per_shard = -(-(10**9) // 4096)
    sharding = _runs(
        "big",
        ShardingType.ROW_WISE,
        shape=[10**9, 128],
        ranks=[[0, 4095]],
        rows_per_shard=rows_per_shard,
    )
    assert check_layout(req.topology, req.tables[0], sharding) == []
    assert "shards" not in sharding.__dict__  # no shard was listed to check it
    shifted = sharding.model_copy(update={"rows_per_shard": rows_per_shard + 1})
    [violation] = check_layout(req.topology, req.tables[0], shifted)
    assert violation.code is ViolationCode.SHARD_LAYOUT


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


def test_capacity_is_what_is_left_after_headroom_and_dense_reservation():
    """With half of HBM as headroom and 1 GiB of dense bytes reserved, a table fills what
    is left exactly on ``hbm_bytes = 2 * (table + 1 GiB)``, and overflows it by a byte on
    two bytes less."""
    probe = request([table("t", rows=10**6)], world_size=2)
    used = builders.plan(probe, {"t": builders.table_wise(probe, "t", 0)}).rank_stats[0].hbm_bytes

    def violations(hbm_bytes: int) -> list:
        req = request(
            [table("t", rows=10**6)],
            world_size=2,
            topology={"hbm_bytes": hbm_bytes},
            constraints={"hbm_headroom_fraction": 0.5, "dense_bytes_per_rank": GIB},
        )
        return validate_plan(req, builders.plan(req, {"t": builders.table_wise(req, "t", 0)}))

    assert violations(2 * (used + GIB)) == []
    [over] = violations(2 * (used + GIB) - 2)
    assert (over.code, over.rank) == (ViolationCode.HBM_CAPACITY, 0)
    assert f"GiB ({used + 2 * GIB - 1:,} bytes) (over by 1 bytes)" in over.message


def test_heterogeneous_capacity():
    req = request(
        [table("a"), table("b")],
        world_size=2,
        topology={"hbm_bytes": 10**6, "rank_overrides": [{"rank": 1, "hbm_bytes": 100}]},
        constraints={"hbm_headroom_fraction": 0.0},
    )
    on_0 = {"a": builders.table_wise(req, "a", 0), "b": builders.table_wise(req, "b", 0)}
    assert validate_plan(req, builders.plan(req, on_0)) == []
    on_both = {**on_0, "b": builders.table_wise(req, "b", 1)}
    violations = validate_plan(req, builders.plan(req, on_both))
    assert [(v.code, v.rank) for v in violations] == [(ViolationCode.HBM_CAPACITY, 1)]


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
    honest = builders.plan(req, tables).solver
    objective = honest.objective
    report = honest.model_copy(update={"lower_bound": 2 * objective, "gap": 0.5})
    plan = builders.plan(req, tables, report=report)
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


# --------------------------------------------------------------------------- recomputed


def _enumerated_storage(req, name, kind, kernel=ComputeKernel.FUSED):
    """The bytes the solver's enumerator gives the first shard of ``name``'s option."""
    entry = next(e for e in enumerate_options(req) if e.table.name == name)
    option = next(
        o for o in entry.options if o.sharding_type is kind and o.compute_kernel is kernel
    )
    return option.shards[0].storage


def test_memory_is_recomputed_from_the_shards_not_read_from_rank_stats():
    """A solver that wrote ``hbm_bytes: 0`` into rank_stats passed every check: capacities
    were checked on the plan's own numbers. Now they are checked on each shard's storage
    (the estimators' numbers, as the solver's), and the plan's numbers must agree."""
    req = request(
        [table("big", rows=3 * 10**6, dim=128), table("uvm", rows=10**6, dim=64)],
        world_size=2,
        topology={"hbm_bytes": GIB, "ddr_bytes": GIB // 8},
    )
    tables = {
        "big": builders.table_wise(req, "big", 0),
        "uvm": builders.table_wise(req, "uvm", 1, ComputeKernel.FUSED_UVM),
    }
    big = _enumerated_storage(req, "big", ShardingType.TABLE_WISE)
    uvm = _enumerated_storage(req, "uvm", ShardingType.TABLE_WISE, ComputeKernel.FUSED_UVM)
    usable_hbm, usable_ddr = GIB - int(GIB * 0.15), GIB // 8
    assert big.hbm_bytes > usable_hbm and uvm.ddr_bytes > usable_ddr

    violations = validate_plan(req, builders.plan(req, tables, hbm_bytes=[0, 0], ddr_bytes=[0, 0]))
    assert [(v.code, v.rank) for v in violations] == [
        (ViolationCode.RANK_STATS, 0),
        (ViolationCode.RANK_STATS, 1),
        (ViolationCode.HBM_CAPACITY, 0),
        (ViolationCode.DDR_CAPACITY, 1),
    ]
    stats_0, stats_1, hbm, ddr = (v.message for v in violations)
    assert f"hbm_bytes 0 (the shards use {big.hbm_bytes:,})" in stats_0
    assert f"ddr_bytes 0 (the shards use {uvm.ddr_bytes:,})" in stats_1
    assert f"over by {big.hbm_bytes - usable_hbm:,} bytes" in hbm
    assert f"over by {uvm.ddr_bytes - usable_ddr:,} bytes" in ddr


def test_perf_totals_objective_and_critical_path_are_recomputed():
    req, tables = _mixed()
    honest = builders.plan(req, tables)
    assert validate_plan(req, honest) == []
    stats = [s.model_copy() for s in honest.rank_stats]
    slower = stats[2].perf.model_copy(update={"total": stats[2].perf.total * 2})
    stats[2] = stats[2].model_copy(update={"perf": slower})
    report = honest.solver.model_copy(
        update={"objective": honest.solver.objective * 2, "critical_path": 0.0}
    )
    lied = seal_plan(
        request=req,
        planner_version="test",
        tables=honest.tables,
        rank_stats=stats,
        solver=report.model_copy(update={"lower_bound": 0.0, "gap": 1.0}),
    )
    violations = validate_plan(req, lied)
    assert [(v.code, v.rank) for v in violations] == [
        (ViolationCode.RANK_STATS, 2),
        (ViolationCode.SOLVER_REPORT, None),
        (ViolationCode.SOLVER_REPORT, None),
    ]
    total, objective, critical_path = (v.message for v in violations)
    recomputed = honest.rank_stats[2].perf.total
    assert f"perf.total {slower.total} (the shards add up to {recomputed})" in total
    assert f"objective {report.objective} is not the most loaded rank's" in objective
    assert f"recomputed total {honest.solver.objective}" in objective
    assert f"critical_path 0.0 is not the recomputed {honest.solver.critical_path}" in critical_path


@pytest.mark.parametrize("version", ["shardplan-0.8.0", PLANNER_VERSION])
def test_a_price_that_differs_in_another_versions_plan_says_which_versions(version):
    """Each planner version prices with its own cost model: a plan made by another version
    whose ranks' times differ from this version's says both versions and what to do; one
    of this version does not, nor does a report that is wrong whatever the model."""
    req, tables = _mixed()
    honest = builders.plan(req, tables)
    stats = [s.model_copy() for s in honest.rank_stats]
    slower = stats[1].perf.model_copy(update={"total": stats[1].perf.total * 1.2})
    stats[1] = stats[1].model_copy(update={"perf": slower})
    report = honest.solver.model_copy(update={"lower_bound": honest.solver.objective * 2})
    older = seal_plan(
        request=req, planner_version=version, tables=honest.tables, rank_stats=stats, solver=report
    )
    violations = validate_plan(req, older)
    codes = [(v.code, v.rank) for v in violations]
    assert codes[:1] == [(ViolationCode.RANK_STATS, 1)]
    priced, *report_violations = (v.message for v in violations)
    note = f"this plan was made by {version}; this validator is {PLANNER_VERSION}"
    assert (note in priced) is (version != PLANNER_VERSION)
    if version != PLANNER_VERSION:
        assert f"validate with {version}" in priced
    assert any("lower_bound" in m for m in report_violations)
    assert not any("this plan was made by" in m for m in report_violations)


def test_a_plan_for_another_request_is_refused():
    """``shardplan validate`` called a plan made for batch_size 512 valid for 4096."""
    tables = [table("a"), table("b", dim=64)]
    made_for = request(tables, world_size=2)
    plan = builders.plan(
        made_for,
        {"a": builders.table_wise(made_for, "a", 0), "b": builders.row_wise(made_for, "b")},
    )
    other = request(tables, world_size=2, batch_size=4096)
    violations = [
        v for v in validate_plan(other, plan) if v.code is ViolationCode.REQUEST_HASH_MISMATCH
    ]
    assert len(violations) == 1
    assert plan.request_hash in violations[0].message
    assert request_hash(other) in violations[0].message


def _wide_request(world: int, overrides: list[dict], tables: str = "abc") -> object:
    shapes = {"a": {"rows": 10**5, "dim": 64}, "b": {"dim": 256}, "c": {"rows": 10**4}}
    return request(
        [table(name, **shapes[name]) for name in tables],
        world_size=world,
        topology={"local_world_size": 8, "rank_overrides": overrides},
        batch_size=1,  # a rank's output buffers hold the global batch: 65,536 x 512 is a lot
    )


@pytest.mark.slow  # 65,536 ranks: a scale test
def test_a_plan_on_65536_ranks_with_every_rank_overridden_validates():
    """Each rank's capacity and device class come from its override, looked up once: the
    validator took seconds here, and quadratic time in the overrides."""
    world = 65_536
    slow = {"hbm_bw_bytes_per_s": 100 * GIB, "hbm_bytes": 16 * GIB}
    req = _wide_request(world, [{"rank": r, **(slow if r % 2 else {})} for r in range(world)])
    tables = {
        "a": builders.row_wise(req, "a"),
        "b": builders.column_wise(req, "b", [128, 128], [3, world - 1]),
        "c": builders.table_wise(req, "c", world - 2),
    }
    assert validate_plan(req, builders.plan(req, tables)) == []


def test_validation_costs_the_plan_not_the_world_size():
    """A 2 KB request and plan for the largest world (131,072 ranks), rank_stats listing
    the three ranks that hold shards: the validator once built an object per rank (50 s,
    1.75 GB for ten million ranks, which the types now refuse). Its memory now follows
    the documents' size."""
    world = MAX_WORLD_SIZE
    req = _wide_request(world, [{"rank": world - 1, "hbm_bytes": 8 * GIB}], tables="bc")
    tables = {
        "b": builders.column_wise(req, "b", [128, 128], [3, world - 1]),
        "c": builders.table_wise(req, "c", 0),
    }
    short = builders.plan(req, tables, stats_ranks=[0, 3, world - 1])
    tracemalloc.start()
    try:
        violations = validate_plan(req, short)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [(v.code, v.message) for v in violations] == [
        (
            ViolationCode.RANK_STATS,
            "rank_stats must list every rank 0..131071 once; got ranks [0, 3, 131071]",
        )
    ]
    assert peak < 4 * 2**20


def test_a_plan_of_the_same_tables_from_another_request_is_runnable():
    """``runnable_violations`` (``measure --versus``): a plan made for another request of
    the same tables (another cost model and batch: another hash, other prices) runs them;
    a plan whose shards do not cover a table, or is for another world size, does not."""
    req, tables = _mixed()
    other_req = request(
        [table(t.name, rows=t.num_embeddings, dim=t.embedding_dim) for t in req.tables],
        world_size=4,
        topology={"local_world_size": 2},
        batch_size=4096,
        options={"cost_model": "torchrec-1.8"},
    )
    other = builders.plan(other_req, _mixed_tables_for(other_req))
    assert ViolationCode.REQUEST_HASH_MISMATCH in _codes(req, other)
    assert runnable_violations(req, other) == []
    assert runnable_violations(req, builders.plan(req, tables)) == []
    short = request(
        [table(t.name, rows=t.num_embeddings - (t.name == "tw"), dim=t.embedding_dim)
         for t in req.tables],
        world_size=4,
        topology={"local_world_size": 2},
    )  # fmt: skip
    codes = {
        v.code for v in runnable_violations(req, builders.plan(short, _mixed_tables_for(short)))
    }
    assert ViolationCode.TILING in codes or ViolationCode.SHARD_LAYOUT in codes
    wider = request(
        [table(t.name, rows=t.num_embeddings, dim=t.embedding_dim) for t in req.tables],
        world_size=8,
        topology={"local_world_size": 2},
    )
    codes = {
        v.code for v in runnable_violations(req, builders.plan(wider, _mixed_tables_for(wider)))
    }
    assert ViolationCode.WORLD_SIZE_MISMATCH in codes


def _mixed_tables_for(req):
    """``_mixed``'s layout, for another request of its tables."""
    return {
        "tw": builders.table_wise(req, "tw", 3),
        "rw": builders.row_wise(req, "rw"),
        "cw": builders.column_wise(req, "cw", [128, 256, 128], [0, 1, 0]),
        "twrw": builders.table_row_wise(req, "twrw", host=1),
        "twcw": builders.column_wise(req, "twcw", [128, 128], [2, 3], kind=TWCW),
        "dp": builders.data_parallel(req, "dp"),
        "uvm": builders.table_wise(req, "uvm", 1, ComputeKernel.FUSED_UVM_CACHING),
    }
