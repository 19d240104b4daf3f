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
# The fixed options' per-rank shares are built whole up to this many entries (64 MB), and
# a block of options at a time beyond (``_RankShares``).
DENSE_SHARE_ENTRIES = 1 << 23
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
        self.solve_s = 0.0  # the last solve's wall time
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
            _RankShares(fixed_costs, problem, lambda e, c: e.perf[c].total, by_class=True),
            _RankShares(
                fixed_costs,
                problem,
                lambda e, _: hbm_scale.down_one(e.storage.hbm_bytes),
                capacity=capacities[0],
            ),
            _RankShares(
                fixed_costs,
                problem,
                lambda e, _: ddr_scale.down_one(e.storage.ddr_bytes),
                capacity=capacities[1],
            ),
        ]
        # Every row bounded by memory, with its bound at full memory (``solve`` scales them).
        self.capacity_rows: list[tuple[pywraplp.Constraint, float]] = []
        # Per-rank rows (perf, HBM, DDR): (constraint, that rank's shares of the fixed options).
        rows: list[list[tuple[pywraplp.Constraint, np.ndarray]]] = [[], [], []]
        most_rows = max(1, MAX_RANK_ROW_COEFFICIENTS // max(1, 3 * len(fixed)))  # 3 tiers
        for r in shares[0].heaviest(most_rows):
            row = solver.Constraint(-inf, 0.0)
            row.SetCoefficient(makespan, -1.0)
            rows[0].append((row, shares[0].row(r)))
        for tier in (0, 1):
            # The fullest ranks: the most of the fixed options in units of their capacity.
            for r in shares[tier + 1].heaviest(most_rows):
                row = solver.Constraint(-inf, capacities[tier][r])
                self.capacity_rows.append((row, capacities[tier][r]))
                rows[tier + 1].append((row, shares[tier + 1].row(r)))
        work = solver.Constraint(-inf, 0.0)
        work.SetCoefficient(makespan, -float(problem.world_size))
        totals = [solver.Constraint(-inf, float(c.sum())) for c in capacities]
        self.capacity_rows += [(row, row.ub()) for row in totals]
        floors = [solver.NumVar(0.0, inf, f"F{i}") for i in range(3)]
        floor_rows = [solver.Constraint(0.0, 0.0) for _ in floors]
        for floor, definition in zip(floors, floor_rows, strict=True):
            definition.SetCoefficient(floor, 1.0)
        fixed_index = {(g, o): i for i, (g, o, _) in enumerate(fixed)}
        least_shares = [tier_shares.least for tier_shares in shares]
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
        self.solve_s = time.monotonic() - started
        if math.isfinite(limit_s):
            self.deadline.note_stop(limit_s, self.solve_s)
        if status == pywraplp.Solver.INFEASIBLE:
            raise RelaxationInfeasible
        if status != pywraplp.Solver.OPTIMAL:
            return None
        value = float(self.makespan.solution_value())
        counts = [[max(0.0, x.solution_value()) for x in row] for row in self.variables]
        bound = LowerBound(max(0.0, value * (1 - LP_SAFETY)), BoundSource.LP_RELAXATION)
        return Relaxation(bound, counts)


class _RankShares:
    """The fixed options' shares on every rank (ranks x options) as the LP reads them: the
    distinct ranks (told apart by two fingerprints each), the heaviest of those, a chosen
    rank's row, and each option's least share. ``value(estimate, device_class)`` is one
    shard's share; ``capacity``, when given, is each rank's capacity in the same units: it
    tells ranks apart too, and "heaviest" is then the most in units of it.

    Up to ``DENSE_SHARE_ENTRIES`` entries the matrix is built whole and kept. Beyond, it is
    built a block of options at a time and only per-rank sums are kept; a chosen rank's
    row is then read off the options' runs. 37,000 row-wise options on 4,096 ranks made
    three matrices of 1.2 GB each (and as much again for the fullness), most of the
    plan's peak memory at 10,000 x 4,096, to keep one row of each (issue 37)."""

    def __init__(
        self,
        fixed: list[OptionCosts],
        problem: Problem,
        value: Callable[[ShardEstimate, int], float],
        *,
        by_class: bool = False,
        capacity: np.ndarray | None = None,
    ) -> None:
        self._fixed, self._value, self._capacity = fixed, value, capacity
        world_size = problem.world_size
        # One device class: every rank's shares are the class-0 values, as before classes.
        self._class_of_rank = problem.class_of_rank if by_class else None
        if by_class and len(problem.classes.specs) == 1:
            self._class_of_rank = None
        block = max(1, DENSE_SHARE_ENTRIES // max(1, world_size))
        weights = np.random.default_rng(0).random((len(fixed), 2))
        self.dense: np.ndarray | None = None
        if len(fixed) <= block:
            self.dense = self._block(fixed, world_size).T
            self._fingerprints = self.dense @ weights if fixed else np.zeros((world_size, 2))
            self.least = self.dense.min(axis=0, initial=math.inf)
            return
        self._fingerprints = np.zeros((world_size, 2))
        self._sums = np.zeros(world_size)
        self.least = np.empty(len(fixed))
        for start in range(0, len(fixed), block):
            part = fixed[start : start + block]
            matrix = self._block(part, world_size)
            self.least[start : start + len(part)] = matrix.min(axis=1)
            shares = matrix.T
            self._fingerprints += shares @ weights[start : start + len(part)]
            if capacity is not None:
                shares = shares / np.maximum(capacity, 1e-300)[:, None]
            self._sums += shares.sum(axis=1)

    def _block(self, fixed: list[OptionCosts], world_size: int) -> np.ndarray:
        """Options (rows) by ranks (columns), filled run by run: through the options' own
        per-shard arrays, 40,000 row-wise options on 4,096 ranks held gigabytes beside the
        matrix (issue 37: 12.5 GiB at 10,000 x 4,096)."""
        matrix = np.empty((len(fixed), world_size))
        classes = self._class_of_rank
        for row, costs in zip(matrix, fixed, strict=True):
            start = 0
            for estimate, count in costs.option.runs:
                if classes is None:
                    row[start : start + count] = self._value(estimate, 0)
                else:
                    per_class = [self._value(estimate, c) for c in range(len(estimate.perf))]
                    row[start : start + count] = np.array(per_class)[classes[start : start + count]]
                start += count
        return matrix

    def heaviest(self, most: int) -> list[int]:
        """Of the distinct ranks, at most ``most``: those whose shares (in units of their
        capacity, when given) sum highest, ties to the lower rank; in rank order."""
        fingerprints = self._fingerprints
        if self._capacity is not None:
            fingerprints = np.column_stack([fingerprints, self._capacity])
        chosen = _first_of_each(fingerprints)
        if len(chosen) <= most:
            return chosen
        if self.dense is None:
            weight = self._sums[chosen]
        else:
            shares = self.dense
            if self._capacity is not None:
                shares = shares / np.maximum(self._capacity, 1e-300)[:, None]
            weight = shares[chosen].sum(axis=1)
        order = sorted(range(len(chosen)), key=lambda i: (-weight[i], chosen[i]))
        return sorted(chosen[i] for i in order[:most])

    def row(self, rank: int) -> np.ndarray:
        """Rank ``rank``'s share of each option."""
        if self.dense is not None:
            return self.dense[rank]
        device_class = 0 if self._class_of_rank is None else int(self._class_of_rank[rank])
        row = np.empty(len(self._fixed))
        for i, costs in enumerate(self._fixed):
            start = 0
            for estimate, count in costs.option.runs:
                if start <= rank < start + count:
                    row[i] = self._value(estimate, device_class)
                    break
                start += count
        return row


def _first_of_each(fingerprints: np.ndarray) -> list[int]:
    """The first row index of each distinct row of ``fingerprints`` (dot products of the
    rows of a matrix with fixed pseudo-random weights, and perhaps a column beside them:
    equal rows give equal fingerprints), in order. Sorting thousands of rows of thousands
    of columns (``np.unique``) took seconds. Two different rows with the same fingerprints
    (in practice never) would share one row of the LP, which drops a constraint: the LP
    only gets looser, its optimum is still a lower bound."""
    first: dict[tuple[float, ...], int] = {}
    for r, fingerprint in enumerate(map(tuple, fingerprints.tolist())):
        first.setdefault(fingerprint, r)
    return sorted(first.values())


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
