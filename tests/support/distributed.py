"""Run a function on ``world_size`` processes joined by a gloo process group.

The processes are started once per world size and kept for the session (``RankPool``): a
run sends every rank the function and a fresh loopback port, each rank joins a new gloo
group on it, runs the function, waits at a barrier and destroys the group. Starting ranks
is most of a small run's cost (spawning, then importing torch, FBGEMM and the test's cases:
2 to 4 s a run on 2 cores), and the suite makes about a hundred runs.

Nothing hangs and nothing leaks from one run into the next: a run past its deadline, a rank
that raises or a rank that dies fails the run, naming the ranks, and the pool is killed and
started afresh for the next run (a failed run may leave its peers inside a collective); each
run restores the environment variables it changed.
"""

from __future__ import annotations

import atexit
import datetime
import multiprocessing
import os
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

from tests.support.servers import free_port

COLLECTIVE_TIMEOUT_S = 60
_POLL_S = 0.2


def _run_one(rank: int, world_size: int, fn: Callable[..., None], port: int, args: tuple) -> None:
    import torch.distributed as dist

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


def _serve(rank: int, world_size: int, jobs: Any, results: Any) -> None:
    """A rank's loop: one job at a time until told to stop (``None``)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    while (job := jobs.get()) is not None:
        fn, port, args = job
        environment = dict(os.environ)
        try:
            _run_one(rank, world_size, fn, port, args)
            results.put((rank, None))
        except BaseException:  # reported to the test, which raises it
            results.put((rank, traceback.format_exc()))
        finally:
            os.environ.clear()
            os.environ.update(environment)


class RankFailure(RuntimeError):
    """A run in which some rank raised, died or did not finish in time."""


class RankPool:
    """``world_size`` started processes that run jobs as one gloo group each time."""

    def __init__(self, world_size: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.world_size = world_size
        self._jobs = [context.SimpleQueue() for _ in range(world_size)]
        self._results = context.Queue()
        self._processes = [
            context.Process(
                target=_serve,
                args=(rank, world_size, self._jobs[rank], self._results),
                name=f"rank-{rank}-of-{world_size}",
                daemon=True,
            )
            for rank in range(world_size)
        ]
        for process in self._processes:
            process.start()

    def run(self, fn: Callable[..., None], args: tuple, timeout_s: float) -> None:
        port = free_port()
        for jobs in self._jobs:
            jobs.put((fn, port, args))
        failures = self._collect(time.monotonic() + timeout_s, timeout_s)
        if failures:
            raise RankFailure("\n".join(failures))

    def _collect(self, deadline: float, timeout_s: float) -> list[str]:
        """Every rank's outcome; on the first failure, the failures so far (the caller
        kills the pool, which ends the ranks still waiting in a collective)."""
        done: set[int] = set()
        failures: list[str] = []
        while len(done) < self.world_size and not failures:
            try:
                rank, error = self._results.get(timeout=_POLL_S)
            except queue.Empty:
                failures = self._dead_or_late(done, deadline, timeout_s)
                continue
            done.add(rank)
            if error is not None:
                failures.append(
                    f"\n-- Process {rank} terminated with the following error:\n{error}"
                )
        return failures

    def _dead_or_late(self, done: set[int], deadline: float, timeout_s: float) -> list[str]:
        dead = [
            f"rank {rank} died (exit code {process.exitcode})"
            for rank, process in enumerate(self._processes)
            if not process.is_alive() and rank not in done
        ]
        if dead:
            return dead
        if time.monotonic() > deadline:
            waiting = sorted(set(range(self.world_size)) - done)
            return [f"{self.world_size} ranks did not finish within {timeout_s} s: ranks {waiting}"]
        return []

    @property
    def alive(self) -> bool:
        return all(process.is_alive() for process in self._processes)

    def close(self) -> None:
        for jobs, process in zip(self._jobs, self._processes, strict=True):
            if process.is_alive():
                jobs.put(None)
        for process in self._processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)

    def kill(self) -> None:
        for process in self._processes:
            if process.is_alive():
                process.kill()
        for process in self._processes:
            process.join(timeout=5)


_pools: dict[int, RankPool] = {}


def _pool(world_size: int) -> RankPool:
    pool = _pools.get(world_size)
    if pool is None or not pool.alive:
        if pool is not None:
            pool.kill()
        pool = _pools[world_size] = RankPool(world_size)
    return pool


@atexit.register
def close_pools() -> None:
    while _pools:
        _pools.popitem()[1].close()


def run_ranks(fn: Callable[..., None], world_size: int, *args: Any, timeout_s: float = 240) -> None:
    """``fn(rank, world_size, *args)`` on every rank; raises ``RankFailure`` with the failing
    ranks' tracebacks if any rank fails, dies or time runs out. ``fn`` must be importable
    (defined at module level) and ``args`` picklable."""
    pool = _pool(world_size)
    try:
        pool.run(fn, args, timeout_s)
    except BaseException:
        _pools.pop(world_size, None)
        pool.kill()
        raise
