"""Run a function on ``world_size`` spawned processes joined by a gloo process group.

Each run gets a free loopback port and a deadline; a rank that raises fails the run with its
traceback, and a run past its deadline is killed and fails, so nothing hangs.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from tests.servers import free_port

COLLECTIVE_TIMEOUT_S = 60


def _entry(rank: int, fn: Callable[..., None], world_size: int, port: int, args: tuple) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    try:
        fn(rank, world_size, *args)
        # No rank tears its gloo pairs down while a peer may still be using them: under load
        # a rank leaving first has aborted its peer in gloo's threads ("terminate called
        # without an active exception", SIGABRT) after every check had passed.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., None], world_size: int, *args: Any, timeout_s: float = 240) -> None:
    """``fn(rank, world_size, *args)`` on every rank; raises if any rank fails or time runs
    out. ``fn`` must be importable (defined at module level)."""
    context = mp.start_processes(
        _entry,
        args=(fn, world_size, free_port(), args),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=0.5):
        if time.monotonic() > deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            raise TimeoutError(f"{world_size} ranks did not finish within {timeout_s} s")
