"""The CP-SAT search: the model of ``model.py``, solved from the best plan so far as its
hint, first by one worker alone, then by the portfolio in one run or in probes and a long
run, stopped once a bound proves the plan good enough (``bounds/simple.proven_within``) or
at the deadline.

Search is deterministic: one worker, or interleaved workers, and a deterministic time limit
(``solve/cpsat_runner.py``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from ortools.sat.python import cp_model

from planner_service.costs.options import Placement
from planner_service.plan.types import gap
from planner_service.solve.bounds.simple import proven_within
from planner_service.solve.cpsat.model import HBM_STEPS, PlacementModel, build_s
from planner_service.solve.cpsat_runner import (
    COST_RESOLUTION,
    RELATIVE_GAP_LIMIT,
    deterministic_solver,
    single_worker_solver,
    solve_within,
)
from planner_service.solve.deadline import Deadline, OutOfTime
from planner_service.solve.problem import Choice, Group, Problem, loads_of

# The search budget is a fixed share of the request's time limit, never of the wall time
# left, so the same request searches exactly as far in every process. Interleaved search
# spends up to about 3x its deterministic budget in wall time on an idle 2-core machine
# (measured on the public workloads), hence the small share; the deadline (what is left
# of the time limit in wall time) stops it on a loaded machine, at the cost of
# determinism (the plan then says stop_reason time_limit).
SEARCH_SHARE = 0.2
# The best bound known before the search (the packing bound, say) is the makespan's floor,
# so CP-SAT stops once it reaches it; but interleaved search stops only between batches,
# and a batch gives each full-problem worker up to one deterministic second. So when the
# warm start is within PROBE_WITHIN of that bound, the budget is spent in runs: two short
# probes, then the rest. A probe's budget caps its batches; after each run the best plan
# is checked against every bound, and the next run starts from it (as its hint). Far from
# the bound (jumbo on 32 ranks: 11%) restarts only cost the long run plans.
PROBE_SHARES = (0.01, 0.1)
PROBE_WITHIN = 0.05
# Before the portfolio, one worker searches alone with this share of the budget
# (``cpsat_runner.single_worker_solver``): alone, it stops the moment its plan is proven
# within the gap limit, where the portfolio goes on to the end of its batch. Small
# problems end there: 20 tables on 4 ranks, memory-tight, proven within 2% after 0.007
# deterministic seconds alone, took the portfolio 1.3 (4 to 5 s of wall time). The
# others go on with the portfolio, from the lone worker's best plan.
FIRST_RUN_SHARE = 0.1
# Past this many placement variables the model keeps only a neighbourhood of the warm start
# (``PlacementModel``'s ``restrict``), and its bound is no proof.
MAX_PLACEMENT_VARS = 150_000

ProgressCallback = Callable[[str, float | None, float | None], None]


class CpSatStatus(StrEnum):
    """How the search's last CP-SAT run ended: CP-SAT's own status names."""

    OPTIMAL = "OPTIMAL"
    FEASIBLE = "FEASIBLE"
    INFEASIBLE = "INFEASIBLE"
    MODEL_INVALID = "MODEL_INVALID"
    UNKNOWN = "UNKNOWN"  # no run ended with an answer (or none ran)


@dataclass
class CpSatResult:
    choices: list[Choice] | None
    status: CpSatStatus
    bound: float | None  # proven lower bound in ms, only when the model was complete
    exact: bool
    num_variables: int
    wall_time_s: float
    runs: int  # CP-SAT runs (``_runs``): fewer than all when a bound stopped the search
    deterministic_time_s: float  # of all runs together, out of SEARCH_SHARE x time limit


def solve_cpsat(
    problem: Problem,
    groups: list[Group],
    hint: list[Choice] | None,
    *,
    time_limit_s: float,
    seed: int,
    lower_bound: float = 0.0,
    gap_limit: float = 0.0,
    on_progress: ProgressCallback | None = None,
    deadline: Deadline | None = None,
) -> CpSatResult:
    """Minimise the max rank cost, ties broken by the lower peak HBM (lexicographically:
    the HBM term, in thousandths of a rank's capacity, never outweighs one cost unit).

    Stops early once the best plan is proven within ``gap_limit`` by ``lower_bound`` (the
    best bound known before the search) or by CP-SAT's own bound (``PROBE_SHARES``), and
    at the deadline with the best plan found so far."""
    deadline = deadline or Deadline.never()
    start = time.perf_counter()
    reference = _reference_makespan(problem, hint)
    scale = COST_RESOLUTION / reference if reference > 0 else 1.0
    size = sum(
        len(group.allowed)
        for group in groups
        for option in group.options
        if option.placement is not Placement.FIXED
    )
    restrict = hint is not None and size > MAX_PLACEMENT_VARS
    if not deadline.allows(build_s(problem, groups, hint, restrict)):
        wall = time.perf_counter() - start
        return CpSatResult(None, CpSatStatus.UNKNOWN, None, not restrict, 0, wall, 0, 0.0)
    try:
        built = PlacementModel(problem, groups, hint, scale, restrict, deadline)
        makespan = built.makespan(
            math.floor(lower_bound * scale), makespan_upper(problem, hint, scale)
        )
        peak = built.peak_hbm()
    except OutOfTime:
        wall = time.perf_counter() - start
        return CpSatResult(None, CpSatStatus.UNKNOWN, None, not restrict, 0, wall, 0, 0.0)
    built.model.minimize(makespan * HBM_STEPS + peak)
    callback = _Progress(makespan, scale, on_progress) if on_progress else None
    budget = time_limit_s * SEARCH_SHARE
    probes = hint is not None and gap(reference, lower_bound) <= PROBE_WITHIN  # hint's makespan
    best: list[Choice] | None = None
    best_key = (math.inf, math.inf)
    bound = None  # a proof only when the model is the whole problem
    last_status = CpSatStatus.UNKNOWN
    runs, spent = 0, 0.0
    for run, (share, alone) in enumerate(_runs(probes)):
        if deadline.expired():
            break
        start_from = best or hint
        if start_from is not None:
            built.model.clear_hints()
            built.add_hint(start_from)
        solver = (single_worker_solver if alone else deterministic_solver)(
            budget * share, seed + run
        )
        solver.parameters.relative_gap_limit = max(RELATIVE_GAP_LIMIT, gap_limit)
        status = solve_within(solver, built.model, deadline, callback=callback)
        runs, last_status = run + 1, CpSatStatus(solver.status_name(status))
        spent += solver.deterministic_time
        if status == cp_model.INFEASIBLE or status == cp_model.MODEL_INVALID:
            break
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            continue
        choices = built.decode(solver)
        loads = loads_of(problem, choices)
        if (loads.objective, loads.peak_hbm) < best_key:
            best, best_key = choices, (loads.objective, loads.peak_hbm)
        if not restrict:
            proven = (solver.best_objective_bound - (HBM_STEPS - 1)) / HBM_STEPS / scale
            bound = max(bound or 0.0, proven)
        if status == cp_model.OPTIMAL or proven_within(
            best_key[0], max(lower_bound, bound or 0.0), gap_limit
        ):
            break
    num_variables = len(built.model.proto.variables)
    wall = time.perf_counter() - start
    return CpSatResult(best, last_status, bound, not restrict, num_variables, wall, runs, spent)


def _runs(probes: bool) -> list[tuple[float, bool]]:
    """Each run's share of the search budget, and whether one worker searches alone: the
    lone worker's run, then the portfolio's, in probes and a long run or in one."""
    rest = [*PROBE_SHARES, 1.0 - sum(PROBE_SHARES)] if probes else [1.0]
    return [(FIRST_RUN_SHARE, True)] + [((1.0 - FIRST_RUN_SHARE) * share, False) for share in rest]


def _reference_makespan(problem: Problem, hint: list[Choice] | None) -> float:
    if hint is not None:
        return loads_of(problem, hint).objective
    work = sum(min(problem.costs(o).work for o in t.options) for t in problem.tables)
    largest = max(
        (min(problem.costs(o).largest_shard for o in t.options) for t in problem.tables),
        default=0.0,
    )
    return work / problem.world_size + largest


def makespan_upper(problem: Problem, hint: list[Choice] | None, scale: float) -> int:
    """The makespan's upper bound in the model's units: the hint's, or all work on one rank."""
    if hint is not None:
        return math.ceil(loads_of(problem, hint).objective * scale) + 1
    total = sum(max(problem.costs(o).work for o in t.options) for t in problem.tables)
    return math.ceil(total * scale) + 1


class _Progress(cp_model.CpSolverSolutionCallback):
    def __init__(self, makespan: cp_model.IntVar, scale: float, report: ProgressCallback) -> None:
        super().__init__()
        self._makespan = makespan
        self._scale = scale
        self._report = report

    def on_solution_callback(self) -> None:
        bound = self.best_objective_bound / HBM_STEPS / self._scale
        self._report("cp-sat", self.value(self._makespan) / self._scale, bound)
