"""The linear relaxation (GLOP): options chosen fractionally. A lower bound at full memory
(``lp_relaxation``), and, re-solved with less memory, the option mixes that guide the
constructed warm start (``prepare.py``, ``construct.py``).

Its rows: the average-work and largest-shard limits, the per-rank loads of options fixed
on every rank, and total and per-rank memory, so tables pushed by memory into slower
options raise the bound; and every other shard on top of what every rank carries at least.
The simple bounds are in ``simple.py``; the option-mix and packing relaxations, which see
whole options and whole shards, in ``option_mix.py`` and ``packing.py``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Self

import numpy as np
from ortools.linear_solver import pywraplp

from planner_service.costs.options import Placement, ShardEstimate
from planner_service.plan.types import BoundSource
from planner_service.solve.bounds.simple import LowerBound
from planner_service.solve.deadline import Deadline
from planner_service.solve.problem import Group, OptionCosts, Problem

LP_SAFETY = 1e-9  # relative slack for the LP's floating-point optimum
MEMORY_RESOLUTION = 2.0**-24  # the LP's memory coefficients, in units (see _MemoryScale)


# Per-rank rows are one per distinct rank (its capacity and its shares of the options fixed
# on every rank), each with a coefficient per such option. Row-wise tables of many shapes
# on thousands of ranks make nearly every rank distinct (3 million coefficients for 5,384
# tables on 1,024 ranks, most of the LP's build and solve time), so beyond this many
# coefficients only the heaviest ranks' rows are kept. Dropping rows only relaxes the LP:
# its optimum stays a lower bound.
MAX_RANK_ROW_COEFFICIENTS = 150_000
BUILD_CHECK_EVERY = 256  # groups added between looks at the deadline


class RelaxationInfeasible(Exception):
    """Not even fractional option choices fit the memory: no plan exists."""


@dataclass(frozen=True)
class Relaxation:
    """The LP's bound and its option mix: ``counts[g][o]`` tables of group ``g`` on option
    ``o`` (fractional), which ``quotas`` rounds into whole tables per option: the guides
    of the construction."""

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


class LinearRelaxation:
    """Options chosen fractionally (GLOP), built once and solvable at full memory (a bound)
    or with capacities shrunk (``solve(memory_fraction)``: no longer a bound, but an option
    mix that leaves room for packing whole shards into ranks). Its constraints:

    - the makespan covers the average work, each group's largest shard, and every rank's
      load from the options fixed on every rank;
    - memory fits in total and on every rank (options fixed on every rank);
    - every other shard sits on some rank on top of the *floor*, what every rank carries at
      least of the options fixed on every rank (each option's least per-rank share, summed:
      the least of a sum is at least the sum of the leasts); the floor plus the shard stays
      within the makespan and the largest rank's memory. A group's mix averages over its
      options, at most the worst option one of its tables really takes.

    Memory is counted in units of the tier's largest rank, so that memory and time
    coefficients are of similar size (bytes run to 1e11, milliseconds to 1e-3: a matter of
    conditioning; GLOP also converges in bytes on the public workloads), or of twice what
    the tables could ever need there, when that is less (``_MemoryScale``). Ranks whose
    capacity and fixed shares are the same share one constraint."""

    def __init__(
        self, problem: Problem, groups: list[Group], deadline: Deadline | None = None
    ) -> None:
        self.deadline = deadline or Deadline.never()
        self.solver = solver = pywraplp.Solver.CreateSolver("GLOP")
        inf = solver.infinity()
        self.makespan = makespan = solver.NumVar(0.0, inf, "T")
        scales = [
            _MemoryScale.of(capacity, groups, problem, tier)
            for capacity, tier in ((problem.hbm_cap, "hbm_total"), (problem.ddr_cap, "ddr_total"))
        ]
        capacities = [scale.capacities for scale in scales]
        largest_rank = [float(c.max(initial=0.0)) for c in capacities]  # 1, or 0 without the tier
        fixed = [
            (g, o, problem.costs(option))
            for g, group in enumerate(groups)
            for o, option in enumerate(group.options)
            if option.placement is Placement.FIXED
        ]
        # Per rank, the shares of the fixed options: perf, then each memory tier in units.
        fixed_costs = [c for _, _, c in fixed]
        hbm_scale, ddr_scale = scales
        shares = [
            _fixed_perf(fixed_costs, problem),
            _per_rank(fixed_costs, problem, lambda e: hbm_scale.down_one(e.storage.hbm_bytes)),
            _per_rank(fixed_costs, problem, lambda e: ddr_scale.down_one(e.storage.ddr_bytes)),
        ]
        # Every row bounded by memory, with its bound at full memory (``solve`` scales them).
        self.capacity_rows: list[tuple[pywraplp.Constraint, float]] = []
        # Per-rank rows (perf, HBM, DDR): (constraint, that rank's shares of the fixed options).
        rows: list[list[tuple[pywraplp.Constraint, np.ndarray]]] = [[], [], []]
        most_rows = max(1, MAX_RANK_ROW_COEFFICIENTS // max(1, 3 * len(fixed)))  # 3 tiers
        first = _distinct_rows(shares[0])
        for r in _heaviest(first, shares[0], most_rows):
            row = solver.Constraint(-inf, 0.0)
            row.SetCoefficient(makespan, -1.0)
            rows[0].append((row, shares[0][r]))
        for tier in (0, 1):
            first = _distinct_rows(shares[tier + 1], capacities[tier])
            # The fullest ranks: the most of the fixed options in units of their capacity.
            fullness = shares[tier + 1] / np.maximum(capacities[tier], 1e-300)[:, None]
            for r in _heaviest(first, fullness, most_rows):
                row = solver.Constraint(-inf, capacities[tier][r])
                self.capacity_rows.append((row, capacities[tier][r]))
                rows[tier + 1].append((row, shares[tier + 1][r]))
        work = solver.Constraint(-inf, 0.0)
        work.SetCoefficient(makespan, -float(problem.world_size))
        totals = [solver.Constraint(-inf, float(c.sum())) for c in capacities]
        self.capacity_rows += [(row, row.ub()) for row in totals]
        floors = [solver.NumVar(0.0, inf, f"F{i}") for i in range(3)]
        floor_rows = [solver.Constraint(0.0, 0.0) for _ in floors]
        for floor, definition in zip(floors, floor_rows, strict=True):
            definition.SetCoefficient(floor, 1.0)
        fixed_index = {(g, o): i for i, (g, o, _) in enumerate(fixed)}
        least_shares = [tier_shares.min(axis=0, initial=math.inf) for tier_shares in shares]
        self.variables: list[list[pywraplp.Variable]] = []
        for g, group in enumerate(groups):
            if g % BUILD_CHECK_EVERY == 0:
                self.deadline.check()  # OutOfTime: the solve goes on without the LP
            size = float(group.size)
            choose = solver.Constraint(size, size)
            largest = solver.Constraint(-inf, 0.0)
            largest.SetCoefficient(makespan, -size)
            stacked = solver.Constraint(-inf, 0.0)
            stacked.SetCoefficient(makespan, -size)
            stacked.SetCoefficient(floors[0], size)
            stacked_memory = []
            for tier in (0, 1):
                row = solver.Constraint(-inf, largest_rank[tier] * size)
                row.SetCoefficient(floors[tier + 1], size)
                stacked_memory.append(row)
                self.capacity_rows.append((row, largest_rank[tier] * size))
            self.variables.append([])
            for o, option in enumerate(group.options):
                costs = problem.costs(option)
                x = solver.NumVar(0.0, size, f"x{g}_{o}")
                self.variables[g].append(x)
                choose.SetCoefficient(x, 1.0)
                work.SetCoefficient(x, costs.work)
                largest.SetCoefficient(x, costs.largest_shard)
                largest_bytes = (costs.hbm_largest, costs.ddr_largest)
                for total, tier_bytes, scale in zip(
                    totals, (costs.hbm_total, costs.ddr_total), scales, strict=True
                ):
                    total.SetCoefficient(x, scale.down_one(tier_bytes))
                i = fixed_index.get((g, o))
                if i is not None:
                    for tier_rows in rows:
                        for row, share in tier_rows:
                            row.SetCoefficient(x, float(share[i]))
                    for definition, least in zip(floor_rows, least_shares, strict=True):
                        definition.SetCoefficient(x, -float(least[i]))
                else:
                    stacked.SetCoefficient(x, costs.largest_shard)
                    for row, bytes_, scale in zip(
                        stacked_memory, largest_bytes, scales, strict=True
                    ):
                        row.SetCoefficient(x, scale.down_one(bytes_))
        solver.Minimize(makespan)

    def solve(self, memory_fraction: float = 1.0) -> Relaxation | None:
        for row, capacity in self.capacity_rows:
            row.SetUb(capacity * memory_fraction)
        limit_s = self.deadline.cap_s(math.inf)
        if math.isfinite(limit_s):
            self.solver.SetTimeLimit(max(1, int(limit_s * 1000)))
        started = time.monotonic()
        status = self.solver.Solve()
        if math.isfinite(limit_s):
            self.deadline.note_stop(limit_s, time.monotonic() - started)
        if status == pywraplp.Solver.INFEASIBLE:
            raise RelaxationInfeasible
        if status != pywraplp.Solver.OPTIMAL:
            return None
        value = float(self.makespan.solution_value())
        counts = [[max(0.0, x.solution_value()) for x in row] for row in self.variables]
        bound = LowerBound(max(0.0, value * (1 - LP_SAFETY)), BoundSource.LP_RELAXATION)
        return Relaxation(bound, counts)


def _fixed_perf(fixed: list[OptionCosts], problem: Problem) -> np.ndarray:
    """Per rank (rows), each fixed option's (columns) cost there: its shard ``i`` on rank
    ``i``, at that rank's device class."""
    if len(problem.classes.specs) == 1:
        return _per_rank(fixed, problem, lambda e: e.perf[0].total)
    rows = [c.fixed_cost for c in fixed]
    return np.array(rows, dtype=float).reshape(len(fixed), problem.world_size).T


def _per_rank(
    fixed: list[OptionCosts], problem: Problem, per_shard: Callable[[ShardEstimate], float]
) -> np.ndarray:
    """Per rank (rows), ``per_shard`` of each fixed option's (columns) shard there, filled
    run by run: through the options' own per-shard arrays, 40,000 row-wise options on
    4,096 ranks held gigabytes beside this matrix (issue 37: 12.5 GiB at 10,000 x 4,096)."""
    matrix = np.empty((len(fixed), problem.world_size))
    for row, costs in zip(matrix, fixed, strict=True):
        start = 0
        for estimate, count in costs.option.runs:
            row[start : start + count] = per_shard(estimate)
            start += count
    return matrix.T


def _distinct_rows(matrix: np.ndarray, column: np.ndarray | None = None) -> np.ndarray:
    """The first row index of each distinct row of ``matrix`` (with ``column`` beside it,
    when given), telling rows apart by two
    fingerprints (dot products with fixed pseudo-random weights: equal rows give equal
    fingerprints). Sorting thousands of rows of thousands of columns (``np.unique``) took
    seconds. Two different rows with the same fingerprints (in practice never) would share
    one row of the LP, which drops a constraint: the LP only gets looser, its optimum is
    still a lower bound."""
    weights = np.random.default_rng(0).random((matrix.shape[1], 2))
    fingerprints = matrix @ weights if matrix.shape[1] else np.zeros((len(matrix), 2))
    if column is not None:
        fingerprints = np.column_stack([fingerprints, column])
    first: dict[tuple[float, ...], int] = {}
    for r, fingerprint in enumerate(map(tuple, fingerprints.tolist())):
        first.setdefault(fingerprint, r)
    return np.array(sorted(first.values()), dtype=np.int64)


def _heaviest(ranks: np.ndarray, shares: np.ndarray, most: int) -> list[int]:
    """Of the distinct ``ranks``, at most ``most``: those whose shares sum highest (ties to
    the lower rank), in rank order."""
    chosen = sorted(int(r) for r in ranks)
    if len(chosen) <= most:
        return chosen
    weight = shares[chosen].sum(axis=1)
    order = sorted(range(len(chosen)), key=lambda i: (-weight[i], chosen[i]))
    return sorted(chosen[i] for i in order[:most])


@dataclass(frozen=True)
class _MemoryScale:
    """One memory tier in the LP's units: ``unit`` bytes, the smaller of the largest rank
    and twice the tier's *demand* (every table at its option with the most bytes there).

    Coefficients are rounded down to multiples of ``MEMORY_RESOLUTION`` units, which only
    loosens the memory rows: GLOP's presolve drops coefficients below about 1e-9 and once
    "proved" infeasible a table with 16 DDR bytes per shard (1.2e-10 of 128 GiB) and every
    table on ranks of 2**51 bytes. Capacities are capped at twice the demand, which no
    memory row's left side can reach (a rank's fixed shares, the totals and the floor plus
    a shard each add up to at most the demand), so the cap removes no solution, nor does
    it with capacities shrunk to half or more (``solve(memory_fraction)``)."""

    unit: float
    capacities: np.ndarray  # per rank, in units

    @classmethod
    def of(cls, capacity: np.ndarray, groups: list[Group], problem: Problem, tier: str) -> Self:
        demand = sum(
            group.size * max(getattr(problem.costs(o), tier) for o in group.options)
            for group in groups
        )
        ceiling = float(2 * demand)
        unit = min(float(capacity.max(initial=0)), ceiling) or 1.0
        return cls(unit, np.minimum(capacity.astype(float), ceiling) / unit)

    def down(self, num_bytes: np.ndarray | int) -> np.ndarray:
        """Bytes in units, rounded down to the resolution."""
        units = np.asarray(num_bytes, dtype=float) / self.unit
        return np.floor(units / MEMORY_RESOLUTION) * MEMORY_RESOLUTION

    def down_one(self, num_bytes: int) -> float:
        """``down`` of one number, without arrays (the same IEEE operations)."""
        return math.floor(float(num_bytes) / self.unit / MEMORY_RESOLUTION) * MEMORY_RESOLUTION
