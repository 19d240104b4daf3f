"""The calibration's clock: the budget every stage draws its share of (``Budget``), and the
small timing loop each measurement runs (``median_ms``): warm-up calls, then the median of
several, the device synchronised around each on CUDA."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")

WARMUP_CALLS = 2
REPETITIONS = 5


class Budget:
    """Seconds left until the whole calibration must be done, handed out stage by stage: a
    stage gets its share of what is left (less what the later stages are kept), stops its
    grid when the share is spent and fits what it measured."""

    def __init__(
        self,
        total_s: float,
        clock: Callable[[], float] = time.monotonic,
        started: float | None = None,
    ) -> None:
        self.total_s = total_s
        self._clock = clock
        self.started = clock() if started is None else started

    def elapsed_s(self) -> float:
        return self._clock() - self.started

    def left_s(self) -> float:
        return max(0.0, self.total_s - self.elapsed_s())

    def deadline(self, share: float, keep_s: float = 0.0) -> float:
        """A clock time ``share`` of the seconds left (after ``keep_s`` are kept back) from
        now."""
        return self._clock() + share * max(0.0, self.left_s() - keep_s)

    def now(self) -> float:
        return self._clock()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(
    call: Callable[[], None],
    device: torch.device,
    warmup: int = WARMUP_CALLS,
    repetitions: int = REPETITIONS,
) -> float:
    """The median milliseconds of ``repetitions`` calls of ``call`` after ``warmup``."""
    first, _ = median_pair_ms(call, lambda _: None, device, warmup, repetitions)
    return first


def median_pair_ms(
    first: Callable[[], T],
    second: Callable[[T], None],
    device: torch.device,
    warmup: int = WARMUP_CALLS,
    repetitions: int = REPETITIONS,
    prepare: Callable[[], None] | None = None,
) -> tuple[float, float]:
    """The median milliseconds of ``first()`` and of ``second`` of its result (a forward and
    the backward that needs its output), each timed on its own, over ``repetitions`` pairs
    after ``warmup``; ``prepare`` runs, untimed, before each pair."""
    for _ in range(warmup):
        if prepare is not None:
            prepare()
        second(first())
    synchronize(device)
    firsts, seconds = [], []
    for _ in range(repetitions):
        if prepare is not None:
            prepare()
            synchronize(device)
        start = time.perf_counter()
        value = first()
        synchronize(device)
        middle = time.perf_counter()
        second(value)
        synchronize(device)
        firsts.append((middle - start) * 1e3)
        seconds.append((time.perf_counter() - middle) * 1e3)
    return statistics.median(firsts), statistics.median(seconds)
