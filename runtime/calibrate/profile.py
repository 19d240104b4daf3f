"""``calibrate``: the four stages (kernels, collectives, the runtime's own work with its
placement of sequence rows, whole steps of plans) run within one budget and their fits
assembled into a ``DeviceProfile``, with the machine it describes.

The budget covers everything, spawning ranks included: each stage is given its share of the
seconds left (``KERNEL_SHARE``, ``COLLECTIVE_SHARE``, the rest to the runtime stage, less
``RESERVE_SHARE`` kept for fitting and writing), stops its grid when the share is spent and
fits what it measured. Settings the machine cannot run are refused before anything is
spawned (``check_settings``).
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import NamedTuple

import torch

from planner_service.plan.types import (
    ComputeDevice,
    DeviceProfile,
    KernelCoefficients,
    MachineInfo,
    PlanRequest,
    RuntimeCoefficients,
    ShardingPlan,
)
from runtime.calibrate import collectives, kernels, steps, work
from runtime.calibrate.timing import Budget
from runtime.choices import choice
from runtime.measure import MeasureReport

MIN_BUDGET_S = 10.0
MAX_BUDGET_S = 3600.0
CPU_RANKS_PER_CORE = 4  # gloo ranks sharing a core still run, slowly; more would not
KERNEL_SHARE = 0.4  # of the budget left when the stage starts
COLLECTIVE_SHARE = 0.6
RESERVE_SHARE = 0.05  # of the whole budget: fitting, the profile, tearing ranks down
WORK_SHARE = 0.3  # of what the kernels and collectives left; the rest to whole steps
STEP_WORLD_SIZE = 2  # cpu: whole steps on 2 ranks (one core each on 2 cores)
STEP_WARMUP = 3
STEP_STEPS = 12
RANK_GRACE_S = 30.0  # past a collective stage's deadline before its ranks count as hung
HIT_RATES = (0.2, 0.5, 0.9)


class CalibrateRefused(ValueError):
    """Settings this machine cannot run; the message names the option, the value and what
    is accepted."""


@dataclass(frozen=True)
class CalibrateSettings:
    """What to calibrate (``check_settings`` says whether this machine can); ``device`` is a
    ``ComputeDevice`` or its value."""

    budget_s: float
    device: ComputeDevice
    world_sizes: tuple[int, ...]
    name: str
    seed: int = 0
    threads: int = 1
    hit_rates: tuple[float, ...] = HIT_RATES

    def __post_init__(self) -> None:
        device = choice(ComputeDevice, self.device, "device", owner="CalibrateSettings")
        object.__setattr__(self, "device", device)


class Progress(NamedTuple):
    """Where a calibration is: its stage, what the stage has measured, and the clock."""

    stage: str
    detail: str
    elapsed_s: float
    budget_s: float


OnProgress = Callable[[Progress], None]


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_world_sizes(device: ComputeDevice) -> tuple[int, ...]:
    """cpu: 2, and 4 where there are 4 cores; cuda: every GPU (none below 2)."""
    if device is ComputeDevice.CUDA:
        return (gpu_count(),) if gpu_count() > 1 else ()
    return (2, 4) if (os.cpu_count() or 1) >= 4 else (2,)


def check_settings(settings: CalibrateSettings) -> None:
    """Refuse what this machine cannot run, before anything is spawned."""
    if not MIN_BUDGET_S <= settings.budget_s <= MAX_BUDGET_S:
        raise CalibrateRefused(
            f"--budget-s {settings.budget_s:g} is outside [{MIN_BUDGET_S:g}, {MAX_BUDGET_S:g}] "
            "seconds"
        )
    if settings.device is ComputeDevice.CUDA and gpu_count() == 0:
        raise CalibrateRefused("--device cuda: this machine has no GPU torch can use; use cpu")
    most = most_ranks(settings.device)
    for world in settings.world_sizes:
        if not 2 <= world <= most:
            raise CalibrateRefused(
                f"--world-sizes {world}: this machine runs {settings.device.value} worlds of 2 "
                f"to {most} ranks"
                + (
                    " (one per GPU)"
                    if settings.device is ComputeDevice.CUDA
                    else f" ({CPU_RANKS_PER_CORE} per core)"
                )
            )
    if settings.threads < 1:
        raise CalibrateRefused(f"--threads {settings.threads}: give 1 or more")


def most_ranks(device: ComputeDevice) -> int:
    if device is ComputeDevice.CUDA:
        return gpu_count()
    return CPU_RANKS_PER_CORE * (os.cpu_count() or 1)


def calibrate(
    settings: CalibrateSettings, on_progress: OnProgress | None = None, budget: Budget | None = None
) -> DeviceProfile:
    """Measure this machine within ``settings.budget_s`` and fit its profile. ``budget``:
    a clock already running (the command's, started before it imported torch)."""
    check_settings(settings)
    budget = budget or Budget(settings.budget_s)
    report = _reporter(on_progress, budget)
    torch.set_num_threads(settings.threads)
    device = (
        torch.device("cuda", 0) if settings.device is ComputeDevice.CUDA else torch.device("cpu")
    )
    measured_at = datetime.now(UTC).replace(microsecond=0).isoformat()
    kernel_entries = _kernel_stage(settings, device, budget, report)
    collective_entries = _collective_stage(settings, budget, report)
    fused = next(k for k in kernel_entries if k.compute_kernel.value == "fused" and k.pooled)
    report("runtime", "starting")
    deadline = budget.deadline(WORK_SHARE, keep_s=RESERVE_SHARE * settings.budget_s)
    samples = work.measure_work(
        device, deadline, budget, settings.seed, lambda n: report("runtime", f"{n} configurations")
    )
    runtime = work.fit_work(fused, settings.device, samples)
    report("runtime", "placing sequence rows")
    placement_ns, placement_fit = work.fit_placement(work.measure_placement(device, settings.seed))
    runtime = runtime.model_copy(
        update={"placement_ns_per_byte": placement_ns, "fit_placement": placement_fit}
    )

    def profile_of(runtime: RuntimeCoefficients) -> DeviceProfile:
        return DeviceProfile(
            name=settings.name,
            compute_device=settings.device,
            measured_at=measured_at,
            machine=machine_info(settings),
            budget_s=settings.budget_s,
            wall_s=round(budget.elapsed_s(), 3),
            kernels=kernel_entries,
            collectives=collective_entries,
            runtime=runtime,
        )

    report("steps", "starting")
    world = max(settings.world_sizes, default=1)
    world = min(world, STEP_WORLD_SIZE) if settings.device is ComputeDevice.CPU else world
    deadline = budget.deadline(1.0, keep_s=RESERVE_SHARE * settings.budget_s)
    step_samples = steps.measure_steps(
        profile_of(runtime),
        world,
        deadline,
        budget,
        settings.seed,
        partial(_measured, settings),
        lambda n: report("steps", f"{n} plan measurements at world size {world}"),
    )
    if not steps.enough(step_samples, world):  # a short budget: the runtime stage's fit
        return profile_of(runtime)
    return profile_of(steps.fit_steps(profile_of(runtime), world, step_samples))


def _measured(
    settings: CalibrateSettings, request: PlanRequest, plans: list[ShardingPlan]
) -> list[MeasureReport]:
    """Plans' measured steps: ``runtime.measure`` on ranks spawned here, side by side, as
    many in a run as fit in memory together (``runtime.measure.launch.fitting_runs``)."""
    from runtime.measure import DeviceKind, MeasureSettings, measure_plans  # spawns ranks
    from runtime.measure.launch import fitting_runs

    measure = MeasureSettings(
        device=DeviceKind(settings.device.value),
        threads=settings.threads,
        warmup=STEP_WARMUP,
        steps=STEP_STEPS,
        seed=settings.seed,
    )
    reports: list[MeasureReport] = []
    for run in fitting_runs(plans):
        measured = measure_plans(request, run, measure)
        assert measured is not None  # spawned here, this process is rank 0's parent
        reports += measured
    return reports


def _reporter(on_progress: OnProgress | None, budget: Budget) -> Callable[[str, str], None]:
    def report(stage: str, detail: str) -> None:
        if on_progress is not None:
            on_progress(Progress(stage, detail, budget.elapsed_s(), budget.total_s))

    return report


def _kernel_stage(
    settings: CalibrateSettings,
    device: torch.device,
    budget: Budget,
    report: Callable[[str, str], None],
) -> list[KernelCoefficients]:
    """Each kernel gets an equal part of the stage's share."""
    targets = kernels.targets_of(device, settings.hit_rates)
    stage_end = budget.deadline(KERNEL_SHARE, keep_s=RESERVE_SHARE * settings.budget_s)
    entries = []
    for i, target in enumerate(targets):
        deadline = budget.now() + (stage_end - budget.now()) / (len(targets) - i)
        samples = kernels.measure_kernel(
            target, device, deadline, budget, settings.seed, _counter(report, target.label)
        )
        entries.append(kernels.fit_kernel(target, samples, kernels.resident_bytes(device)))
    fused = next(e for e in entries if e.compute_kernel.value == "fused" and e.pooled)
    return [*entries, kernels.dense_as_fused(fused)]


def _counter(report: Callable[[str, str], None], label: str) -> Callable[[int], None]:
    return lambda cases: report("kernels", f"{label}: {cases} cases")


def _collective_stage(
    settings: CalibrateSettings, budget: Budget, report: Callable[[str, str], None]
) -> list[collectives.CollectiveCoefficients]:
    """Each world size gets an equal part of the stage's share, spawning included."""
    cuda = settings.device is ComputeDevice.CUDA
    stage_end = budget.deadline(COLLECTIVE_SHARE, keep_s=RESERVE_SHARE * settings.budget_s)
    samples: list[collectives.CollectiveSample] = []
    worlds = settings.world_sizes
    for i, world in enumerate(worlds):
        report("collectives", f"world size {world}: spawning ranks")
        deadline = budget.now() + (stage_end - budget.now()) / (len(worlds) - i)
        timeout_s = deadline - budget.now() + RANK_GRACE_S
        samples += collectives.measure_world(world, deadline, timeout_s, cuda, settings.threads)
        report("collectives", f"world size {world}: {len(samples)} timings")
    return collectives.fit_collectives(samples)


def machine_info(settings: CalibrateSettings) -> MachineInfo:
    from planner_service import __version__

    return MachineInfo(
        hostname=socket.gethostname(),
        device_name=device_name(settings.device),
        cpu_count=os.cpu_count() or 1,
        threads_per_rank=settings.threads,
        shardplan_version=__version__,
        torch_version=torch.__version__,
        fbgemm_gpu_version=_fbgemm_version(),
        python_version=platform.python_version(),
    )


def device_name(device: ComputeDevice) -> str:
    if device is ComputeDevice.CUDA:
        return torch.cuda.get_device_name(0)
    return cpu_model(_cpuinfo_lines())


def _cpuinfo_lines() -> Sequence[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            return cpuinfo.read().splitlines()
    except OSError:
        return []


def cpu_model(lines: Sequence[str]) -> str:
    """The first ``model name`` of /proc/cpuinfo, else the platform's processor name."""
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return platform.processor()


def _fbgemm_version() -> str:
    import fbgemm_gpu

    return str(getattr(fbgemm_gpu, "__version__", ""))
