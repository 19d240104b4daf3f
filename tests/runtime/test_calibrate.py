"""``runtime.calibrate``: the fits recover known coefficients from synthetic measurements,
the NNLS never goes negative, degenerate grids are refused by name, a failing rank is named,
and a real (short) calibration yields a profile the planner accepts."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from planner_service.costs.calibrated import NS_PER_MS, US_PER_MS, fixed_perf
from planner_service.plan.types import (
    MAX_NS_PER_BYTE,
    Collective,
    ComputeDevice,
    ComputeKernel,
    DeviceProfile,
    ShardingType,
)
from runtime.calibrate import collectives, kernels, steps, work
from runtime.calibrate.fit import DegenerateFitError, fit_linear, nnls
from runtime.calibrate.profile import CalibrateSettings, calibrate
from runtime.calibrate.ranks import RankFailedError, run_ranks
from tests.support.builders import device_profile

KERNEL_TRUTH = {
    "call_fwd_ms": 0.05,
    "call_bwd_ms": 0.03,
    "fwd_us_per_id": 0.004,
    "fwd_ns_per_byte": 0.006,
    "fwd_ns_per_out_byte": 0.03,
    "bwd_us_per_id": 0.008,
    "bwd_ns_per_byte": 0.004,
    "bwd_ns_per_row_byte": 0.06,
    "fwd_ns_per_miss_byte": 0.01,
    "bwd_ns_per_miss_byte": 0.02,
}
UNITS = (1.0, US_PER_MS, NS_PER_MS, NS_PER_MS, NS_PER_MS)
RESIDENT_BYTES = 2**20  # a 1 MiB cache: the grid's larger tables miss it
WEIGHTED_TRUTH = {
    "weighted_fwd_factor": 1.3,
    "weighted_bwd_factor": 1.0,  # a 1.1 profile's backward extra is in its own terms
    "weighted_bwd_us_per_id": 0.01,
    "weighted_bwd_ns_per_byte": 0.3,
    "weighted_bwd_ns_per_miss_byte": 0.4,
}
WEIGHTED_BWD_PER_MS = np.array([0.01 / US_PER_MS, 0.3 / NS_PER_MS, 0.4 / NS_PER_MS])
NOISE = 0.02  # multiplicative, as a quiet machine's medians


def _truth_per_ms(terms: tuple[str, ...]) -> np.ndarray:
    return np.array([KERNEL_TRUTH[t] / unit for t, unit in zip(terms, UNITS, strict=True)])


def _synthetic_kernel_samples(seed: int, count: int) -> list[kernels.KernelSample]:
    rng = np.random.default_rng(seed)
    fwd, bwd = _truth_per_ms(kernels.FWD_TERMS), _truth_per_ms(kernels.BWD_TERMS)
    samples = []
    for case in kernels.grid(seed)[:count]:
        noise = rng.normal(1.0, NOISE, size=2)
        fwd_ms = float(np.dot(case.fwd_terms(RESIDENT_BYTES), fwd)) * noise[0]
        bwd_ms = float(np.dot(case.bwd_terms(RESIDENT_BYTES), bwd)) * noise[1]
        if case.weighted:
            fwd_ms *= WEIGHTED_TRUTH["weighted_fwd_factor"]
            read = case.ids * case.row_bytes
            extra = (case.ids, read, case.missed_bytes(RESIDENT_BYTES))
            bwd_ms += float(np.dot(extra, WEIGHTED_BWD_PER_MS)) * noise[1]
        samples.append(kernels.KernelSample(case, fwd_ms, bwd_ms))
    return samples


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kernel_fit_recovers_known_coefficients(seed: int) -> None:
    target = kernels.KernelTarget(ComputeKernel.FUSED)
    samples = _synthetic_kernel_samples(seed, 120)
    fitted = kernels.fit_kernel(target, samples, RESIDENT_BYTES)
    for name, truth in {**KERNEL_TRUTH, **WEIGHTED_TRUTH}.items():
        assert getattr(fitted, name) == pytest.approx(truth, rel=0.15), name
    plain = sum(not s.case.weighted for s in samples)
    assert 0 < plain < 120  # the weighted cases give the weighted terms, not the others
    assert fitted.fit_fwd.samples == fitted.fit_bwd.samples == plain
    assert fitted.fit_fwd.median_relative_error < 2 * NOISE
    assert fitted.fit_bwd.r2 > 0.95


def test_too_few_weighted_cases_give_the_backward_a_median_factor_instead() -> None:
    """Two weighted cases cannot fit the weighted backward's terms with a residual: the
    profile then says how much slower they were as one factor, never less than 1."""
    samples = _synthetic_kernel_samples(0, 120)
    weighted = [s for s in samples if s.case.weighted]
    keep = [s for s in samples if not s.case.weighted] + weighted[:2]
    fitted = kernels.fit_kernel(kernels.KernelTarget(ComputeKernel.FUSED), keep, RESIDENT_BYTES)
    assert fitted.weighted_bwd_us_per_id == fitted.weighted_bwd_ns_per_byte == 0.0
    ratios = [s.bwd_ms / kernels.case_bwd_ms(fitted, s.case) for s in weighted[:2]]
    assert fitted.weighted_bwd_factor == pytest.approx(max(1.0, float(np.median(ratios))))
    assert fitted.weighted_bwd_factor > 1.2


def test_the_grids_first_cases_alone_determine_every_kernel_term() -> None:
    """A budget that stops the grid at its minimum still fits (the first cases vary every
    term), and recovers the per-call terms, which dominate those small cases."""
    samples = _synthetic_kernel_samples(0, kernels.MIN_SAMPLES)
    fitted = kernels.fit_kernel(kernels.KernelTarget(ComputeKernel.FUSED), samples, RESIDENT_BYTES)
    assert fitted.call_fwd_ms == pytest.approx(KERNEL_TRUTH["call_fwd_ms"], rel=0.2)
    assert fitted.call_bwd_ms == pytest.approx(KERNEL_TRUTH["call_bwd_ms"], rel=0.2)


def test_collective_fit_recovers_latency_and_bandwidth() -> None:
    rng = np.random.default_rng(3)
    samples = [
        collectives.CollectiveSample(
            Collective.ALL_TO_ALL,
            2,
            size,
            (0.12 + 0.8 * size / 2 / NS_PER_MS) * rng.normal(1, NOISE),
        )
        for size in collectives.MESSAGE_BYTES * 2
    ]
    (entry,) = collectives.fit_collectives(samples)
    assert entry.latency_ms == pytest.approx(0.12, rel=0.1)
    assert entry.ns_per_byte == pytest.approx(0.8, rel=0.1)
    assert (entry.world_size, entry.ranks_per_host) == (2, 2)
    assert entry.fit.samples == 16


def test_the_steps_fit_recovers_each_parts_scale_the_own_time_and_row_blocks_fixed_costs() -> None:
    """Plans of two ranks whose parts are made of known scales, own times and row-wise and
    table-row-wise costs on top of what the profile predicts, with one rank of each plan
    waiting for the other at its exchanges: the fit recovers them from the rank that did
    not wait, each row-block type its own, and a type the steps do not charge gets 0."""
    profile = DeviceProfile.model_validate(device_profile())
    request = steps.step_request(2, profile.compute_device, profile)
    base = fixed_perf(request, ()).total
    own = base - profile.runtime.step_ms
    rows_latency = fixed_perf(request, (ShardingType.ROW_WISE,)).total - base
    rows_latency -= profile.runtime.sharding_type_ms.get(ShardingType.ROW_WISE, 0.0)
    host_rows = ShardingType.TABLE_ROW_WISE
    host_latency = fixed_perf(request, (host_rows,)).total - base
    host_latency -= profile.runtime.sharding_type_ms.get(host_rows, 0.0)
    compute_scale, input_scale, comms_scale = 1.3, 1.8, 0.7
    compute_own, input_own, comms_own, rest, rows_ms, host_ms = 1.0, 2.0, 1.5, 0.5, 2.0, 3.5
    rng = np.random.default_rng(5)
    samples = []
    for plan in range(12):
        kinds = {ShardingType.TABLE_WISE}
        kinds |= {ShardingType.ROW_WISE} if plan % 2 else set()
        kinds |= {ShardingType.DATA_PARALLEL} if plan % 3 == 0 else set()
        kinds |= {host_rows} if plan % 4 < 2 else set()
        comms, inputs = rng.uniform(1.0, 8.0, 2)
        ranks = []
        for _rank in range(2):
            compute = rng.uniform(1.0, 8.0)
            noisy = lambda ms: ms * rng.normal(1.0, NOISE / 2)  # noqa: E731
            measured_compute = noisy(compute_own + compute_scale * compute)
            measured_input = noisy(input_own + input_scale * inputs)
            measured_comms = noisy(comms_own + comms_scale * comms)
            if ShardingType.ROW_WISE in kinds:
                measured_comms += rows_latency + rows_ms
            if host_rows in kinds:
                measured_comms += host_latency + host_ms
            ranks.append([compute, measured_compute, measured_input, measured_comms])
        # the faster rank waits at the exchanges for the slower one: both end together
        step = max(sum(r[1:]) for r in ranks) + rest
        for compute, measured_compute, measured_input, measured_comms in ranks:
            wait = step - rest - measured_compute - measured_input - measured_comms
            samples.append(
                steps.RankPart(
                    plan,
                    compute,
                    comms,
                    inputs,
                    frozenset(kinds),
                    measured_compute,
                    measured_comms + wait / 2,
                    measured_input + wait / 2,
                    step,
                )
            )
    fitted = steps.fit_steps(profile, 2, samples)
    # the prior pulls each scale a little towards 1
    assert fitted.compute_scale == pytest.approx(compute_scale, rel=0.1)
    assert fitted.input_scale == pytest.approx(input_scale, rel=0.15)
    assert fitted.comms_scale == pytest.approx(comms_scale, rel=0.15)
    own_times = compute_own + input_own + comms_own + rest
    assert fitted.step_ms + own == pytest.approx(own_times, rel=0.35)
    assert fitted.sharding_type_ms[ShardingType.ROW_WISE] == pytest.approx(rows_ms, abs=0.6)
    assert fitted.sharding_type_ms[host_rows] == pytest.approx(host_ms, abs=0.6)
    assert fitted.sharding_type_ms[ShardingType.DATA_PARALLEL] == pytest.approx(0.0, abs=0.6)
    assert fitted.fit_steps is not None and fitted.fit_steps.samples == 12  # one per plan
    assert fitted.fit_steps.median_relative_error < 0.08


def test_steps_that_barely_vary_keep_each_scale_within_a_factor_of_two() -> None:
    """Predictions nearly equal next to the noise: a fit could trade a scale for the own
    time (0 and a large own time fit as well); every scale stays in ``SCALE_RANGE``."""
    profile = DeviceProfile.model_validate(device_profile())
    rng = np.random.default_rng(7)
    samples = [
        steps.RankPart(
            i // 2,
            5.0 + rng.normal(0, 0.01),
            1.0 + rng.normal(0, 0.01),
            0.5 + rng.normal(0, 0.01),
            frozenset({ShardingType.TABLE_WISE}),
            12.0 * rng.normal(1.0, 0.1),
            5.0 * rng.normal(1.0, 0.1),
            3.0 * rng.normal(1.0, 0.1),
            20.0 * rng.normal(1.0, 0.1),
        )
        for i in range(20)
    ]
    fitted = steps.fit_steps(profile, 2, samples)
    for scale in (fitted.compute_scale, fitted.comms_scale, fitted.input_scale):
        assert steps.SCALE_RANGE[0] <= scale <= steps.SCALE_RANGE[1]
    assert fitted.step_ms > 0


class _Clock:
    """A clock the fake measurements move on."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_steps_are_measured_again_in_another_order_while_time_is_left() -> None:
    """Every plan in one run side by side, in order (the first ones are the most diverse,
    for a short budget), then again in shuffled orders up to ``ROUNDS`` times while the
    next run can end in time; each measurement is a sample of its own."""
    from runtime.measure.report import Machine, MeasureSettings, Part, StepTimes, build_report

    profile = DeviceProfile.model_validate(device_profile())
    clock = _Clock()
    runs: list[list[str]] = []
    plan_s = [1.0]

    def measure(request: object, plans: list[steps.ShardingPlan]) -> list[object]:
        clock.now += plan_s[0] * len(plans)
        runs.append([plan.plan_id for plan in plans])
        times = StepTimes.of(10.0, {part: 1.0 for part in Part if part is not Part.OTHER})
        machine = Machine(
            hostname="h", cpu_count=2, device_name="cpu", torch_version="", fbgemm_version=""
        )
        return [
            build_report(plan, MeasureSettings(), machine, [[times], [times]]) for plan in plans
        ]

    budget = steps.Budget(1e9, clock=clock)
    samples = steps.measure_steps(profile, 2, 1e9, budget, 0, measure, lambda n: None)
    plans = len(steps.step_plans(steps.step_request(2, profile.compute_device, profile), 0))
    assert len(runs) == steps.ROUNDS and all(len(run) == plans for run in runs)
    assert all(sorted(run) == sorted(runs[0]) for run in runs)
    assert runs[1] != runs[0] or runs[2] != runs[0]
    assert sorted({s.plan for s in samples}) == list(range(steps.ROUNDS * plans))
    # A deadline 20 s out: the first run is judged by PLAN_ESTIMATE_S a plan, so it takes
    # the first plans that can end by then, in their order, and is the last.
    first = runs[0]
    clock.now, runs[:] = 0.0, []
    samples = steps.measure_steps(profile, 2, 20.0, budget, 0, measure, lambda n: None)
    taken = int(20.0 // steps.PLAN_ESTIMATE_S)
    assert steps.MIN_PLANS <= taken < plans
    assert runs == [first[:taken]]
    assert steps.enough(samples, 2)
    # Once a run has shown a plan takes 2 s, the next round takes what is left holds.
    clock.now, runs[:], plan_s[0] = 0.0, [], 2.0
    deadline = steps.PLAN_ESTIMATE_S * plans
    steps.measure_steps(profile, 2, deadline, budget, 0, measure, lambda n: None)
    assert [len(run) for run in runs] == [plans, int((deadline - 2.0 * plans) // 2.0)]


def test_the_steps_plans_are_valid_and_diverse() -> None:
    from planner_service.validate.validator import validate_plan

    profile = DeviceProfile.model_validate(device_profile())
    request = steps.step_request(2, profile.compute_device, profile)
    plans = [steps.sealed(request, tables) for tables in steps.step_plans(request, 0)]
    assert all(validate_plan(request, plan) == [] for plan in plans)
    kinds = {t.sharding_type for plan in plans for t in plan.tables.values()}
    assert {ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE} <= kinds
    assert {ShardingType.TABLE_ROW_WISE, ShardingType.DATA_PARALLEL} <= kinds
    assert len({plan.plan_id for plan in plans}) == len(plans) >= steps.MIN_PLANS


def test_runtime_fit_recovers_step_terms_and_sharding_type_costs() -> None:
    """Steps made of the kernels' predicted time plus known runtime terms and a fixed cost
    for row-wise: the fit recovers them, and a type that costs nothing gets 0."""
    fused = kernels.fit_kernel(
        kernels.KernelTarget(ComputeKernel.FUSED), _synthetic_kernel_samples(0, 60), RESIDENT_BYTES
    )
    profile = work.kernel_only_profile(fused, ComputeDevice.CPU)
    step_ms, per_id_us, per_byte_ns, row_wise_ms = 0.4, 0.01, 0.05, 1.5
    samples = []
    for config in work.configs(0):
        for variant in (ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL):
            sample = work.WorkSample(config, variant, 0.0)
            terms = work.step_terms(profile, sample)
            ms = terms.kernel_ms + step_ms + per_id_us * terms.ids / US_PER_MS
            ms += per_byte_ns * terms.output_bytes / NS_PER_MS
            ms += row_wise_ms if variant is ShardingType.ROW_WISE else 0.0
            samples.append(work.WorkSample(config, variant, ms))
    runtime = work.fit_work(fused, ComputeDevice.CPU, samples)
    assert runtime.step_ms == pytest.approx(step_ms, rel=0.05)
    assert runtime.input_us_per_id == pytest.approx(per_id_us, rel=0.05)
    assert runtime.output_ns_per_byte == pytest.approx(per_byte_ns, rel=0.05)
    assert runtime.sharding_type_ms[ShardingType.ROW_WISE] == pytest.approx(row_wise_ms, rel=0.05)
    assert runtime.sharding_type_ms[ShardingType.DATA_PARALLEL] == pytest.approx(0.0, abs=1e-6)
    assert runtime.fit.r2 > 0.999


def test_placement_fit_recovers_its_cost_per_byte_past_a_slow_repetition() -> None:
    """Both ways cost twice the bytes each way times the coefficient; one sample four times
    as slow (another process took the core) does not move it."""
    ns_per_byte = 0.4
    samples = [
        work.PlacementSample(size, unit, ns_per_byte * 2 * size / NS_PER_MS)
        for size in (1 << 20, 4 << 20, 16 << 20)
        for unit in work.PLACEMENT_UNITS
    ]
    fitted, quality = work.fit_placement(samples)
    assert fitted == pytest.approx(ns_per_byte, rel=1e-9)
    assert quality.r2 == pytest.approx(1.0) and quality.samples == len(samples)
    slowed = [*samples]
    slowed[1] = dataclasses.replace(samples[1], ms=4 * samples[1].ms)
    assert work.fit_placement(slowed)[0] == pytest.approx(ns_per_byte, rel=1e-9)


def test_placement_is_timed_on_the_runtimes_own_gather_both_ways() -> None:
    samples = work.measure_placement(torch.device("cpu"), 0)
    assert [(s.bytes_each_way, s.unit) for s in samples] == [
        (size, unit) for size in work.PLACEMENT_BYTES for unit in work.PLACEMENT_UNITS
    ]
    assert all(s.ms > 0 for s in samples)
    ns_per_byte, quality = work.fit_placement(samples)
    assert 0 < ns_per_byte <= MAX_NS_PER_BYTE and quality.samples == len(samples)


def test_a_degenerate_grid_is_refused_naming_the_terms() -> None:
    one_dim = [
        kernels.KernelSample(kernels.KernelCase(1000, 64, 1, batch, 4), 1.0 + batch, 2.0)
        for batch in (256, 512, 1024, 2048, 4096, 8192)
    ]  # ids, bytes read and bytes written all move together with the batch
    with pytest.raises(DegenerateFitError, match="do not vary independently"):
        kernels.fit_kernel(kernels.KernelTarget(ComputeKernel.FUSED), one_dim)
    with pytest.raises(DegenerateFitError, match="3 measurements cannot fit the 4 terms"):
        kernels.fit_kernel(kernels.KernelTarget(ComputeKernel.FUSED), one_dim[:3])
    zero = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    with pytest.raises(DegenerateFitError, match="never vary the term.*ns_per_byte"):
        fit_linear(("latency_ms", "ns_per_byte"), zero, np.ones(4))


@pytest.mark.parametrize("seed", range(40))
def test_nnls_is_non_negative_and_optimal(seed: int) -> None:
    """x >= 0, and the KKT conditions: no zero coefficient whose increase would lower the
    residual, and a zero gradient on the positive ones."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(15, 5)) * rng.uniform(0.01, 100, size=5)
    b = rng.normal(size=15)
    x = nnls(a, b)
    assert (x >= 0).all()
    gradient = a.T @ (b - a @ x)
    scale = np.abs(a).max() * np.abs(b).max() * 1e-8
    assert (gradient <= scale).all()
    assert np.abs(gradient[x > 0]).max(initial=0.0) <= scale


def test_a_fit_of_times_that_fall_with_a_term_clamps_it_at_zero() -> None:
    sizes = np.arange(1.0, 11.0)
    features = np.stack([np.ones(10), sizes], axis=1)
    fit = fit_linear(("latency_ms", "ns_per_byte"), features, 5.0 - 0.1 * sizes)
    assert fit.coefficients[1] == 0.0
    assert fit.coefficients[0] > 0


def _fails_on_rank_one(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("rank one refuses")


@pytest.mark.slow
def test_a_failing_rank_ends_the_stage_naming_it() -> None:
    with pytest.raises(RankFailedError, match=r"rank 1 of 2 failed:(.|\n)*rank one refuses"):
        run_ranks(_fails_on_rank_one, 2, (), timeout_s=60)


@pytest.mark.slow
def test_a_short_real_calibration_is_a_profile_the_planner_accepts() -> None:
    settings = CalibrateSettings(
        budget_s=10.0, device=ComputeDevice.CPU, world_sizes=(2,), name="test-cpu"
    )
    stages: list[str] = []
    profile = calibrate(settings, lambda progress: stages.append(progress.stage))
    again = DeviceProfile.model_validate(json.loads(profile.model_dump_json()))
    assert again == profile
    assert {k.compute_kernel for k in profile.kernels} == {ComputeKernel.FUSED, ComputeKernel.DENSE}
    assert {c.collective for c in profile.collectives} == set(collectives.MEASURED)
    fits = [k.fit_fwd for k in profile.kernels] + [c.fit for c in profile.collectives]
    assert all(math.isfinite(fit.r2) and fit.samples >= 2 for fit in fits)
    assert profile.runtime.fit.samples >= work.MIN_CONFIGS * 6
    assert profile.runtime.placement_ns_per_byte > 0 and profile.runtime.fit_placement
    assert profile.machine.threads_per_rank == 1 and profile.machine.torch_version
    assert profile.wall_s <= settings.budget_s + 5  # the fits and the last case run over
    # too short for the whole steps' five plans: none is measured, and nothing scaled
    assert profile.runtime.fit_steps is None and profile.runtime.compute_scale == 1.0
    assert stages[0] == "kernels" and {"collectives", "runtime"} <= set(stages)
