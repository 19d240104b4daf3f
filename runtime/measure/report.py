"""What ``shardplan measure`` reports: the parts of a step (``Part``), one step's times
(``StepTimes``), a rank's summary beside the plan's prediction (``RankMeasurement``), the
machine and the whole report (``MeasureReport``), and the pure functions that summarise a
rank's samples and read the plan's predicted parts. Frozen pydantic models: the report's
JSON is their dump, and reads back to an equal report."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from planner_service.plan.types import Perf, ShardingPlan


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Part(StrEnum):
    """The parts of a measured step, the timed ones in the order a step runs them, then
    ``other``: what is left of the step (the loss and its gradient, between the forward and
    the backward, and the hand-over between parts)."""

    INPUT_DIST = "input_dist"
    LOOKUP_FWD = "lookup_fwd"
    OUTPUT_DIST_FWD = "output_dist_fwd"
    OUTPUT_DIST_BWD = "output_dist_bwd"
    LOOKUP_BWD = "lookup_bwd"
    OTHER = "other"


TIMED_PARTS = tuple(part for part in Part if part is not Part.OTHER)

# The plan's predicted component (``Perf``) of each timed part. Data-parallel tables have no
# gradient all-reduce of their own in this runtime (their gradients come back through the
# output exchange), so they are inside output_dist_bwd on both sides.
PREDICTED_COMPONENT: Mapping[Part, str] = {
    Part.INPUT_DIST: "input_dist",
    Part.LOOKUP_FWD: "fwd_compute",
    Part.OUTPUT_DIST_FWD: "fwd_comms",
    Part.OUTPUT_DIST_BWD: "bwd_comms",
    Part.LOOKUP_BWD: "bwd_compute",
}


class DeviceKind(StrEnum):
    CPU = "cpu"
    CUDA = "cuda"


class Backend(StrEnum):
    GLOO = "gloo"
    NCCL = "nccl"


BACKEND_OF = {DeviceKind.CPU: Backend.GLOO, DeviceKind.CUDA: Backend.NCCL}


class StepTimes(_Frozen):
    """Milliseconds of one step (or a summary of steps) by part; the parts add up to
    ``step_ms`` (``other_ms`` is the remainder)."""

    step_ms: float
    input_dist_ms: float
    lookup_fwd_ms: float
    output_dist_fwd_ms: float
    output_dist_bwd_ms: float
    lookup_bwd_ms: float
    other_ms: float

    @staticmethod
    def of(step_ms: float, timed_ms: Mapping[Part, float]) -> StepTimes:
        """A step of ``step_ms`` whose timed parts took ``timed_ms``; the rest is other."""
        parts = {f"{part.value}_ms": timed_ms[part] for part in TIMED_PARTS}
        other_ms = step_ms - math.fsum(timed_ms[part] for part in TIMED_PARTS)
        return StepTimes(step_ms=step_ms, other_ms=other_ms, **parts)

    def part_ms(self, part: Part) -> float:
        value: float = getattr(self, f"{part.value}_ms")
        return value


class PredictedTimes(_Frozen):
    """The plan's estimate for a rank (its ``rank_stats[r].perf``), by the measured part
    each component predicts; ``prefetch_ms`` (UVM caching) has no measured counterpart,
    and ``total_ms`` is what the planner balanced (which components it sums depends on the
    cost model)."""

    input_dist_ms: float
    lookup_fwd_ms: float
    output_dist_fwd_ms: float
    output_dist_bwd_ms: float
    lookup_bwd_ms: float
    prefetch_ms: float
    total_ms: float

    @staticmethod
    def of(perf: Perf) -> PredictedTimes:
        parts = {
            f"{part.value}_ms": getattr(perf, component)
            for part, component in PREDICTED_COMPONENT.items()
        }
        return PredictedTimes(prefetch_ms=perf.prefetch, total_ms=perf.total, **parts)

    def part_ms(self, part: Part) -> float | None:
        value: float | None = getattr(self, f"{part.value}_ms", None)
        return value


class RankMeasurement(_Frozen):
    """One rank: its step's median and 90th percentile; ``iqm``, the interquartile mean of
    its steps by part (the mean of the middle half of the steps, ranked by step time: as
    robust to a stray slow step as the median, and its parts add up to its step, which
    medians of the parts do not); the plan's prediction for the rank (``None`` when its
    rank_stats does not list it) and the predicted total's error relative to the median
    step; every timed step; and the CPUs the rank was pinned to (``runtime/cpus.py``;
    empty: not pinned)."""

    rank: int
    step_median_ms: float
    step_p90_ms: float
    iqm: StepTimes
    predicted: PredictedTimes | None
    relative_error: float | None
    samples: list[StepTimes]
    cpus: list[int] = Field(default_factory=list)


class Machine(_Frozen):
    """Where the measurement ran (rank 0's host; under torchrun the others may differ)."""

    hostname: str
    cpu_count: int
    device_name: str
    torch_version: str
    fbgemm_version: str


class MeasureSettings(_Frozen):
    """How to measure: the device kind, threads per rank (cpu), warm-up and timed steps,
    the seed of the synthetic batches, how many distinct batches each rank cycles through,
    the learning rate of the fused optimizers and the collectives' deadline."""

    device: DeviceKind = DeviceKind.CPU
    threads: int = Field(1, ge=1)
    warmup: int = Field(5, ge=0)
    steps: int = Field(20, ge=1)
    seed: int = Field(0, ge=0)
    batches: int = Field(4, ge=1)
    learning_rate: float = Field(0.01, gt=0.0)
    timeout_s: float = Field(120.0, gt=0.0)


class MeasureReport(_Frozen):
    """A plan measured: every rank, and the job's step (the slowest rank's median, since
    every rank waits for it at the next exchange) beside the plan's largest predicted
    total; ``side_by_side_with``: the ids of the plans measured in the same run, a step of
    each in turn (``measure_plans``; empty: measured alone)."""

    plan_id: str
    request_hash: str
    world_size: int
    backend: Backend
    settings: MeasureSettings
    machine: Machine
    ranks: list[RankMeasurement]
    job_step_ms: float
    slowest_rank: int
    predicted_job_ms: float | None
    relative_error: float | None
    side_by_side_with: list[str] = Field(default_factory=list)


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (a value that occurred)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def interquartile_mean(samples: Sequence[StepTimes]) -> StepTimes:
    """The mean of each part over the middle half of the steps by step time (at least the
    median step), so the parts add up to the step."""
    ordered = sorted(samples, key=lambda sample: sample.step_ms)
    quarter = len(ordered) // 4
    middle = ordered[quarter : len(ordered) - quarter]
    timed: dict[Part, float] = {
        part: math.fsum(s.part_ms(part) for s in middle) / len(middle) for part in TIMED_PARTS
    }
    return StepTimes.of(math.fsum(s.step_ms for s in middle) / len(middle), timed)


def relative_error(predicted_ms: float | None, measured_ms: float) -> float | None:
    """(predicted − measured) / measured: −0.9 means the plan predicted a tenth."""
    if predicted_ms is None or measured_ms <= 0:
        return None
    return (predicted_ms - measured_ms) / measured_ms


def predicted_of(plan: ShardingPlan) -> dict[int, PredictedTimes]:
    """Each rank's predicted times from the plan's ``rank_stats`` (which include any
    plan-level costs a cost model adds, unlike a sum over shards)."""
    return {stats.rank: PredictedTimes.of(stats.perf) for stats in plan.rank_stats}


def rank_measurement(
    rank: int, samples: Sequence[StepTimes], predicted: PredictedTimes | None
) -> RankMeasurement:
    steps = [sample.step_ms for sample in samples]
    median = statistics.median(steps)
    total = None if predicted is None else predicted.total_ms
    return RankMeasurement(
        rank=rank,
        step_median_ms=median,
        step_p90_ms=percentile(steps, 0.9),
        iqm=interquartile_mean(samples),
        predicted=predicted,
        relative_error=relative_error(total, median),
        samples=list(samples),
    )


def build_report(
    plan: ShardingPlan,
    settings: MeasureSettings,
    machine: Machine,
    samples_by_rank: Sequence[Sequence[StepTimes]],
    cpus_by_rank: Sequence[list[int]] | None = None,
    side_by_side_with: Sequence[str] = (),
) -> MeasureReport:
    """The report of every rank's timed steps (rank ``r``'s at index ``r``), the CPUs
    each was pinned to, and the plans measured beside it."""
    predicted = predicted_of(plan)
    ranks = [
        rank_measurement(rank, samples, predicted.get(rank)).model_copy(
            update={"cpus": list(cpus_by_rank[rank]) if cpus_by_rank else []}
        )
        for rank, samples in enumerate(samples_by_rank)
    ]
    slowest = max(ranks, key=lambda r: r.step_median_ms)
    totals = [p.total_ms for p in predicted.values()]
    predicted_job = max(totals) if totals else None
    return MeasureReport(
        plan_id=plan.plan_id,
        request_hash=plan.request_hash,
        world_size=plan.world_size,
        backend=BACKEND_OF[settings.device],
        settings=settings,
        machine=machine,
        ranks=ranks,
        job_step_ms=slowest.step_median_ms,
        slowest_rank=slowest.rank,
        predicted_job_ms=predicted_job,
        relative_error=relative_error(predicted_job, slowest.step_median_ms),
        side_by_side_with=list(side_by_side_with),
    )
