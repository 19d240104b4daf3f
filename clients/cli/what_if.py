"""``shardplan check``'s what-if questions: the same model on other clusters.

- The sweep, ``--world-sizes 8,16,32 --hbm 40GiB,80GiB``: a matrix, rows world sizes,
  columns HBM per rank, each cell the check of the request changed that way. At most
  ``MAX_CELLS`` cells; each is a full solve within the request's ``options.time_limit_s``,
  so a sweep takes at most cells x time_limit_s.
- The least world size, ``--min-world-size`` (per ``--hbm`` size when given): the request
  is solved, then the planner's world-size search (``solve/explain.py``) runs below its
  world size when it fits or above it when it does not, and the size found is checked.
  At most three solves' time limits per HBM size.

Every cell's request is built, and so validated, before the first solve. A world size
above the request's ``local_world_size`` must be whole hosts; one below it is one host.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from pydantic import BaseModel

from clients.cli.check_report import CHECK_SCHEMA_VERSION, CheckReport, Verdict, check_report
from clients.cli.extras import needs_extra
from clients.cli.numbers import SOURCE
from clients.cli.plan_source import Answer, PlanSource
from planner_service.plan.errors import FieldProblem, InputError
from planner_service.plan.types import ComputeDevice, PlanRequest
from planner_service.plan.units import gib
from planner_service.plan.variants import resized, with_topology
from planner_service.reports import text_table

MAX_CELLS = 64


class Cell(BaseModel):
    """One what-if: the request at ``world_size`` ranks of ``hbm_bytes`` HBM each. Its
    check leaves out the per-rank list."""

    world_size: int
    hbm_bytes: int
    check: CheckReport


class Sweep(BaseModel):
    """``shardplan check --world-sizes ... --hbm ... --format json``."""

    schema_version: str = CHECK_SCHEMA_VERSION
    time_limit_s: float
    local_world_size: int
    world_sizes: list[int]
    hbm_bytes: list[int]
    cells: list[Cell]


class LeastWorldSize(BaseModel):
    """The fewest ranks of ``hbm_bytes`` HBM that plan, and the check there; or none up to
    ``searched_up_to``."""

    hbm_bytes: int
    min_world_size: int | None
    searched_up_to: int | None = None
    check: CheckReport | None = None


class LeastWorldSizes(BaseModel):
    """``shardplan check --min-world-size --format json``."""

    schema_version: str = CHECK_SCHEMA_VERSION
    rows: list[LeastWorldSize]


# --------------------------------------------------------------------------- questions


def sweep(
    request: PlanRequest,
    world_sizes: Sequence[int],
    hbm_sizes: Sequence[int],
    source: PlanSource,
    *,
    max_hbm_utilization: float | None = None,
    progress: Progress | None = None,
) -> Sweep:
    """Check ``request`` at every world size (rows) and HBM size (columns)."""
    rows = list(world_sizes) or [request.topology.world_size]
    columns = list(hbm_sizes) or [request.topology.hbm_bytes or 0]
    _check_cells(len(rows) * len(columns))
    variants = [
        (size, hbm, _variant(request, size, hbm, bool(hbm_sizes)))
        for size in rows
        for hbm in columns
    ]
    progress = progress or Progress(len(variants))
    cells = []
    for size, hbm, variant in variants:
        label = _label(size, hbm)
        progress.start(label)
        report = _checked(variant, source(variant), max_hbm_utilization)
        cells.append(Cell(world_size=size, hbm_bytes=hbm, check=report))
        progress.finish(label, cell_summary(report))
    progress.close()
    return Sweep(
        time_limit_s=request.options.time_limit_s,
        local_world_size=request.topology.num_local_ranks,
        world_sizes=rows,
        hbm_bytes=columns,
        cells=cells,
    )


def least_world_sizes(
    request: PlanRequest,
    hbm_sizes: Sequence[int],
    source: PlanSource,
    *,
    max_hbm_utilization: float | None = None,
    progress: Progress | None = None,
) -> LeastWorldSizes:
    """The least world size that plans, for the request's HBM or each of ``hbm_sizes``."""
    columns = list(hbm_sizes) or [request.topology.hbm_bytes or 0]
    _check_cells(len(columns))
    variants = [
        (hbm, _variant(request, request.topology.world_size, hbm, bool(hbm_sizes)))
        for hbm in columns
    ]
    progress = progress or Progress(len(variants))
    rows = []
    for hbm, variant in variants:
        label = f"HBM {gib(hbm)}"
        progress.start(label)
        rows.append(_least_at(variant, source, max_hbm_utilization))
        progress.finish(label, least_summary(rows[-1]))
    progress.close()
    return LeastWorldSizes(rows=rows)


def _least_at(request: PlanRequest, source: PlanSource, limit: float | None) -> LeastWorldSize:
    """Plan ``request``; search below its world size when it fits (the planner's search),
    else take the planner's own fix; then check the size found."""
    answer = source(request)
    if answer.plan is not None:  # the search runs here, also when the service planned
        with needs_extra("check --min-world-size", "planner"):
            from planner_service.solve.deadline import Deadline
            from planner_service.solve.explain import least_world_size
        deadline = Deadline.for_time_limit(request.options.time_limit_s)
        search = least_world_size(request, deadline, fits=True)
        found, searched_up_to = search.min_world_size, search.searched_up_to
    else:
        assert answer.infeasibility is not None
        fixes = answer.infeasibility.fixes
        found, searched_up_to = fixes.min_world_size, fixes.min_world_size_searched_up_to
    row = LeastWorldSize(
        hbm_bytes=request.topology.hbm_bytes or 0,
        min_world_size=found,
        searched_up_to=searched_up_to,
    )
    if found is None:
        return row
    if found != request.topology.world_size:
        request = resized(request, found)
        answer = source(request)
    return row.model_copy(update={"check": _checked(request, answer, limit)})


def _check_cells(cells: int) -> None:
    if cells > MAX_CELLS:
        raise InputError(
            SOURCE,
            [
                FieldProblem(
                    "--world-sizes x --hbm",
                    f"at most {MAX_CELLS} cells, each a solve of up to options.time_limit_s; "
                    "sweep fewer sizes at a time",
                    cells,
                )
            ],
        )


def _variant(request: PlanRequest, world_size: int, hbm_bytes: int, set_hbm: bool) -> PlanRequest:
    """The request at ``world_size`` ranks (and ``hbm_bytes`` each, when ``set_hbm``), or an
    ``InputError`` naming the option whose value makes it impossible."""
    topology = request.topology
    local = topology.num_local_ranks
    if world_size > local and world_size % local:
        raise InputError(
            SOURCE,
            [
                FieldProblem(
                    "--world-sizes",
                    f"{world_size} ranks are not whole hosts of the request's "
                    f"local_world_size {local}; accepted: 1 to {local} (one host) or a multiple "
                    f"of {local}",
                    world_size,
                )
            ],
        )
    if set_hbm and topology.compute_device is not ComputeDevice.CUDA:
        raise InputError(
            SOURCE,
            [
                FieldProblem(
                    "--hbm",
                    "the request's topology is cpu: tables live in DDR there, and --hbm applies "
                    "to cuda topologies only",
                    gib(hbm_bytes),
                )
            ],
        )
    try:
        variant = resized(request, world_size) if world_size != topology.world_size else request
        return with_topology(variant, hbm_bytes=hbm_bytes) if set_hbm else variant
    except InputError as error:
        problems = "; ".join(problem.render() for problem in error.problems)
        raise InputError(
            SOURCE,
            [
                FieldProblem(
                    "--world-sizes",
                    f"the request on {world_size} ranks is not valid: {problems}",
                    world_size,
                )
            ],
        ) from None


def _checked(request: PlanRequest, answer: Answer, limit: float | None) -> CheckReport:
    """The check of one what-if, without the per-rank list."""
    report = check_report(request, answer.plan, answer.infeasibility, max_hbm_utilization=limit)
    return report.model_copy(update={"ranks": []})


def _label(world_size: int, hbm_bytes: int) -> str:
    return f"world_size {world_size}, HBM {gib(hbm_bytes)}"


# --------------------------------------------------------------------------- progress


class Progress:
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

    def finish(self, label: str, outcome: str) -> None:
        self.done += 1
        if self.tty:
            self._draw(label)
        else:
            seconds = self._clock() - self._started
            print(
                f"cell {self.done}/{self.total}: {label}: {outcome} ({seconds:.1f} s)",
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


# --------------------------------------------------------------------------- rendering


def cell_summary(report: CheckReport) -> str:
    """A check in a few words: max-rank perf and the least headroom, or why it fails."""
    if report.verdict is Verdict.NO_PLAN:
        assert report.infeasibility is not None
        fix = report.infeasibility.fixes.min_world_size
        return f"no plan (world_size {fix} fits)" if fix is not None else "no plan"
    assert report.headroom is not None and report.objective is not None
    least = report.headroom.least
    if report.verdict is Verdict.OVER_LIMIT:
        worst = report.over_limit[0]
        return f"over: rank {worst.rank} at {worst.utilization:.1%}, {report.objective:.4g} ms"
    share = least.free_bytes / least.usable_bytes if least.usable_bytes else 0.0
    return f"{report.objective:.4g} ms, {gib(least.free_bytes)} free ({share:.0%})"


def least_summary(row: LeastWorldSize) -> str:
    if row.min_world_size is None:
        return f"none up to {row.searched_up_to}"
    assert row.check is not None
    return f"world_size {row.min_world_size}: {cell_summary(row.check)}"


def sweep_table(result: Sweep, markdown: bool) -> str:
    header = ["world size", *(f"HBM {gib(hbm)}" for hbm in result.hbm_bytes)]
    by_cell = {(c.world_size, c.hbm_bytes): c.check for c in result.cells}
    rows = [
        [str(size), *(cell_summary(by_cell[size, hbm]) for hbm in result.hbm_bytes)]
        for size in result.world_sizes
    ]
    legend = (
        f"world sizes in hosts of {result.local_world_size} ranks, as the request's; each "
        "cell: max-rank perf (ms per iteration) and the least headroom (free of a rank's "
        "usable memory), or why the check fails; "
        f"each a solve of up to {result.time_limit_s:g} s"
    )
    return _table(header, rows, legend, markdown)


def least_table(result: LeastWorldSizes, markdown: bool) -> str:
    header = ["HBM per rank", "least world size", "there: max-rank perf, least headroom"]
    rows = []
    for row in result.rows:
        if row.min_world_size is None:
            rows.append([gib(row.hbm_bytes), f"none up to {row.searched_up_to}", "-"])
        else:
            assert row.check is not None
            rows.append([gib(row.hbm_bytes), str(row.min_world_size), cell_summary(row.check)])
    legend = "the fewest ranks at which the planner found a plan"
    return _table(header, rows, legend, markdown)


def _table(header: list[str], rows: list[list[str]], legend: str, markdown: bool) -> str:
    if not markdown:
        return text_table(header, rows) + f"\n({legend})\n"
    lines = [f"| {' | '.join(header)} |", "|" + " --- |" * len(header)]
    lines += [f"| {' | '.join(row)} |" for row in rows]
    return "\n".join(lines) + f"\n\n{legend[0].upper()}{legend[1:]}.\n"
