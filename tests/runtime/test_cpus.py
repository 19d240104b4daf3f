"""Pinning spawned cpu ranks (``runtime/cpus.py``): each rank its own block of the CPUs
the parent may use, in CPU order; none when the ranks need more than there are."""

from __future__ import annotations

import multiprocessing
import os

from runtime.cpus import pin_rank, rank_cpus


def test_each_rank_gets_its_own_block_in_cpu_order():
    available = {9, 2, 5, 7}
    assert [rank_cpus(r, 4, 1, available) for r in range(4)] == [[2], [5], [7], [9]]
    assert [rank_cpus(r, 2, 2, available) for r in range(2)] == [[2, 5], [7, 9]]
    assert rank_cpus(0, 1, 3, available) == [2, 5, 7]


def test_ranks_that_need_more_cpus_than_there_are_are_not_pinned():
    assert rank_cpus(0, 3, 1, {0, 1}) == []
    assert rank_cpus(1, 2, 2, {0, 1, 2}) == []
    assert rank_cpus(2, 2, 1, {0, 1}) == []  # no such rank
    assert rank_cpus(0, 1, 0, {0, 1}) == []


def _pinned(rank: int, world: int, out: multiprocessing.Queue) -> None:
    out.put((pin_rank(rank, world, 1), sorted(os.sched_getaffinity(0))))


def test_a_pinned_process_runs_on_its_cpus_only():
    available = os.sched_getaffinity(0)
    world = len(available)
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    last = context.Process(target=_pinned, args=(world - 1, world, out))
    last.start()
    cpus, affinity = out.get(timeout=60)
    last.join(timeout=60)
    assert cpus == [max(available)] and affinity == cpus
    alone = context.Process(target=_pinned, args=(0, world + 1, out))  # more ranks than CPUs
    alone.start()
    cpus, affinity = out.get(timeout=60)
    alone.join(timeout=60)
    assert cpus == [] and affinity == sorted(available)
