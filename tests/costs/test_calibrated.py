"""The calibrated cost model: profiles refused when their numbers are unusable, shard
costs that follow the profile's coefficients, fixed costs the plan reports and the validator
recomputes, and bounds that stay proofs with fixed costs in the objective."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_service.costs.calibrated import fixed_perf, rows_touched
from planner_service.costs.enumerate import enumerate_options
from planner_service.plan.canonical import canonical_bytes, sha256_hex
from planner_service.plan.codec import plan_bytes
from planner_service.plan.errors import InputError
from planner_service.plan.types import DeviceProfile, ShardingType, profile_id_of
from planner_service.solve.pipeline import solve
from planner_service.validate.usage import rank_usage
from planner_service.validate.validator import validate_plan
from tests.solve.oracles import placements, problem_of
from tests.support.builders import device_profile, kernel_coefficients, request, table


def calibrated(tables, world_size=2, profile=None, **options):
    profile = profile or device_profile()
    return request(
        tables,
        world_size=world_size,
        topology={"compute_device": "cpu"},
        options={"cost_model": "calibrated", "device_profile": profile, **options},
    )


def mixed_tables(n=6):
    return [
        table(
            f"t{i}",
            rows=[400, 4_000, 40_000][i % 3],
            dim=[16, 32, 64][i % 3],
            pooling_factors=[float(1 + 5 * i)],
        )
        for i in range(n)
    ]


# ---- profiles


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("kernels", 0, "fwd_us_per_id"), -0.1, "fwd_us_per_id"),
        (("kernels", 0, "bwd_ns_per_byte"), 1e9, "bwd_ns_per_byte"),
        (("collectives", 0, "latency_ms"), float("inf"), "latency_ms"),
        (("runtime", "step_ms"), float("nan"), "step_ms"),
        (("runtime", "sharding_type_ms", "row_wise"), -1.0, "row_wise"),
        (("runtime", "placement_ns_per_byte"), float("nan"), "placement_ns_per_byte"),
        (("runtime", "placement_ns_per_byte"), 1e4, "placement_ns_per_byte"),
        (("schema_version",), "9.0", "schema_version"),
    ],
)
def test_a_profile_with_an_unusable_number_is_refused_naming_its_field(path, value, named):
    data = device_profile()
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(InputError) as refused:
        calibrated([table("t")], profile=data)
    assert named in refused.value.render()


def test_a_profile_without_a_kernel_of_its_device_is_refused():
    data = device_profile()
    data["kernels"] = [k for k in data["kernels"] if k["compute_kernel"] != "dense"]
    with pytest.raises(InputError) as refused:
        calibrated([table("t")], profile=data)
    assert "dense" in refused.value.render()


def test_a_cuda_profile_for_a_cpu_topology_is_refused_naming_the_field():
    with pytest.raises(InputError) as refused:
        calibrated([table("t")], profile=device_profile("cuda"))
    text = refused.value.render()
    assert "options.device_profile.compute_device" in text and "cuda" in text


def test_calibrated_without_a_profile_and_a_profile_without_calibrated_are_refused():
    with pytest.raises(InputError, match="needs a device profile"):
        request([table("t")], options={"cost_model": "calibrated"})
    with pytest.raises(InputError, match="only under cost_model 'calibrated'"):
        request(
            [table("t")],
            topology={"compute_device": "cpu"},
            options={"device_profile": device_profile()},
        )


def test_an_inline_profile_gets_its_content_address_and_a_wrong_one_is_refused():
    req = calibrated([table("t")])
    profile = req.options.device_profile
    assert profile is not None
    assert req.options.device_profile_id == profile_id_of(profile)
    with pytest.raises(InputError, match="not the content address"):
        calibrated([table("t")], device_profile_id="0" * 64)


def test_requests_of_the_other_models_keep_their_json():
    req = request([table("t")])
    assert "device_profile" not in json.dumps(req.model_dump(mode="json"))


# ---- shard costs


def test_shard_costs_follow_the_profile():
    """Doubling every kernel coefficient doubles the compute parts and nothing else."""
    slow = device_profile()
    slow["kernels"] = [kernel_coefficients("fused", 2.0), kernel_coefficients("dense", 2.0)]
    base, doubled = (
        enumerate_options(
            calibrated([table("t", rows=5_000, dim=64, pooling_factors=[8.0])], profile=p)
        )[0]
        .options[0]
        .shards[0]
        .perf[0]
        for p in (device_profile(), slow)
    )
    assert doubled.fwd_compute == pytest.approx(2 * base.fwd_compute)
    assert doubled.bwd_compute == pytest.approx(2 * base.bwd_compute)
    assert doubled.input_dist == pytest.approx(base.input_dist)
    assert doubled.fwd_comms == pytest.approx(base.fwd_comms)


def test_an_empty_row_block_costs_nothing_and_row_blocks_split_the_ids():
    req = calibrated([table("t", rows=3, dim=16, pooling_factors=[4.0])], world_size=4)
    option = next(
        o for o in enumerate_options(req)[0].options if o.sharding_type is ShardingType.ROW_WISE
    )
    sizes = [shard.sizes[0] for shard in option.shards]
    computes = [shard.perf[0].fwd_compute for shard in option.shards]
    assert sizes == [1, 1, 1, 0]
    assert computes[3] == 0.0 and computes[0] > 0.0


def test_a_sequence_tables_row_shards_send_their_rows_back_in_an_all_to_all():
    """A pooled table's row blocks reduce-scatter their partial bags (adjoint: all-gather);
    a sequence table's send their rows back whole in an all-to-all, for row-wise and
    table-row-wise alike. The profile prices the reduce-scatter and all-gather dearer, so
    the two are told apart."""
    profile = device_profile()
    for entry in profile["collectives"]:
        if entry["collective"] != "all_to_all":
            entry["ns_per_byte"] = 50.0
    tables = [table("p", rows=4000, dim=16), table("s", rows=4000, dim=16, pooling="none")]
    pooled, sequence = (
        next(o for o in entry.options if o.sharding_type is ShardingType.ROW_WISE)
        for entry in enumerate_options(calibrated(tables, profile=profile))
    )
    per_byte = [
        option.shards[0].perf[0].fwd_comms / option.shards[0].storage.output_bytes
        for option in (pooled, sequence)
    ]
    assert per_byte[1] < per_byte[0] / 10  # the all-to-all's price, not the reduce-scatter's
    assert sequence.shards[0].perf[0].bwd_comms == pytest.approx(
        sequence.shards[0].perf[0].fwd_comms
    )


def test_rows_touched_is_the_expected_distinct_rows():
    assert rows_touched(10, 0) == 0.0
    assert rows_touched(1_000_000, 10) == pytest.approx(10, rel=1e-4)
    assert rows_touched(10, 10_000) == pytest.approx(10)


def test_fixed_costs_count_only_the_types_a_plan_uses():
    req = calibrated(mixed_tables())
    base = fixed_perf(req, ())
    with_rows = fixed_perf(req, (ShardingType.ROW_WISE,))
    assert base.total > 0
    # the row-wise reduce-scatter and all-gather latencies plus its own runtime work
    assert with_rows.total == pytest.approx(base.total + 0.2 + 0.2 + 0.3)
    assert fixed_perf(request([table("t")]), (ShardingType.ROW_WISE,)).total == 0.0


def test_each_collection_the_tables_make_pays_the_steps_fixed_costs():
    """Pooled and sequence tables, and tables of two optimizers, are collections of their
    own: each distributes its ids (two all-to-alls) and exchanges its outputs (one each
    way) and does the runtime's own work; a sharding type's costs come once."""
    pooled = [table("p0"), table("p1")]
    one = fixed_perf(calibrated(pooled), ())
    per_collection = 1.0 + 4 * 0.2  # step_ms, and the four all-to-all latencies
    assert one.total == pytest.approx(per_collection)
    with_sequence = calibrated([*pooled, table("s", pooling="none")])
    assert fixed_perf(with_sequence, ()).total == pytest.approx(2 * per_collection)
    adagrad = calibrated([table("p0"), table("p1", optimizer="rowwise_adagrad")])
    assert fixed_perf(adagrad, ()).total == pytest.approx(2 * per_collection)
    rows = fixed_perf(with_sequence, (ShardingType.ROW_WISE,)).total
    assert rows == pytest.approx(2 * per_collection + 0.2 + 0.2 + 0.3)


# ---- plans


def test_a_calibrated_plan_reports_its_fixed_costs_and_validates():
    req = calibrated(mixed_tables())
    plan = solve(req).plan
    assert plan is not None
    assert validate_plan(req, plan) == []
    used = {t.sharding_type for t in plan.tables.values()}
    fixed = fixed_perf(req, used).total
    usage = rank_usage(req, plan.tables)
    assert plan.solver.objective == pytest.approx(usage.objective)
    assert all(stats.perf.total >= fixed for stats in plan.rank_stats)


def test_a_plan_whose_rank_stats_leave_out_the_fixed_costs_is_invalid():
    req = calibrated(mixed_tables())
    plan = solve(req).plan
    other = request(
        [t.model_dump(mode="json") for t in req.tables],
        world_size=2,
        topology={"compute_device": "cpu"},
    )
    # the same placement under the default model reports other numbers
    assert validate_plan(other, plan)


def test_calibrated_planning_is_deterministic_for_a_profile():
    req = calibrated(mixed_tables(10), time_limit_s=5.0)
    first, second = solve(req).plan, solve(req).plan
    assert first is not None and second is not None
    assert plan_bytes(first) == plan_bytes(second)


def test_a_profile_that_makes_row_wise_dear_moves_tables_off_it():
    cheap_rows = device_profile()
    cheap_rows["runtime"]["sharding_type_ms"] = {}
    dear_rows = device_profile()
    dear_rows["runtime"]["sharding_type_ms"] = {"row_wise": 1_000.0}
    tables = [table("big", rows=1_000_000, dim=128, pooling_factors=[60.0])] + mixed_tables(3)
    dear = solve(calibrated(tables, profile=dear_rows)).plan
    assert dear is not None
    assert all(t.sharding_type is not ShardingType.ROW_WISE for t in dear.tables.values())
    assert dear.solver.objective < 1_000.0


def _brute_force_with_fixed_costs(req) -> float:
    problem, _ = problem_of(req)
    per_table = [list(placements(problem, t)) for t in range(len(problem.tables))]
    best = math.inf
    from planner_service.solve.problem import loads_of

    for combination in itertools.product(*per_table):
        choices = list(combination)
        loads = loads_of(problem, choices)
        if not loads.fits(problem):
            continue
        used = {problem.tables[t].options[c.option].sharding_type for t, c in enumerate(choices)}
        best = min(best, loads.objective + fixed_perf(req, used).total)
    return best


@settings(max_examples=12, deadline=None)
@given(
    factors=st.lists(st.sampled_from([1.0, 4.0, 20.0, 60.0]), min_size=2, max_size=3),
    rows_ms=st.sampled_from([0.0, 0.05, 2.0]),
)
def test_the_bound_with_fixed_costs_is_below_the_best_plan_and_the_plan_above_it(factors, rows_ms):
    """On instances small enough to try every plan: bound <= optimum <= plan objective."""
    profile = device_profile()
    profile["runtime"]["sharding_type_ms"] = {"row_wise": rows_ms, "data_parallel": rows_ms / 2}
    tables = [
        table(
            f"t{i}",
            rows=[300, 9_000, 50_000][i % 3],
            dim=16,
            pooling_factors=[f],
            sharding_types=None,
        )
        for i, f in enumerate(factors)
    ]
    for entry in tables:
        entry.pop("sharding_types")
    req = calibrated(tables, profile=profile)
    plan = solve(req).plan
    assert plan is not None
    optimum = _brute_force_with_fixed_costs(req)
    assert plan.solver.lower_bound <= optimum * (1 + 1e-9)
    assert plan.solver.objective >= optimum * (1 - 1e-9)
    assert plan.solver.objective <= optimum * (1 + req.options.gap_limit) + 1e-9


def _options_of(profile, tables, world_size=2):
    return {
        entry.table.name: {o.sharding_type: o for o in entry.options}
        for entry in enumerate_options(calibrated(tables, world_size, profile=profile))
    }


def test_sequence_rows_put_back_in_batch_order_cost_the_placement_term():
    """Row blocks' and data-parallel replicas' sequence rows are placed by a gather each
    way (a replica's own share forward, every rank's backward); whole and column shards'
    rows, and pooled tables, pay nothing for it."""
    placing = device_profile(schema_version="1.2")
    placing["runtime"]["placement_ns_per_byte"] = 3.0
    tables = [
        table("s", rows=4_000, dim=16, pooling_factors=[5.0], pooling="none"),
        table("p", rows=4_000, dim=16, pooling_factors=[5.0]),
    ]
    world = 4
    priced = _options_of(placing, tables, world)
    plain = _options_of(device_profile(), tables, world)
    global_ids = 5.0 * 512 * world

    def extra(name, kind):
        (a,), (b,) = (options[name][kind].shards[0].perf for options in (priced, plain))
        return a.fwd_comms - b.fwd_comms, a.bwd_comms - b.bwd_comms

    block_bytes = global_ids / world * 16 * 4  # a row block of a quarter of the rows
    row_wise = extra("s", ShardingType.ROW_WISE)
    assert row_wise == pytest.approx((block_bytes * 3e-6, block_bytes * 3e-6))
    replica = extra("s", ShardingType.DATA_PARALLEL)
    every = global_ids * 16 * 4
    assert replica == pytest.approx((every / world * 3e-6, every * 3e-6))
    for kind in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE):
        assert extra("s", kind) == (0.0, 0.0)
    for kind in priced["p"]:
        assert extra("p", kind) == (0.0, 0.0)


def test_a_profile_before_schema_1_2_places_for_free_and_1_2_reads_its_term():
    old = DeviceProfile.model_validate(device_profile(schema_version="1.1"))
    assert old.runtime.placement_ns_per_byte == 0.0
    data = device_profile(schema_version="1.2")
    data["runtime"]["placement_ns_per_byte"] = 0.4
    assert DeviceProfile.model_validate(data).runtime.placement_ns_per_byte == 0.4


def test_a_profile_keeps_the_address_its_own_version_gave_it():
    """A 1.1 profile as shardplan 0.8 wrote it: read now, written and addressed as it was,
    without the terms later versions added (a stored profile's id stays verifiable)."""
    text = (Path(__file__).parent / "profile-1.1.json").read_text()
    profile = DeviceProfile.model_validate_json(text)
    assert profile.schema_version == "1.1"
    assert profile_id_of(profile) == sha256_hex(canonical_bytes(json.loads(text)))
    assert "placement_ns_per_byte" not in profile.model_dump(mode="json")["runtime"]
    older = DeviceProfile.model_validate(device_profile(schema_version="1.0"))
    assert "weighted_bwd_us_per_id" not in older.model_dump(mode="json")["kernels"][0]
    assert (
        "placement_ns_per_byte"
        in DeviceProfile.model_validate(device_profile()).model_dump()["runtime"]
    )


def test_a_profile_that_sets_a_term_of_a_later_version_is_refused_naming_it():
    data = device_profile(schema_version="1.1")
    data["runtime"]["placement_ns_per_byte"] = 0.3
    with pytest.raises(InputError) as refused:
        calibrated([table("t")], profile=data)
    message = refused.value.render()
    assert "runtime.placement_ns_per_byte" in message and "schema 1.2" in message
    data = device_profile(schema_version="1.0")
    data["kernels"][0]["weighted_bwd_ns_per_byte"] = 1.0
    with pytest.raises(InputError, match=r"kernels\[0\]\.weighted_bwd_ns_per_byte"):
        calibrated([table("t")], profile=data)


def test_the_profile_is_part_of_the_request_hash():
    from planner_service.plan.codec import request_hash

    slower = device_profile()
    slower["runtime"]["step_ms"] = 2.0
    one, two = calibrated([table("t")]), calibrated([table("t")], profile=slower)
    assert request_hash(one) != request_hash(two)
    assert DeviceProfile.model_validate(slower).runtime.step_ms == 2.0


def _table_wise_perf(profile, **table_fields):
    req = calibrated([table("t", **table_fields)], profile=profile)
    option = next(
        o for o in enumerate_options(req)[0].options if o.sharding_type is ShardingType.TABLE_WISE
    )
    return option.shards[0].perf[0]


def test_reads_beyond_the_cache_cost_the_miss_terms():
    profile = device_profile()
    for kernel in profile["kernels"]:
        kernel.update(resident_bytes=2**20, fwd_ns_per_miss_byte=1.0, bwd_ns_per_miss_byte=2.0)
    plain = device_profile()
    fits = dict(rows=1_000, dim=64, pooling_factors=[4.0])  # 256 KiB: in the cache
    assert _table_wise_perf(profile, **fits) == _table_wise_perf(plain, **fits)
    big = dict(rows=1_000_000, dim=64, pooling_factors=[4.0])  # 256 MiB: misses
    missed, cached = _table_wise_perf(profile, **big), _table_wise_perf(plain, **big)
    ids_bytes = 4.0 * 512 * 2 * 64 * 4  # ids over the global batch x row bytes
    miss = 1 - 2**20 / (1_000_000 * 64 * 4)
    assert missed.fwd_compute - cached.fwd_compute == pytest.approx(ids_bytes * miss / 1e6)
    assert missed.bwd_compute - cached.bwd_compute == pytest.approx(2 * ids_bytes * miss / 1e6)


def test_a_weighted_table_costs_its_factors_and_every_cpu_shard_its_calls():
    profile = device_profile()
    for kernel in profile["kernels"]:
        kernel.update(weighted_fwd_factor=1.5, weighted_bwd_factor=3.0)
    shape = dict(rows=5_000, dim=32, pooling_factors=[8.0])
    plain = _table_wise_perf(profile, **shape)
    weighted = _table_wise_perf(profile, is_weighted=True, **shape)
    assert weighted.fwd_compute == pytest.approx(1.5 * plain.fwd_compute)
    assert weighted.bwd_compute == pytest.approx(3.0 * plain.bwd_compute)
    for kernel in profile["kernels"]:  # a 1.1 profile's backward extra: per id, byte, miss
        kernel.update(
            weighted_bwd_factor=1.0,
            weighted_bwd_us_per_id=0.5,
            weighted_bwd_ns_per_byte=2.0,
            weighted_bwd_ns_per_miss_byte=3.0,
            resident_bytes=2**20,
        )
    additive = _table_wise_perf(profile, is_weighted=True, **shape)
    ids = 8.0 * 512 * 2  # the pooling factor over the global batch
    assert additive.bwd_compute == pytest.approx(
        plain.bwd_compute + ids * 0.5 / 1e3 + ids * 32 * 4 * 2.0 / 1e6
    )  # 640 KB of rows: in the cache, no miss
    big = dict(rows=1_000_000, dim=32, pooling_factors=[8.0])
    unweighted = _table_wise_perf(profile, **big)
    missed = _table_wise_perf(profile, is_weighted=True, **big)
    miss = 1 - 2**20 / (1_000_000 * 32 * 4)
    assert missed.bwd_compute - unweighted.bwd_compute == pytest.approx(
        ids * 0.5 / 1e3 + ids * 128 * (2.0 + 3.0 * miss) / 1e6
    )
    empty = _table_wise_perf(profile, rows=5_000, dim=32, pooling_factors=[0.0])
    assert empty.fwd_compute == pytest.approx(0.05)  # the kernel call alone (cpu)
    assert empty.bwd_compute == pytest.approx(0.08)


def test_the_steps_scale_multiplies_every_part():
    profile = device_profile()
    profile["runtime"].update(compute_scale=2.0, comms_scale=2.0, input_scale=2.0)
    shape = dict(rows=5_000, dim=32, pooling_factors=[8.0])
    scaled, plain = _table_wise_perf(profile, **shape), _table_wise_perf(device_profile(), **shape)
    assert scaled.total == pytest.approx(2 * plain.total)
