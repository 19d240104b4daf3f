"""Ranks spawned on this machine for the stages that need a process group: ``run_ranks``
starts ``world_size`` processes joined by gloo (cpu) or NCCL (one GPU each), runs a
function on each and returns what each returned.

Nothing outlives the calibration or hangs it: every rank asks the kernel to kill it when the
parent ends (``prctl(PR_SET_PDEATHSIG)``), every collective has the process group's
timeout, and a rank that raises, dies or is late past the deadline ends the stage with
``RankFailedError`` naming it; the others are killed.
"""

from __future__ import annotations

import ctypes
import datetime
import multiprocessing
import os
import queue
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from runtime.cpus import pin_rank

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
POLL_S = 0.2
TRACEBACK_LINES = 6  # of a failing rank's traceback, in the error
ERROR_GRACE_S = 3.0
PEER_GONE = "closed by peer"


class RankFailedError(RuntimeError):
    """A rank raised, died or did not finish in time; the message names it."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _end_with(parent_pid: int) -> None:
    """SIGKILL from the kernel when the parent ends (Linux); exit now if it already has."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def _rank_main(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    settings: tuple[int, bool, float, int],
    args: tuple[Any, ...],
    results: Any,
) -> None:
    parent_pid, cuda, timeout_s, threads = settings
    _end_with(parent_pid)
    if not cuda:  # as measured plans' ranks are (runtime/cpus.py)
        pin_rank(rank, world_size, threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        if cuda:
            torch.cuda.set_device(rank)
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        try:
            value = fn(rank, world_size, *args)
            dist.barrier()
        finally:
            dist.destroy_process_group()
        results.put((rank, value, None))
    except BaseException:  # sent to the parent, which names this rank
        lines = traceback.format_exc().strip().splitlines()
        results.put((rank, None, "\n".join(lines[-TRACEBACK_LINES:])))


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...],
    *,
    timeout_s: float,
    cuda: bool = False,
    threads: int = 1,
) -> list[Any]:
    """``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks; each rank's return
    value, by rank. ``fn`` must be importable (module level) and its values picklable."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    settings = (os.getpid(), cuda, timeout_s, threads)
    port = free_port()
    processes = [
        context.Process(
            target=_rank_main,
            args=(fn, rank, world_size, port, settings, args, results),
            name=f"calibrate-rank-{rank}-of-{world_size}",
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    try:
        return _collect(processes, results, time.monotonic() + timeout_s, timeout_s)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=5)


def _collect(processes: list[Any], results: Any, deadline: float, timeout_s: float) -> list[Any]:
    values: dict[int, Any] = {}
    while len(values) < len(processes):
        try:
            rank, value, error = results.get(timeout=POLL_S)
        except queue.Empty:
            _check_alive(processes, values, deadline, timeout_s)
            continue
        if error is not None:
            errors = {rank: error, **_more_errors(results, len(processes) - len(values) - 1)}
            raise RankFailedError(_failure_message(errors, len(processes)))
        values[rank] = value
    return [values[rank] for rank in range(len(processes))]


def _more_errors(results: Any, pending: int) -> dict[int, str]:
    """The other ranks' errors within ``ERROR_GRACE_S``: a rank's failure often reaches the
    parent first from a peer, whose collective saw the connection close."""
    errors: dict[int, str] = {}
    end = time.monotonic() + ERROR_GRACE_S
    while len(errors) < pending and time.monotonic() < end:
        try:
            rank, _, error = results.get(timeout=POLL_S)
        except queue.Empty:
            continue
        if error is not None:
            errors[rank] = error
    return errors


def _failure_message(errors: dict[int, str], world_size: int) -> str:
    """Each failed rank's error, the ranks that failed on their own first and those whose
    peer went away (gloo: "Connection closed by peer") after them."""
    order = sorted(errors, key=lambda rank: (PEER_GONE in errors[rank], rank))
    return "\n".join(f"rank {rank} of {world_size} failed:\n{errors[rank]}" for rank in order)


def _check_alive(
    processes: list[Any], done: dict[int, Any], deadline: float, timeout_s: float
) -> None:
    for rank, process in enumerate(processes):
        # A rank that exits 0 has put its value, still on its way through the queue.
        if rank not in done and process.exitcode not in (None, 0):
            raise RankFailedError(
                f"rank {rank} of {len(processes)} died (exit code {process.exitcode})"
            )
    if time.monotonic() > deadline:
        late = sorted(set(range(len(processes))) - set(done))
        raise RankFailedError(
            f"ranks {late} of {len(processes)} did not finish within {timeout_s:.0f} s"
        )
