"""The relaxed view of a request that the option-mix (``option_mix.py``) and packing
(``packing.py``) relaxations share, solved with CP-SAT:

- pinned ranks and colocate/separate groups are dropped; memory is kept only as coarse
  per-item weights (``MemoryWeights``: a rank holds 16 units, a shard over half a rank
  weighs 9), enough to keep apart two tables that cannot share a rank;
- every shard costs what it costs on its cheapest device class;
- an option on every rank (row-wise, data-parallel) adds its cheapest shard to every rank;
- a table-row-wise table adds its cheapest shard to every rank of one host;
- every other shard (table-wise, column-wise, table-column-wise) is an *item* any rank may
  take, shards of one table included.

Every plan maps onto a solution of either relaxation with no larger makespan, so their
optima (and any bound CP-SAT proves on them) are lower bounds for the request. Perf is
scaled to integers rounding down, as in the CP-SAT search (``cpsat/``), so the scaled
optimum never exceeds the true one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ortools.sat.python import cp_model

from planner_service.costs.options import Placement
from planner_service.plan.types import ShardingType
from planner_service.solve.cpsat_runner import COST_RESOLUTION, single_worker_solver
from planner_service.solve.problem import Group, OptionCosts, Problem

RESOLUTION = COST_RESOLUTION  # integer units per warm-start makespan, as in the main model
MEMORY_UNITS = 16  # a rank's HBM (and DDR) in item weights, see MemoryWeights (even)

Expr = cp_model.LinearExpr | int
Item = tuple[int, int, int]  # (perf units, HBM units, DDR units), rounded down


@dataclass(frozen=True)
class RelaxedOption:
    """One option of a group as the relaxations see it."""

    group: int
    option: int
    every_rank: int  # units added to every rank
    per_host_rank: int  # units added to every rank of one host (table-row-wise)
    items: dict[Item, int]  # item kind -> how many per table


@dataclass(frozen=True)
class MemoryWeights:
    """Item weights for memory: a rank holds ``MEMORY_UNITS``, and an item of ``b`` bytes
    weighs ``b * MEMORY_UNITS // C`` (``C`` the largest rank's capacity in that tier), or
    ``MEMORY_UNITS // 2 + 1`` if that is more and the item takes over half of ``C``.

    Every set of items that fits a rank weighs at most ``MEMORY_UNITS``, so every plan stays
    inside the relaxation: rounded-down shares add up to at most the whole, and beside an
    item over half, the others share less than half (at most ``MEMORY_UNITS // 2 - 1``
    units). And two items over half never share a rank in the relaxation, as in a plan."""

    hbm: int
    ddr: int

    @classmethod
    def of(cls, problem: Problem) -> MemoryWeights:
        return cls(int(problem.hbm_cap.max(initial=0)), int(problem.ddr_cap.max(initial=0)))

    @staticmethod
    def weight(size: int, capacity: int) -> int:
        if capacity <= 0:
            return 0
        weight = size * MEMORY_UNITS // capacity
        return max(weight, MEMORY_UNITS // 2 + 1) if 2 * size > capacity else weight


def item_of(costs: OptionCosts, shard: int, scale: float, memory: MemoryWeights) -> Item:
    """The kind of item one shard of an option is."""
    return (
        perf_units(costs.min_cost[shard], scale),
        memory.weight(int(costs.hbm[shard]), memory.hbm),
        memory.weight(int(costs.ddr[shard]), memory.ddr),
    )


def relaxed_options(
    problem: Problem, groups: list[Group], upper: float, scale: float, memory: MemoryWeights
) -> list[RelaxedOption]:
    """Each group's options as the relaxation sees them; options with a shard over the upper
    bound cannot be in a plan at least as good, and are left out."""
    result = []
    for g, group in enumerate(groups):
        for o, option in enumerate(group.options):
            costs = problem.costs(option)
            if costs.largest_shard > upper:
                continue
            if option.placement is Placement.FIXED:
                result.append(RelaxedOption(g, o, perf_units(costs.smallest_shard, scale), 0, {}))
            elif option.sharding_type is ShardingType.TABLE_ROW_WISE:
                result.append(RelaxedOption(g, o, 0, perf_units(costs.smallest_shard, scale), {}))
            else:
                items: dict[Item, int] = {}
                for shard in range(costs.num_shards):
                    kind = item_of(costs, shard, scale, memory)
                    items[kind] = items.get(kind, 0) + 1
                result.append(RelaxedOption(g, o, 0, 0, items))
    return result


def perf_units(cost: float, scale: float) -> int:
    """Milliseconds in the relaxations' integer units, rounded down."""
    return math.floor(cost * scale)


def option_counts(
    model: cp_model.CpModel, groups: list[Group], options: list[RelaxedOption]
) -> tuple[dict[tuple[int, int], cp_model.IntVar], Expr]:
    """Per (group, option) the count of the group's tables taking it, all of them placed;
    and the load the options on every rank add to every rank."""
    tables: dict[tuple[int, int], cp_model.IntVar] = {}
    by_group: dict[int, list[RelaxedOption]] = {g: [] for g in range(len(groups))}
    for o in options:
        by_group[o.group].append(o)
    for g, group in enumerate(groups):
        mine = by_group[g]
        for o in mine:
            tables[g, o.option] = model.new_int_var(0, group.size, "")
        model.add(total(tables[g, o.option] for o in mine) == group.size)
    fixed = [o for o in options if o.every_rank]
    every_rank = cp_model.LinearExpr.weighted_sum(
        [tables[o.group, o.option] for o in fixed], [o.every_rank for o in fixed]
    )
    return tables, every_rank


def total(terms: Iterable[Expr]) -> Expr:
    """The sum of CP-SAT expressions, built in one step: Python's ``sum`` adds them one at
    a time, which takes quadratic time on thousands of terms (42 s for the option-mix
    relaxation of 2,692 tables of distinct shapes on 512 ranks)."""
    return cp_model.LinearExpr.sum(list(terms))


def relaxation_solver(budget: float, seed: int) -> cp_model.CpSolver:
    """One deterministic worker without presolve: on these small, dense models presolve
    (probing, clique merging) spent the whole budget, and a portfolio overshot its
    deterministic limit several times over (measured on the public workloads, see
    docs/solver.md)."""
    solver = single_worker_solver(budget, seed)
    solver.parameters.cp_model_presolve = False
    return solver
