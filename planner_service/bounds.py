"""Lower bounds on the best achievable max-rank cost, each valid for the full problem.

- ``work``: total least work over world size (no rank can be below the average).
- ``largest_shard``: the table whose cheapest option still has the most expensive shard.
- ``lp``: a linear relaxation (GLOP) choosing options fractionally: the average-work and
  largest-shard limits, the per-rank loads of options fixed on every rank, and total and
  per-rank memory, so tables pushed by memory into slower options raise the bound.

The CP-SAT model adds its own proven bound when it solved the complete model.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.linear_solver import pywraplp

from planner_service.enumerator import Placement
from planner_service.problem import Group, Problem
from planner_service.types import gap

LP_SAFETY = 1e-9  # relative slack for the LP's floating-point optimum
OPTIMAL_GAP = 1e-4  # within the cost resolution of its proven bound: reported optimal


@dataclass(frozen=True, order=True)
class LowerBound:
    value: float
    source: str


def simple_bounds(problem: Problem) -> list[LowerBound]:
    least_work = [min(problem.costs(o).work for o in t.options) for t in problem.tables]
    largest = [min(problem.costs(o).largest_shard for o in t.options) for t in problem.tables]
    return [
        LowerBound(sum(least_work) / problem.world_size, "work/world_size"),
        LowerBound(max(largest, default=0.0), "largest_shard"),
    ]


def proven_within(objective: float, bound: float, gap_limit: float) -> bool:
    """Whether ``bound`` proves ``objective`` within the request's ``gap_limit``, or
    optimal (within the cost resolution) when the limit is tighter than that."""
    return gap(objective, bound) <= max(OPTIMAL_GAP, gap_limit)


class RelaxationInfeasible(Exception):
    """Not even fractional option choices fit the memory: no plan exists."""


@dataclass(frozen=True)
class Relaxation:
    """The LP's bound and its option mix: ``counts[g][o]`` tables of group ``g`` on option
    ``o`` (fractional), which the heuristic rounds into option quotas."""

    bound: LowerBound
    counts: list[list[float]]

    def quotas(self) -> list[list[int]]:
        """Counts rounded to whole tables per group (largest remainders first)."""
        return [_round_preserving_sum(row) for row in self.counts]


def _round_preserving_sum(values: list[float]) -> list[int]:
    floors = [int(v + 1e-9) for v in values]
    missing = round(sum(values)) - sum(floors)
    order = sorted(range(len(values)), key=lambda i: (-(values[i] - floors[i]), i))
    for i in order[: max(missing, 0)]:
        floors[i] += 1
    return floors


def lp_bound(
    problem: Problem, groups: list[Group], memory_fraction: float = 1.0
) -> Relaxation | None:
    """The relaxation's optimum, None if GLOP could not finish; raises RelaxationInfeasible
    when the relaxation has no solution (then neither has the problem). With
    ``memory_fraction`` < 1 the capacities shrink: no longer a bound, but an option mix
    that leaves room for packing whole shards into ranks."""
    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:  # pragma: no cover - GLOP ships with OR-Tools
        return None
    world = problem.world_size
    makespan = solver.NumVar(0.0, solver.infinity(), "T")
    work = solver.Constraint(-solver.infinity(), 0.0)
    work.SetCoefficient(makespan, -float(world))
    hbm_cap = problem.hbm_cap * memory_fraction
    ddr_cap = problem.ddr_cap * memory_fraction
    hbm_total = solver.Constraint(-solver.infinity(), float(hbm_cap.sum()))
    ddr_total = solver.Constraint(-solver.infinity(), float(ddr_cap.sum()))
    rank_perf = [solver.Constraint(-solver.infinity(), 0.0) for _ in range(world)]
    rank_hbm = [solver.Constraint(-solver.infinity(), float(c)) for c in hbm_cap]
    rank_ddr = [solver.Constraint(-solver.infinity(), float(c)) for c in ddr_cap]
    for constraint in rank_perf:
        constraint.SetCoefficient(makespan, -1.0)
    variables: list[list[pywraplp.Variable]] = []
    for g, group in enumerate(groups):
        variables.append([])
        choose = solver.Constraint(float(group.size), float(group.size))
        largest = solver.Constraint(-solver.infinity(), 0.0)
        largest.SetCoefficient(makespan, -float(group.size))
        for o, option in enumerate(group.options):
            costs = problem.costs(option)
            x = solver.NumVar(0.0, float(group.size), f"x{g}_{o}")
            variables[g].append(x)
            choose.SetCoefficient(x, 1.0)
            work.SetCoefficient(x, costs.work)
            largest.SetCoefficient(x, costs.largest_shard)
            hbm_total.SetCoefficient(x, float(costs.hbm.sum()))
            ddr_total.SetCoefficient(x, float(costs.ddr.sum()))
            if option.placement is Placement.FIXED and costs.fixed_cost is not None:
                for r in range(world):
                    rank_perf[r].SetCoefficient(x, float(costs.fixed_cost[r]))
                    rank_hbm[r].SetCoefficient(x, float(costs.hbm[r]))
                    rank_ddr[r].SetCoefficient(x, float(costs.ddr[r]))
    solver.Minimize(makespan)
    status = solver.Solve()
    if status == pywraplp.Solver.INFEASIBLE:
        raise RelaxationInfeasible
    if status != pywraplp.Solver.OPTIMAL:
        return None
    value = float(makespan.solution_value())
    counts = [[max(0.0, x.solution_value()) for x in row] for row in variables]
    return Relaxation(LowerBound(max(0.0, value * (1 - LP_SAFETY)), "lp_relaxation"), counts)


def best_bound(bounds: list[LowerBound]) -> LowerBound:
    return max(bounds, key=lambda bound: (bound.value, bound.source))
