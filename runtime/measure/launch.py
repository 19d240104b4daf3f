"""Running a measurement at the plan's world size: the check that this machine can hold it
(before anything is started), the ranks spawned here (gloo on cpu, one process per GPU with
NCCL on cuda) or joined from ``torchrun``'s environment, and the report put together on
rank 0.

Nothing waits forever: the process group has the settings' deadline for every collective,
a rank that raises or dies ends the run at once with an error naming it (torch's spawn
context stops the others), and the ranks die with this process.
"""

from __future__ import annotations

import os
import platform
import socket
import tempfile
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path

import fbgemm_gpu
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from pydantic import TypeAdapter

from planner_service.plan.types import PlanRequest, ShardingPlan
from planner_service.plan.units import size
from runtime.cpus import pin_rank
from runtime.measure.report import (
    BACKEND_OF,
    DeviceKind,
    Machine,
    MeasureReport,
    MeasureSettings,
    StepTimes,
    build_report,
)
from runtime.measure.step import measure_rank_interleaved

RANKS_PER_CPU = 4
# A rank's own memory besides its shards: about 300 MB resident after importing torch and
# FBGEMM (measured on the 2-core machine), plus its batches and the process group's buffers.
RANK_BASE_BYTES = 512 * 2**20
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR")
_JOIN_POLL_S = 0.5
# The share of the available memory ``fitting_runs`` gives plans measured side by side: the
# rest for sharding's transient copies, the batches and the interpreter.
TOGETHER_SHARE = 0.75
_REPORTS = TypeAdapter(list[MeasureReport])


class MeasureRefused(Exception):
    """This machine cannot run the plan's world size (said before starting anything)."""


class RankFailed(Exception):
    """A rank raised, died or timed out; the message names it and says how."""


def in_torchrun(environ: Mapping[str, str]) -> bool:
    """Whether this process is one rank of a job started by ``torchrun`` (or alike)."""
    return all(name in environ for name in TORCHRUN_VARIABLES)


def mem_available_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo; ``None`` where there is none (not Linux)."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition(":")
        if name == "MemAvailable":
            return int(value.split()[0]) * 1024
    return None


def check_runnable(
    plan: ShardingPlan | Sequence[ShardingPlan],
    device: DeviceKind,
    *,
    cpu_count: int,
    cuda_devices: int,
    available_bytes: int | None,
) -> None:
    """Refuse a plan whose world size this machine cannot run, naming the numbers; for
    plans measured together, plans of different world sizes, and the shards of all of
    them (every rank holds its shards of every plan at once)."""
    plans = [plan] if isinstance(plan, ShardingPlan) else list(plan)
    if not plans:
        raise MeasureRefused("no plan to measure")
    world = plans[0].world_size
    sizes = sorted({p.world_size for p in plans})
    if len(sizes) > 1:
        raise MeasureRefused(
            f"plans measured together must have one world size; these have {sizes}: "
            "measure each world size on its own"
        )
    if device is DeviceKind.CUDA:
        if world > cuda_devices:
            raise MeasureRefused(
                f"the plan is for world size {world} but this machine has {cuda_devices} "
                f"CUDA device(s) (one rank per GPU); run it under torchrun across hosts, or "
                "measure on cpu with --device cpu"
            )
        return
    limit = RANKS_PER_CPU * cpu_count
    if world > limit:
        raise MeasureRefused(
            f"the plan is for world size {world} but this machine runs at most {limit} cpu "
            f"ranks ({RANKS_PER_CPU} per core × {cpu_count} cores: beyond that the ranks "
            "time-share so much that the steps measure the scheduler); run it under torchrun "
            "across hosts"
        )
    shards = sum(s.hbm_bytes + s.ddr_bytes for p in plans for s in p.rank_stats)
    needed = shards + world * RANK_BASE_BYTES
    if available_bytes is not None and needed > available_bytes:
        whose = "plan's" if len(plans) == 1 else f"{len(plans)} plans'"
        raise MeasureRefused(
            f"the {whose} {world} ranks need about {size(needed)} (their shards' bytes from "
            f"rank_stats plus {size(RANK_BASE_BYTES)} per rank) but this machine has "
            f"{size(available_bytes)} available; "
            + (
                "run it under torchrun across hosts"
                if len(plans) == 1
                else "measure fewer plans together"
            )
        )


def default_device() -> DeviceKind:
    """cuda where this machine has a GPU torch can use, else cpu."""
    return DeviceKind.CUDA if torch.cuda.is_available() else DeviceKind.CPU


def check_here(plan: ShardingPlan | Sequence[ShardingPlan], device: DeviceKind) -> None:
    """``check_runnable`` on this machine."""
    check_runnable(
        plan,
        device,
        cpu_count=os.cpu_count() or 1,
        cuda_devices=torch.cuda.device_count() if torch.cuda.is_available() else 0,
        available_bytes=mem_available_bytes(),
    )


def fitting_runs(
    plans: Sequence[ShardingPlan],
    available_bytes: int | None = None,
    share: float = TOGETHER_SHARE,
) -> list[list[ShardingPlan]]:
    """``plans`` (one world size) in runs measured side by side, in their order: as many in
    a run as ``share`` of the available memory (this machine's when not given) holds, each
    plan's shards plus every rank's own (``RANK_BASE_BYTES``); at least one plan a run."""
    if available_bytes is None:
        available_bytes = mem_available_bytes()
    world = plans[0].world_size if plans else 1
    budget = None if available_bytes is None else share * available_bytes
    runs: list[list[ShardingPlan]] = []
    used = 0.0
    for plan in plans:
        needed = sum(s.hbm_bytes + s.ddr_bytes for s in plan.rank_stats)
        if runs and (budget is None or used + needed <= budget):
            runs[-1].append(plan)
            used += needed
        else:
            runs.append([plan])
            used = world * RANK_BASE_BYTES + needed
    return runs


def this_machine(device: torch.device) -> Machine:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine()
    return Machine(
        hostname=socket.gethostname(),
        cpu_count=os.cpu_count() or 1,
        device_name=name or device.type,
        torch_version=torch.__version__,
        fbgemm_version=str(fbgemm_gpu.__version__),
    )


def rank_device(settings: MeasureSettings, local_rank: int) -> torch.device:
    if settings.device is DeviceKind.CUDA:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def run_rank(
    request: PlanRequest,
    plans: Sequence[ShardingPlan],
    settings: MeasureSettings,
    local_rank: int,
    cpus: list[int] | None = None,
) -> list[MeasureReport] | None:
    """This rank's steps of ``plans`` (taken in turn, ``measure_rank_interleaved``) in the
    initialised default group, gathered: rank 0 gets a report per plan, the others
    ``None``. ``cpus``: those this rank is pinned to (none: not pinned)."""
    torch.set_num_threads(settings.threads)
    device = rank_device(settings, local_rank)
    rank, world = dist.get_rank(), dist.get_world_size()
    samples = measure_rank_interleaved(request, plans, settings, rank, dist.group.WORLD, device)
    sent = [[s.model_dump_json() for s in of_plan] for of_plan in samples]
    gathered: list[tuple[list[int], list[list[str]]] | None] = [None] * world
    dist.all_gather_object(gathered, (cpus or [], sent))
    if rank != 0:
        return None
    cpus_by_rank = [got[0] if got else [] for got in gathered]
    machine = this_machine(device)
    reports = []
    for index, plan in enumerate(plans):
        by_rank = [
            [StepTimes.model_validate_json(s) for s in (got[1][index] if got else [])]
            for got in gathered
        ]
        others = [p.plan_id for i, p in enumerate(plans) if i != index]
        reports.append(build_report(plan, settings, machine, by_rank, cpus_by_rank, others))
    return reports


def _spawned(
    rank: int,
    world: int,
    port: int,
    documents: tuple[str, list[str], str],
    result: str,
) -> None:
    """A spawned rank: join the group on the loopback port, measure, rank 0 writes the
    reports to ``result`` (a JSON list)."""
    request = PlanRequest.model_validate_json(documents[0])
    plans = [ShardingPlan.model_validate_json(text) for text in documents[1]]
    settings = MeasureSettings.model_validate_json(documents[2])
    cpus = pin_rank(rank, world, settings.threads) if settings.device is DeviceKind.CPU else []
    dist.init_process_group(
        BACKEND_OF[settings.device].value,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=settings.timeout_s),
    )
    try:
        reports = run_rank(request, plans, settings, rank, cpus)
        if reports is not None:
            Path(result).write_text(_REPORTS.dump_json(reports).decode())
        dist.barrier()  # no rank tears its connections down while a peer still uses them
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def spawn(
    request: PlanRequest, plans: Sequence[ShardingPlan], settings: MeasureSettings
) -> list[MeasureReport]:
    """The plans' world size of ranks on this machine; the reports rank 0 writes."""
    documents = (
        request.model_dump_json(),
        [plan.model_dump_json() for plan in plans],
        settings.model_dump_json(),
    )
    world = plans[0].world_size
    with tempfile.TemporaryDirectory(prefix="shardplan-measure-") as folder:
        result = Path(folder) / "reports.json"
        args = (world, free_port(), documents, str(result))
        context = mp.start_processes(
            _spawned, args=args, nprocs=world, join=False, start_method="spawn"
        )
        try:
            while not context.join(timeout=_JOIN_POLL_S):
                pass
        except mp.ProcessRaisedException as error:
            raise RankFailed(_raised(error)) from None
        except mp.ProcessExitedException as error:
            how = error.signal_name or f"exit code {error.exit_code}"
            raise RankFailed(f"rank {error.error_index} died ({how})") from None
        finally:
            _stop(context)
        return _REPORTS.validate_json(result.read_text())


def _raised(error: mp.ProcessRaisedException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"rank {error.error_index} failed: {lines[-1] if lines else 'no message'}"


def _stop(context: mp.ProcessContext) -> None:
    """End the ranks still running (an interrupted or failed run)."""
    for process in context.processes:
        if process.is_alive():
            process.kill()
            process.join(timeout=5)


def join_environment(
    request: PlanRequest, plans: Sequence[ShardingPlan], settings: MeasureSettings
) -> list[MeasureReport] | None:
    """Run as the rank ``torchrun`` started (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``):
    rank 0 gets the reports."""
    world = int(os.environ["WORLD_SIZE"])
    for plan in plans:
        if world != plan.world_size:
            raise MeasureRefused(
                f"the plan is for world size {plan.world_size} but torchrun started {world} "
                f"ranks; start {plan.world_size} (torchrun --nnodes × --nproc-per-node)"
            )
    dist.init_process_group(
        BACKEND_OF[settings.device].value,
        init_method="env://",
        timeout=timedelta(seconds=settings.timeout_s),
    )
    try:
        reports = run_rank(request, plans, settings, int(os.environ.get("LOCAL_RANK", "0")))
        dist.barrier()
        return reports
    finally:
        dist.destroy_process_group()


def measure_plan(
    request: PlanRequest, plan: ShardingPlan, settings: MeasureSettings
) -> MeasureReport | None:
    """Measure ``plan`` (valid for ``request``): under torchrun as its rank (``None`` on
    ranks other than 0), else spawned here once this machine is known to hold it."""
    reports = measure_plans(request, [plan], settings)
    return None if reports is None else reports[0]


def measure_plans(
    request: PlanRequest, plans: Sequence[ShardingPlan], settings: MeasureSettings
) -> list[MeasureReport] | None:
    """Measure ``plans`` (each valid for ``request``, one world size) side by side in the
    same ranks, a step of each in turn (``step.measure_rank_interleaved``): a report per
    plan, in their order (``None`` on torchrun ranks other than 0). Plans measured in
    separate runs differ by what the machine did between the runs as well (10 to 25%
    from one minute to the next on a shared VM); taken in turn, each step of one plan
    sits beside a step of every other."""
    if not plans:
        raise MeasureRefused("no plan to measure")
    if in_torchrun(os.environ):
        return join_environment(request, plans, settings)
    check_here(plans, settings.device)
    return spawn(request, plans, settings)
