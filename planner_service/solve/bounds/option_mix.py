"""The option-mix relaxation: which options the tables take, without where their shards go.
A lower bound in milliseconds of CP-SAT time, on the relaxed view of ``relaxed.py``.

The LP (``lp.py``) mixes options fractionally; here every table takes one whole option, so
a table is either table-wise, with its one heavy shard on one rank, or row-wise, on every
rank: bounds set by a few big tables are proven at once. The packing relaxation
(``packing.py``) places the shards too, at more cost.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from planner_service.plan.types import BoundSource
from planner_service.solve.bounds.relaxed import (
    MEMORY_UNITS,
    RESOLUTION,
    Expr,
    MemoryWeights,
    option_counts,
    relaxation_solver,
    relaxed_options,
    total,
)
from planner_service.solve.bounds.simple import LowerBound
from planner_service.solve.cpsat_runner import solve_within
from planner_service.solve.deadline import Deadline
from planner_service.solve.problem import Group, Problem

# Beyond this many terms copied into the stacking rows, the every-rank load is a variable.
COPIED_TERMS = 1_000_000
OPTION_MIX_SHARE = 0.02  # of the time limit, for option_mix_bound (it needs milliseconds)
# The most of what is left of the deadline it may take in wall time, so that the stages
# after it keep time to run.
OPTION_MIX_WALL_SHARE = 0.1
# Building the model per option of the groups, measured on the idle 2-core machine: 5.4 s
# for the 53,083 options of 5,384 distinct memory-tight tables on 1,024 ranks (with
# margin). A build the deadline cannot hold is not started: its build does not look at
# the clock, and past the local search it ran a request 2 s over its time limit.
OPTION_MIX_S_PER_OPTION = 150e-6


def option_mix_bound(
    problem: Problem,
    groups: list[Group],
    upper: float,
    *,
    time_limit_s: float,
    seed: int,
    deadline: Deadline | None = None,
) -> LowerBound | None:
    """The relaxation of ``relaxed.py`` without its placement: whole options per table, and load
    spread over ranks fractionally, except that every rank carries the load of the options
    fixed on every rank, and each chosen option's heaviest shard (or table-row-wise share)
    sits on some rank on top of that. It knows what the LP cannot: a table is either
    table-wise, with its one heavy shard on one rank, or row-wise, on every rank; so it
    proves bounds set by a few big tables within milliseconds (Criteo on 8 ranks: 0.4% from
    the optimum, where the LP stops 7% short). Memory: the items' weights, and every
    option's bytes per tier in total (options on every rank and table-row-wise ones carry
    no items). None if it cannot be built, or not before the deadline."""
    if upper <= 0:
        return None
    build_s = OPTION_MIX_S_PER_OPTION * sum(len(group.options) for group in groups)
    if deadline is not None and not deadline.allows(build_s):
        return None
    scale = RESOLUTION / upper
    options = relaxed_options(problem, groups, upper, scale, MemoryWeights.of(problem))
    model = cp_model.CpModel()
    tables, every_rank = option_counts(model, groups, options)
    world, local = problem.world_size, problem.local_world_size
    makespan = model.new_int_var(0, RESOLUTION, "T")
    model.add(makespan >= every_rank)
    fixed_terms = sum(1 for o in options if o.every_rank)
    if fixed_terms * len(options) > COPIED_TERMS:
        # Each option's stacking row below repeats the every-rank load; with thousands of
        # options fixed on every rank, one variable holds it instead (2,692 distinct
        # tables on 512 ranks: 41 s of copying). The makespan bounds it, so its domain
        # removes no solution.
        held = model.new_int_var(0, RESOLUTION, "every_rank")
        model.add(held == every_rank)
        every_rank = held
    work: list[Expr] = []
    memory: list[list[Expr]] = [[], []]  # total weight per tier
    over_half: list[list[Expr]] = [[], []]  # items over half a rank per tier
    kib: list[list[Expr]] = [[], []]  # every shard's bytes per tier, in KiB rounded down
    for o in options:
        tables_on = tables[o.group, o.option]
        costs = problem.costs(groups[o.group].options[o.option])
        kib[0].append(costs.hbm_total // 1024 * tables_on)
        kib[1].append(costs.ddr_total // 1024 * tables_on)
        stacked = max([o.per_host_rank, *(kind[0] for kind in o.items)])
        if stacked:
            used = model.new_bool_var("")
            model.add(tables_on == 0).only_enforce_if(~used)
            model.add(makespan >= every_rank + stacked).only_enforce_if(used)
        load = sum(kind[0] * n for kind, n in o.items.items()) + local * o.per_host_rank
        work.append(load * tables_on)
        for tier in (0, 1):
            memory[tier].append(sum(kind[tier + 1] * n for kind, n in o.items.items()) * tables_on)
            halves = sum(n for kind, n in o.items.items() if 2 * kind[tier + 1] > MEMORY_UNITS)
            over_half[tier].append(halves * tables_on)
    model.add(world * makespan >= world * every_rank + total(work))
    for tier, capacity in enumerate((problem.hbm_total, problem.ddr_total)):
        model.add(total(memory[tier]) <= MEMORY_UNITS * world)
        model.add(total(over_half[tier]) <= world)
        model.add(total(kib[tier]) <= capacity // 1024)
    model.minimize(makespan)
    solver = relaxation_solver(time_limit_s, seed)
    status = solve_within(solver, model, deadline or Deadline.never(), share=OPTION_MIX_WALL_SHARE)
    if status == cp_model.MODEL_INVALID:  # pragma: no cover - a bug, not an input
        return None
    if status == cp_model.INFEASIBLE:  # no plan within ``upper``: a plan there is optimal
        return LowerBound(upper, BoundSource.OPTION_MIX)
    proven = min(solver.best_objective_bound, RESOLUTION)
    return LowerBound(proven / scale, BoundSource.OPTION_MIX) if proven > 0 else None
