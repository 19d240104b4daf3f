"""``runtime.measure``: synthetic batches drawn to the request's shapes, steps whose parts
add up to the step, the refusal of plans this machine cannot run, and a real measurement
on two gloo ranks of pooled, weighted and sequence tables with two optimizers."""

from __future__ import annotations

import math
import os
import re

import pytest
import torch

from planner_service.plan.types import PlanRequest, ShardingPlan
from planner_service.plan.units import size
from runtime.cpus import rank_cpus
from runtime.measure import (
    MeasureRefused,
    MeasureReport,
    MeasureSettings,
    Part,
    measure_plans,
)
from runtime.measure.batches import bag_lengths, collection_batch, rank_generator
from runtime.measure.launch import (
    RANK_BASE_BYTES,
    RANKS_PER_CPU,
    TOGETHER_SHARE,
    check_runnable,
    fitting_runs,
)
from runtime.measure.report import (
    TIMED_PARTS,
    DeviceKind,
    Machine,
    PredictedTimes,
    StepTimes,
    build_report,
    interquartile_mean,
    rank_measurement,
)
from runtime.measure.step import collection_specs, measure_rank, measure_rank_interleaved
from runtime.measure.table import render_table
from tests.support import builders
from tests.support.builders import request, table

FEW = MeasureSettings(warmup=1, steps=3, batches=2)


def mixed_request(world_size: int) -> PlanRequest:
    """Pooled sum and mean, weighted, a two-feature table and a sequence table under
    another optimizer: every kind of table measure draws batches for."""
    return request(
        [
            table("sum", rows=200, dim=16, pooling_factors=[3.0]),
            table("mean", rows=50, dim=8, pooling="mean", pooling_factors=[1.5]),
            table("weighted", rows=80, dim=8, is_weighted=True, pooling_factors=[2.5]),
            table("two", rows=60, dim=8, feature_names=["f1", "f2"], pooling_factors=[1.0, 4.0]),
            table(
                "seq",
                rows=40,
                dim=8,
                pooling="none",
                pooling_factors=[3.0],
                optimizer="rowwise_adagrad",
            ),
        ],
        world_size=world_size,
        batch_size=16,
        topology={"world_size": world_size, "compute_device": "cpu"},
    )


def mixed_plan(req: PlanRequest) -> ShardingPlan:
    """Table-wise, row-wise, column-wise and data-parallel tables, pooled and sequence."""
    last = req.topology.world_size - 1
    return builders.plan(
        req,
        {
            "sum": builders.row_wise(req, "sum"),
            "mean": builders.table_wise(req, "mean", last),
            "weighted": builders.data_parallel(req, "weighted"),
            "two": builders.column_wise(req, "two", [4, 4], [0, last]),
            "seq": builders.table_wise(req, "seq", 0),
        },
    )


def other_plan(req: PlanRequest) -> ShardingPlan:
    """Another valid plan of ``mixed_request``: every table on one rank or another."""
    last = req.topology.world_size - 1
    return builders.plan(
        req,
        {
            "sum": builders.table_wise(req, "sum", last),
            "mean": builders.table_wise(req, "mean", 0),
            "weighted": builders.table_wise(req, "weighted", last),
            "two": builders.table_wise(req, "two", 0),
            "seq": builders.row_wise(req, "seq"),
        },
    )


def assert_adds_up(times: StepTimes) -> None:
    parts = math.fsum(times.part_ms(part) for part in Part)
    assert parts == pytest.approx(times.step_ms, rel=1e-9, abs=1e-9)


# --------------------------------------------------------------------------- batches


def test_bags_hold_the_pooling_factor_as_evenly_as_whole_numbers_allow():
    lengths = bag_lengths(2.3, 10, 12, rank_generator(0, 0))
    assert int(lengths.sum()) == 23
    assert sorted(lengths[:10].tolist()) == [2] * 7 + [3] * 3
    assert lengths[10:].tolist() == [0, 0]  # after the feature's own samples: empty


def test_a_batch_follows_the_request_and_its_seed():
    req = mixed_request(2)
    pooled = next(spec for spec in collection_specs(req) if not spec.sequence)
    first = collection_batch(req, pooled.tables, rank_generator(3, 1))
    again = collection_batch(req, pooled.tables, rank_generator(3, 1))
    other_rank = collection_batch(req, pooled.tables, rank_generator(3, 0))
    assert first.keys() == ["sum", "mean", "weighted", "f1", "f2"]
    assert first.stride() == 16
    ids_per_feature = first.lengths().view(5, 16).sum(dim=1).tolist()
    assert ids_per_feature == [48, 24, 40, 16, 64]  # pooling factor × batch size
    assert torch.equal(first.values(), again.values())
    assert not torch.equal(first.values(), other_rank.values())
    weights = first.weights().split(ids_per_feature)
    assert bool(((weights[2] >= 0) & (weights[2] < 1)).all()) and weights[2].std() > 0
    assert all(bool((w == 1).all()) for i, w in enumerate(weights) if i != 2)
    rows = [200, 50, 80, 60, 60]
    for ids, limit in zip(first.values().split(ids_per_feature), rows, strict=True):
        assert int(ids.min()) >= 0 and int(ids.max()) < limit


def test_a_feature_with_its_own_batch_size_fills_its_own_samples():
    req = request(
        [
            table("a", rows=10, dim=8, pooling_factors=[2.0]),
            table("b", rows=10, dim=8, batch_sizes=[4], pooling_factors=[3.0]),
        ],
        world_size=1,
        batch_size=8,
    )
    batch = collection_batch(req, tuple(req.tables), rank_generator(0, 0))
    lengths = batch.lengths().view(2, 8)
    assert lengths[0].tolist() == [2] * 8
    assert sorted(lengths[1, :4].tolist()) == [3] * 4 and lengths[1, 4:].tolist() == [0] * 4


def test_tables_group_into_one_collection_per_kind_and_optimizer():
    specs = collection_specs(mixed_request(2))
    assert [(s.name, [t.name for t in s.tables]) for s in specs] == [
        ("pooled_sgd", ["sum", "mean", "weighted", "two"]),
        ("sequence_rowwise_adagrad", ["seq"]),
    ]


# --------------------------------------------------------------------------- report


def test_the_summary_is_the_middle_half_of_the_steps_and_adds_up():
    samples = [
        StepTimes.of(step, {part: step / 10 * (i + 1) / 3 for i, part in enumerate(TIMED_PARTS)})
        for step in (10.0, 12.0, 30.0, 11.0)
    ]
    iqm = interquartile_mean(samples)
    assert iqm.step_ms == 11.5  # steps 11 and 12: the fastest and slowest quarters left out
    assert iqm.input_dist_ms == pytest.approx(11.5 / 30)
    assert_adds_up(iqm)
    rank = rank_measurement(0, samples, None)
    assert (rank.step_median_ms, rank.step_p90_ms, rank.relative_error) == (11.5, 30.0, None)
    assert interquartile_mean(samples[:1]) == samples[0]


def test_the_report_reads_the_prediction_from_rank_stats():
    req = mixed_request(2)
    plan = mixed_plan(req)
    samples = [[StepTimes.of(4.0, dict.fromkeys(TIMED_PARTS, 0.5))] * 3] * 2
    samples[1] = [StepTimes.of(8.0, dict.fromkeys(TIMED_PARTS, 1.0))] * 3
    machine = Machine(
        hostname="h", cpu_count=2, device_name="x", torch_version="t", fbgemm_version="f"
    )
    report = build_report(plan, FEW, machine, samples)
    assert (report.job_step_ms, report.slowest_rank) == (8.0, 1)
    for rank, stats in zip(report.ranks, plan.rank_stats, strict=True):
        assert rank.predicted == PredictedTimes.of(stats.perf)
        assert rank.predicted.lookup_bwd_ms == stats.perf.bwd_compute
        assert rank.relative_error == pytest.approx(
            (stats.perf.total - rank.step_median_ms) / rank.step_median_ms
        )
    assert report.predicted_job_ms == max(s.perf.total for s in plan.rank_stats)
    table_text = render_table(report)
    assert "job step 8.00 ms (rank 1" in table_text
    rows = table_text.splitlines()[4:8]
    kinds = [word for line in rows for word in line.split() if word.isalpha()]
    assert kinds == ["measured", "predicted"] * 2


# --------------------------------------------------------------------------- refusals


def test_more_cpu_ranks_than_the_machine_runs_are_refused():
    plan = mixed_plan(mixed_request(9))
    with pytest.raises(MeasureRefused, match=r"world size 9 .* at most 8 cpu ranks"):
        check_runnable(plan, DeviceKind.CPU, cpu_count=2, cuda_devices=0, available_bytes=2**40)
    check_runnable(plan, DeviceKind.CPU, cpu_count=3, cuda_devices=0, available_bytes=2**40)
    assert RANKS_PER_CPU == 4


def test_more_memory_than_is_available_is_refused():
    plan = mixed_plan(mixed_request(2))
    needed = sum(s.hbm_bytes + s.ddr_bytes for s in plan.rank_stats) + 2 * RANK_BASE_BYTES
    with pytest.raises(MeasureRefused, match=re.escape(f"has {size(needed - 1)} available")):
        check_runnable(
            plan, DeviceKind.CPU, cpu_count=2, cuda_devices=0, available_bytes=needed - 1
        )
    check_runnable(plan, DeviceKind.CPU, cpu_count=2, cuda_devices=0, available_bytes=needed)


def test_plans_measured_together_need_one_world_size_and_room_for_all():
    one, two = mixed_plan(mixed_request(1)), mixed_plan(mixed_request(2))
    with pytest.raises(MeasureRefused, match=r"one world size; these have \[1, 2\]"):
        check_runnable(
            [one, two], DeviceKind.CPU, cpu_count=8, cuda_devices=0, available_bytes=None
        )
    with pytest.raises(MeasureRefused, match="no plan"):
        check_runnable([], DeviceKind.CPU, cpu_count=8, cuda_devices=0, available_bytes=None)
    req = mixed_request(2)
    plans = [mixed_plan(req), other_plan(req)]
    alone = [sum(s.hbm_bytes + s.ddr_bytes for s in p.rank_stats) for p in plans]
    room = max(alone) + 2 * RANK_BASE_BYTES  # each plan fits alone, not both at once
    for plan in plans:
        check_runnable(plan, DeviceKind.CPU, cpu_count=2, cuda_devices=0, available_bytes=room)
    with pytest.raises(MeasureRefused, match="2 plans' 2 ranks need .* measure fewer plans"):
        check_runnable(plans, DeviceKind.CPU, cpu_count=2, cuda_devices=0, available_bytes=room)
    needed = sum(alone) + 2 * RANK_BASE_BYTES
    check_runnable(plans, DeviceKind.CPU, cpu_count=2, cuda_devices=0, available_bytes=needed)


def test_plans_are_measured_together_as_far_as_memory_holds_them():
    req = mixed_request(2)
    plans = [mixed_plan(req), other_plan(req), mixed_plan(req)]
    alone = [sum(s.hbm_bytes + s.ddr_bytes for s in p.rank_stats) for p in plans]
    base = 2 * RANK_BASE_BYTES
    assert fitting_runs(plans, available_bytes=None) == [plans]  # nothing known: together
    # Room for two plans' shards (and the ranks' own) in the share: runs of two, in order.
    room = (base + alone[0] + alone[1]) / TOGETHER_SHARE
    assert fitting_runs(plans, available_bytes=math.ceil(room) + 1) == [plans[:2], plans[2:]]
    # Room for none: each plan in a run of its own, never none.
    assert fitting_runs(plans, available_bytes=0) == [[p] for p in plans]


def test_more_ranks_than_gpus_are_refused():
    plan = mixed_plan(mixed_request(2))
    with pytest.raises(MeasureRefused, match="world size 2 but this machine has 1 CUDA"):
        check_runnable(plan, DeviceKind.CUDA, cpu_count=64, cuda_devices=1, available_bytes=None)


# --------------------------------------------------------------------------- steps


def test_a_rank_alone_times_steps_whose_parts_add_up():
    """World size 1 in this process: every part runs (the exchanges are identities)."""
    req = mixed_request(1)
    samples = measure_rank(req, mixed_plan(req), FEW, 0, None, torch.device("cpu"))
    assert len(samples) == FEW.steps
    for times in samples:
        assert_adds_up(times)
        assert all(times.part_ms(part) > 0 for part in TIMED_PARTS)
        assert times.other_ms >= 0


def test_plans_taken_in_turn_each_get_their_steps():
    """Two plans in the same process, a step of each in turn: each plan's samples are its
    own (a plan's data-parallel and row-wise tables are not the other's), in its place."""
    req = mixed_request(1)
    plans = [mixed_plan(req), other_plan(req)]
    samples = measure_rank_interleaved(req, plans, FEW, 0, None, torch.device("cpu"))
    assert [len(of_plan) for of_plan in samples] == [FEW.steps, FEW.steps]
    for times in samples[0] + samples[1]:
        assert_adds_up(times)
        assert all(times.part_ms(part) > 0 for part in TIMED_PARTS)


@pytest.mark.slow
def test_two_gloo_ranks_measure_pooled_weighted_and_sequence_tables():
    """Two plans side by side on two spawned ranks (``measure_plans``; one plan alone is
    ``measure_plan``, the CLI's tests): a report per plan, in order, each rank's steps."""
    req = mixed_request(2)
    plans = [mixed_plan(req), other_plan(req)]
    reports = measure_plans(req, plans, FEW)
    assert reports is not None and len(reports) == 2
    assert reports[0].side_by_side_with == [plans[1].plan_id]
    assert reports[1].side_by_side_with == [plans[0].plan_id]
    for plan, report in zip(plans, reports, strict=True):
        assert [r.rank for r in report.ranks] == [0, 1] and report.backend.value == "gloo"
        for rank in report.ranks:
            assert len(rank.samples) == FEW.steps
            for times in [*rank.samples, rank.iqm]:
                assert_adds_up(times)
                assert all(times.part_ms(part) > 0 for part in TIMED_PARTS)
            assert all(times.other_ms >= 0 for times in rank.samples)
            assert rank.predicted == PredictedTimes.of(plan.rank_stats[rank.rank].perf)
        assert report.job_step_ms == max(r.step_median_ms for r in report.ranks)
        assert report.plan_id == plan.plan_id and report.machine.cpu_count >= 1
        assert MeasureReport.model_validate_json(report.model_dump_json()) == report
        # Each rank on CPUs of its own where this machine has enough (runtime/cpus.py).
        available = os.sched_getaffinity(0)
        assert [r.cpus for r in report.ranks] == [
            rank_cpus(r, 2, FEW.threads, available) for r in range(2)
        ]
