"""Running CP-SAT the way every model in the planner runs it: deterministically, within a
deterministic budget, and stopped by the wall clock only as a last resort.

Perf is scaled to integers rounding down (``COST_RESOLUTION`` units per reference
makespan), so a scaled optimum never exceeds the true one and a proven bound divided by the
scale is a valid lower bound. Used by the search (``cpsat/search.py``) and by the
option-mix and packing relaxations (``bounds/``).
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from planner_service.solve.deadline import Deadline

COST_RESOLUTION = 10_000_000  # integer units per warm-start makespan
NUM_WORKERS = 4  # interleaved subsolvers (LNS among them), run deterministically
# Deterministic time does not advance evenly in every phase of a search: a run may spend
# many times its deterministic budget in wall time (a packing relaxation with presolve off
# was seen running for minutes on a 0.1 s budget), and CP-SAT looks at its deterministic
# limit only now and then (large/8's search, on a 0.2 s budget, does 1 s of deterministic
# work). So every run also stops at this many times its budget in wall time, and never
# before MIN_WALL_SAFETY_S, deadline or not. Such a stop is not reproducible and is
# recorded as one (stop_reason time_limit), so the cap is far enough out that a run which
# ends by its own budget on one machine also does on a machine several times slower.
WALL_SAFETY_FACTOR = 20.0
MIN_WALL_SAFETY_S = 2.0
RELATIVE_GAP_LIMIT = 1e-5  # stop once proven this close to optimal
# The core-guided worker raises a lower bound on the objective one step at a time. The
# objective here is a makespan of 10^7 units per plan (``COST_RESOLUTION``), so it climbs
# unit by unit, and its task does so without advancing deterministic time: on the README's
# request in 64 MiB it stepped 49,000 times in 3 s of wall time and 0.11 deterministic
# seconds, and held the whole interleaved search (proven optimal by the LP workers after
# 0.01 s) to the wall-clock limit. The LP workers prove the makespan's bounds.
IGNORED_SUBSOLVERS = ("core",)


def deterministic_solver(time_limit_s: float, seed: int) -> cp_model.CpSolver:
    """A portfolio of workers interleaved deterministically, stopped by deterministic time:
    the same request searches exactly as far, and answers the same, in every process
    (unless a wall-clock limit stops it first, see ``solve_within``)."""
    solver = cp_model.CpSolver()
    parameters = solver.parameters
    parameters.num_workers = NUM_WORKERS
    parameters.interleave_search = True
    parameters.random_seed = seed
    parameters.max_deterministic_time = max(time_limit_s, 0.01)
    parameters.relative_gap_limit = RELATIVE_GAP_LIMIT
    parameters.ignore_subsolvers.extend(IGNORED_SUBSOLVERS)
    # CP-SAT's own SIGINT handler only ends the current run (the solve would go on to its
    # next stage) and resets SIGINT afterwards; callers decide what Ctrl-C means.
    parameters.catch_sigint_signal = False
    return solver


def single_worker_solver(time_limit_s: float, seed: int) -> cp_model.CpSolver:
    """One worker searching alone, deterministic as the portfolio is. It stops the moment
    its plan is proven within the gap limit (or at its limit), where the interleaved
    portfolio only stops between batches of tasks, each full-problem worker's task up to
    one deterministic second."""
    solver = deterministic_solver(time_limit_s, seed)
    solver.parameters.num_workers = 1
    solver.parameters.interleave_search = False
    return solver


def solve_within(
    solver: cp_model.CpSolver,
    model: cp_model.CpModel,
    deadline: Deadline,
    *,
    share: float = 1.0,
    callback: cp_model.CpSolverSolutionCallback | None = None,
) -> cp_model.CpSolverStatus:
    """Solve with at most ``share`` of what is left of the deadline as the wall-clock limit
    (and at most ``WALL_SAFETY_FACTOR`` times the deterministic budget, or
    ``MIN_WALL_SAFETY_S`` if that is more), and record on the deadline whether a wall-clock
    limit, not the work budget, stopped the run. That holds even when CP-SAT says optimal:
    a run cut by the clock may still report optimal (within its gap limit) from wherever
    the cut left it, and another machine would cut it elsewhere."""
    budget_s = solver.parameters.max_deterministic_time
    safety_s = max(budget_s * WALL_SAFETY_FACTOR, MIN_WALL_SAFETY_S)
    limit_s = deadline.cap_s(safety_s, share)
    solver.parameters.max_time_in_seconds = max(limit_s, 1e-3)
    status = solver.solve(model, callback)
    deadline.note_stop(limit_s, solver.wall_time)
    return status
