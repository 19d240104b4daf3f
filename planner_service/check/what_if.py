"""The check's what-if questions: the same model on other clusters.

- The sweep (``sweep``): a matrix, rows world sizes, columns HBM per rank, each cell the
  check of the request changed that way. At most ``MAX_CELLS`` cells; each is a full solve
  within the request's ``options.time_limit_s``, so a sweep takes at most cells x
  time_limit_s.
- The least world size (``least_world_sizes``, per HBM size when given): the request is
  planned, then the planner's world-size search runs below its world size when it fits
  (the caller's ``WorldSizeSearch``: the solver's, ``solve/explain.py``) or, when it does
  not, the planner's own ``min_world_size`` fix is taken; the size found is checked. At
  most three solves' time limits per HBM size.

Every cell's request is built, and so validated, before the first solve. A world size
above the request's ``local_world_size`` must be whole hosts; one below it is one host.
Errors name the inputs as the caller spells them (``WhatIfNames``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from planner_service.check.report import check_report
from planner_service.check.source import Answer, PlanSource
from planner_service.plan.api import CHECK_SCHEMA_VERSION, CheckReport
from planner_service.plan.errors import FieldProblem, InputError
from planner_service.plan.types import ComputeDevice, PlanRequest
from planner_service.plan.units import size as byte_size
from planner_service.plan.variants import resized, with_topology

MAX_CELLS = 64


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True)


class Cell(_Result):
    """One what-if: the request at ``world_size`` ranks of ``hbm_bytes`` HBM each. Its
    check leaves out the per-rank list."""

    world_size: int
    hbm_bytes: int
    check: CheckReport


class Sweep(_Result):
    """``shardplan check --world-sizes ... --hbm ... --format json``."""

    schema_version: str = CHECK_SCHEMA_VERSION
    time_limit_s: float
    local_world_size: int
    world_sizes: list[int]
    hbm_bytes: list[int]
    cells: list[Cell]

    @property
    def passed(self) -> bool:
        """A sweep passes when any cell's check does."""
        return any(cell.check.fits for cell in self.cells)


class LeastWorldSize(_Result):
    """The fewest ranks of ``hbm_bytes`` HBM that plan, and the check there; or none up to
    ``searched_up_to``."""

    hbm_bytes: int
    min_world_size: int | None
    searched_up_to: int | None = None
    check: CheckReport | None = None


class LeastWorldSizes(_Result):
    """``shardplan check --min-world-size --format json``."""

    schema_version: str = CHECK_SCHEMA_VERSION
    rows: list[LeastWorldSize]

    @property
    def passed(self) -> bool:
        """Every HBM size has a least world size whose check passes."""
        return all(row.check is not None and row.check.fits for row in self.rows)


@dataclass(frozen=True)
class WhatIfNames:
    """How the caller spells the what-if's inputs, for the errors that name them:
    ``source`` (an ``InputError``'s), the world sizes and the HBM sizes."""

    source: str
    world_sizes: str
    hbm: str


class FoundWorldSize(Protocol):
    """What a world-size search found: the least size that plans, or none, and then the
    largest size ruled out when it ended."""

    @property
    def min_world_size(self) -> int | None: ...

    @property
    def searched_up_to(self) -> int | None: ...


# The fewest ranks below a request's world size (which has a plan) that still plan.
WorldSizeSearch = Callable[[PlanRequest], FoundWorldSize]


class WhatIfProgress(Protocol):
    """Hears how far a what-if has got: a cell's label as it starts, its outcome (a
    sweep cell's check, a least world size's row) when it ends, and the end."""

    def start(self, label: str) -> None: ...

    def finish(self, label: str, outcome: CheckReport | LeastWorldSize) -> None: ...

    def close(self) -> None: ...


# Given the number of cells, the progress that hears about them.
ProgressFactory = Callable[[int], WhatIfProgress]


class _Silent:
    def __init__(self, cells: int) -> None:
        del cells

    def start(self, label: str) -> None:
        del label

    def finish(self, label: str, outcome: CheckReport | LeastWorldSize) -> None:
        del label, outcome

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class WhatIf:
    """How a what-if is answered: ``source`` plans each cell's request, every cell is
    checked against ``max_hbm_utilization``, errors name the inputs as ``names`` spells
    them, and ``progress`` (given the number of cells) hears how far it has got."""

    source: PlanSource
    names: WhatIfNames
    max_hbm_utilization: float | None = None
    progress: ProgressFactory = _Silent


# --------------------------------------------------------------------------- questions


def sweep(
    request: PlanRequest, world_sizes: Sequence[int], hbm_sizes: Sequence[int], how: WhatIf
) -> Sweep:
    """Check ``request`` at every world size (rows) and HBM size (columns)."""
    rows = list(world_sizes) or [request.topology.world_size]
    columns = list(hbm_sizes) or [request.topology.hbm_bytes or 0]
    _check_cells(len(rows) * len(columns), how.names)
    variants = [
        (size, hbm, _variant(request, size, hbm, bool(hbm_sizes), how.names))
        for size in rows
        for hbm in columns
    ]
    heard = how.progress(len(variants))
    cells = []
    for size, hbm, variant in variants:
        label = f"world_size {size}, HBM {byte_size(hbm)}"
        heard.start(label)
        report = _checked(variant, how.source(variant), how.max_hbm_utilization)
        cells.append(Cell(world_size=size, hbm_bytes=hbm, check=report))
        heard.finish(label, report)
    heard.close()
    return Sweep(
        time_limit_s=request.options.time_limit_s,
        local_world_size=request.topology.num_local_ranks,
        world_sizes=rows,
        hbm_bytes=columns,
        cells=cells,
    )


def least_world_sizes(
    request: PlanRequest, hbm_sizes: Sequence[int], search: WorldSizeSearch, how: WhatIf
) -> LeastWorldSizes:
    """The least world size that plans, for the request's HBM or each of ``hbm_sizes``."""
    columns = list(hbm_sizes) or [request.topology.hbm_bytes or 0]
    _check_cells(len(columns), how.names)
    variants = [
        (hbm, _variant(request, request.topology.world_size, hbm, bool(hbm_sizes), how.names))
        for hbm in columns
    ]
    heard = how.progress(len(variants))
    rows = []
    for hbm, variant in variants:
        label = f"HBM {byte_size(hbm)}"
        heard.start(label)
        rows.append(_least_at(variant, search, how))
        heard.finish(label, rows[-1])
    heard.close()
    return LeastWorldSizes(rows=rows)


def _least_at(request: PlanRequest, search: WorldSizeSearch, how: WhatIf) -> LeastWorldSize:
    """Plan ``request``; search below its world size when it fits, else take the
    planner's own fix; then check the size found."""
    answer = how.source(request)
    if answer.plan is not None:
        search_found = search(request)
        found, searched_up_to = search_found.min_world_size, search_found.searched_up_to
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
        answer = how.source(request)
    return row.model_copy(update={"check": _checked(request, answer, how.max_hbm_utilization)})


def _check_cells(cells: int, names: WhatIfNames) -> None:
    if cells > MAX_CELLS:
        raise InputError(
            names.source,
            [
                FieldProblem(
                    f"{names.world_sizes} x {names.hbm}",
                    f"at most {MAX_CELLS} cells, each a solve of up to options.time_limit_s; "
                    "sweep fewer sizes at a time",
                    cells,
                )
            ],
        )


def _variant(
    request: PlanRequest, world_size: int, hbm_bytes: int, set_hbm: bool, names: WhatIfNames
) -> PlanRequest:
    """The request at ``world_size`` ranks (and ``hbm_bytes`` each, when ``set_hbm``), or an
    ``InputError`` naming the input whose value makes it impossible."""
    topology = request.topology
    local = topology.num_local_ranks
    if world_size > local and world_size % local:
        raise InputError(
            names.source,
            [
                FieldProblem(
                    names.world_sizes,
                    f"{world_size} ranks are not whole hosts of the request's "
                    f"local_world_size {local}; accepted: 1 to {local} (one host) or a multiple "
                    f"of {local}",
                    world_size,
                )
            ],
        )
    if set_hbm and topology.compute_device is not ComputeDevice.CUDA:
        raise InputError(
            names.source,
            [
                FieldProblem(
                    names.hbm,
                    f"the request's topology is cpu: tables live in DDR there, and {names.hbm} "
                    "applies to cuda topologies only",
                    byte_size(hbm_bytes),
                )
            ],
        )
    try:
        variant = resized(request, world_size) if world_size != topology.world_size else request
        return with_topology(variant, hbm_bytes=hbm_bytes) if set_hbm else variant
    except InputError as error:
        problems = "; ".join(problem.render() for problem in error.problems)
        raise InputError(
            names.source,
            [
                FieldProblem(
                    names.world_sizes,
                    f"the request on {world_size} ranks is not valid: {problems}",
                    world_size,
                )
            ],
        ) from None


def _checked(request: PlanRequest, answer: Answer, limit: float | None) -> CheckReport:
    """The check of one what-if, without the per-rank list."""
    report = check_report(request, answer.plan, answer.infeasibility, max_hbm_utilization=limit)
    return report.model_copy(update={"ranks": []})
