"""The collective stage: the all-to-all, reduce-scatter and all-gather the runtime issues
(``runtime.comm``: ``Group.all_to_all``, and ``reduce_scatter_with_grad`` whose backward is
the all-gather), timed on spawned ranks at each world size over message sizes from nothing
to a few MiB, and fit to ``latency_ms + ns_per_byte`` per byte a rank sends
(``CollectiveCoefficients``).

Every rank times every call; a call's time is the slowest rank's median, since a step waits
for it. The ranks stop together when the stage's share of the budget is spent (rank 0's
clock decides, all-reduced), so none waits in a collective the others left.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from planner_service.costs.calibrated import NS_PER_MS
from planner_service.plan.types import (
    MAX_FIXED_MS,
    MAX_NS_PER_BYTE,
    Collective,
    CollectiveCoefficients,
)
from runtime.calibrate.fit import fit_linear
from runtime.calibrate.ranks import run_ranks
from runtime.calibrate.timing import median_ms, median_pair_ms
from runtime.comm import Group, reduce_scatter_with_grad

MESSAGE_BYTES = (0, 1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20)
COLUMNS = 16  # fp32 columns of the rows exchanged (the outputs' layout)
ROW_BYTES = COLUMNS * 4
MEASURED = (Collective.ALL_TO_ALL, Collective.REDUCE_SCATTER, Collective.ALL_GATHER)
TERMS = ("latency_ms", "ns_per_byte")
ROUNDS = 3  # the sizes again while time is left


@dataclass(frozen=True)
class CollectiveSample:
    collective: Collective
    world_size: int
    buffer_bytes: int  # the rank's whole buffer: what it sends is (world - 1) / world of it
    ms: float

    @property
    def sent_bytes(self) -> float:
        return self.buffer_bytes * (self.world_size - 1) / self.world_size


def rows_of(buffer_bytes: int, world_size: int) -> int:
    """Rows per destination rank of a buffer of about ``buffer_bytes``."""
    return buffer_bytes // (ROW_BYTES * world_size)


def measure_rank(rank: int, world_size: int, deadline: float) -> list[tuple[int, str, int, float]]:
    """On one rank: (round, collective, buffer bytes, median ms) for each size, round
    after round (the first whatever the time: starting the ranks may have spent the share),
    until ``deadline`` (a ``time.monotonic`` time, which every process on the
    machine shares)."""
    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    group = Group(dist.group.WORLD)
    samples = []
    for i, buffer_bytes in enumerate(MESSAGE_BYTES * ROUNDS):
        round_ = i // len(MESSAGE_BYTES)
        if round_ > 0 and _anyone_past(time.monotonic() > deadline, device):
            break
        rows = rows_of(buffer_bytes, world_size)
        size = rows * world_size * ROW_BYTES
        a2a, rs, ag = _time_exchanges(group, rows, device)
        samples += [(round_, "all_to_all", size, a2a), (round_, "reduce_scatter", size, rs)]
        samples.append((round_, "all_gather", size, ag))
    return samples


def _time_exchanges(group: Group, rows: int, device: torch.device) -> tuple[float, float, float]:
    """Median ms of an all-to-all, a reduce-scatter and its backward all-gather of ``rows``
    rows to (from) each rank, as the runtime issues them."""
    splits = [rows] * group.world_size
    send = torch.ones((rows * group.world_size, COLUMNS), device=device)
    grad = torch.ones((rows, COLUMNS), device=device)

    def all_to_all() -> None:
        group.all_to_all(send, splits, splits)

    def reduce_scatter() -> torch.Tensor:  # a fresh leaf each call, as the runtime's
        return reduce_scatter_with_grad(send, group, splits)

    a2a = median_ms(all_to_all, device)
    rs, ag = median_pair_ms(reduce_scatter, lambda out: out.backward(grad), device)
    return a2a, rs, ag


def _anyone_past(past: bool, device: torch.device) -> bool:
    flag = torch.tensor([1.0 if past else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


def measure_world(
    world_size: int, deadline: float, timeout_s: float, cuda: bool, threads: int
) -> list[CollectiveSample]:
    """Every rank's timings at ``world_size``, the slowest rank's for each call."""
    per_rank = run_ranks(
        measure_rank, world_size, (deadline,), timeout_s=timeout_s, cuda=cuda, threads=threads
    )
    slowest: dict[tuple[int, str, int], float] = {}
    for samples in per_rank:
        for round_, name, size, ms in samples:
            key = (round_, name, size)
            slowest[key] = max(ms, slowest.get(key, 0.0))
    return [
        CollectiveSample(Collective(name), world_size, size, ms)
        for (_, name, size), ms in sorted(slowest.items())
    ]


def fit_collectives(samples: Sequence[CollectiveSample]) -> list[CollectiveCoefficients]:
    """One entry per collective and world size measured."""
    entries = []
    for kind in MEASURED:
        for world in sorted({s.world_size for s in samples if s.collective is kind}):
            mine = [s for s in samples if s.collective is kind and s.world_size == world]
            entries.append(fit_collective(kind, world, mine))
    return entries


def fit_collective(
    kind: Collective, world_size: int, samples: Sequence[CollectiveSample]
) -> CollectiveCoefficients:
    fit = fit_linear(
        TERMS,
        np.array([(1.0, s.sent_bytes) for s in samples], dtype=float),
        np.array([s.ms for s in samples], dtype=float),
    )
    latency_ms, ms_per_byte = fit.coefficients
    return CollectiveCoefficients(
        collective=kind,
        world_size=world_size,
        ranks_per_host=world_size,
        latency_ms=min(MAX_FIXED_MS, latency_ms),
        ns_per_byte=min(MAX_NS_PER_BYTE, ms_per_byte * NS_PER_MS),
        fit=fit.quality,
    )
