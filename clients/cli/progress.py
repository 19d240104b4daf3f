"""What the CLI prints on stderr while it plans: a line every few seconds while a solve
runs long (``ProgressLine``), and how far a what-if has got (``CellProgress``). Imports
only the standard library at the top: every command module imports it on start-up."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TextIO

if TYPE_CHECKING:
    from planner_service.check.source import Answer, OnProgress, PlanSource
    from planner_service.check.what_if import LeastWorldSize
    from planner_service.plan.api import CheckReport
    from planner_service.plan.types import PlanRequest


class ProgressLine:
    """Prints a progress line on stderr every 2 s while a solve runs longer than that."""

    INTERVAL_S = 2.0

    def __init__(self) -> None:
        self._state: tuple[str, float | None, float | None] = ("starting", None, None)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._start = time.monotonic()

    def update(self, stage: str, best: float | None, bound: float | None) -> None:
        self._state = (stage, best, bound)

    def __enter__(self) -> ProgressLine:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(self.INTERVAL_S):
            stage, best, bound = self._state
            parts = [f"planning: {time.monotonic() - self._start:.0f} s, {stage}"]
            if best is not None:
                parts.append(f"best {best:.6g} ms")
            if bound is not None:
                parts.append(f"bound {bound:.6g} ms")
            print(", ".join(parts), file=sys.stderr, flush=True)


class StageProgress:
    """A long-running command's stage on stderr (``shardplan calibrate``): one line each
    time the stage changes, and every ``INTERVAL_S`` while it runs, with the clock against
    the budget: ``calibrating: 12 s of 180 s, kernels: fused: 41 cases``."""

    INTERVAL_S = 2.0

    def __init__(
        self, label: str, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self._clock = clock
        self._stage = ""
        self._printed = -self.INTERVAL_S

    def __enter__(self) -> StageProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stream.flush()

    def update(self, progress: StageReport) -> None:
        now = self._clock()
        if progress.stage == self._stage and now - self._printed < self.INTERVAL_S:
            return
        self._stage, self._printed = progress.stage, now
        print(
            f"{self.label}: {progress.elapsed_s:.0f} s of {progress.budget_s:.0f} s, "
            f"{progress.stage}: {progress.detail}",
            file=self.stream,
            flush=True,
        )


class StageReport(Protocol):
    """What a stage reports (``runtime.calibrate.profile.Progress``)."""

    @property
    def stage(self) -> str: ...
    @property
    def detail(self) -> str: ...
    @property
    def elapsed_s(self) -> float: ...
    @property
    def budget_s(self) -> float: ...


def with_progress_line(source: PlanSource) -> PlanSource:
    """``source``, each of whose solves prints a ``ProgressLine`` while it takes long."""

    def planned(request: PlanRequest, *, on_progress: OnProgress | None = None) -> Answer:
        del on_progress  # the line hears the solve
        with ProgressLine() as progress:
            return source(request, on_progress=progress.update)

    return planned


class CellProgress:
    """How far a what-if has got, on stderr: a bar redrawn in place on a terminal, one line
    per finished cell elsewhere (a CI log)."""

    BAR_WIDTH = 24

    def __init__(
        self, total: int, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.total = total
        self.done = 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._clock = clock
        self._started = clock()

    def start(self, label: str) -> None:
        self._started = self._clock()
        if self.tty:
            self._draw(label)

    def finish(self, label: str, outcome: CheckReport | LeastWorldSize) -> None:
        from planner_service.reports.what_if import outcome_summary

        self.done += 1
        if self.tty:
            self._draw(label)
        else:
            seconds = self._clock() - self._started
            print(
                f"cell {self.done}/{self.total}: {label}: {outcome_summary(outcome)} "
                f"({seconds:.1f} s)",
                file=self.stream,
                flush=True,
            )

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")  # the bar goes; the answer follows on stdout
            self.stream.flush()

    def _draw(self, label: str) -> None:
        filled = self.BAR_WIDTH * self.done // self.total
        bar = "#" * filled + "." * (self.BAR_WIDTH - filled)
        self.stream.write(f"\r\x1b[K[{bar}] {self.done}/{self.total} {label}")
        self.stream.flush()
