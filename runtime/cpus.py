"""Pinning the ranks spawned on this machine to CPUs of their own.

Ranks on cpu that the operating system may move between cores measure steps that differ by
who ran where: on the 2-core EPYC, six plans measured three times at world size 2 each
spread by a median 7 to 15% between rounds, and two rounds ranked them alike at Spearman's
ρ 0.71; with each rank on a core of its own, 7 to 9% and ρ 0.89 to 0.94, and the steps 5
to 10% shorter (``docs/benchmarks.md``, cost-model fidelity). A rank with ``threads``
threads gets a block of that many CPUs of the parent's (``os.sched_getaffinity``, which a
spawned child inherits), rank 0 the first; when the ranks need more CPUs than there are,
none is pinned (they share, as before). Ranks that torchrun starts, and ranks on cuda, are
left where their launcher put them.
"""

from __future__ import annotations

import os
from collections.abc import Collection


def rank_cpus(rank: int, world_size: int, threads: int, available: Collection[int]) -> list[int]:
    """The CPUs of ``available`` that rank ``rank`` of ``world_size`` (``threads`` each) is
    pinned to: its own block, in CPU order; none when the ranks need more CPUs than that."""
    if rank < 0 or rank >= world_size or threads < 1 or world_size * threads > len(available):
        return []
    ordered = sorted(available)
    return ordered[rank * threads : (rank + 1) * threads]


def pin_rank(rank: int, world_size: int, threads: int) -> list[int]:
    """Pin this process to its ``rank_cpus`` where the platform can; the CPUs it is pinned
    to, or none."""
    if not hasattr(os, "sched_setaffinity"):
        return []
    cpus = rank_cpus(rank, world_size, threads, os.sched_getaffinity(0))
    if cpus:
        os.sched_setaffinity(0, cpus)
    return cpus
