"""The host-level bound: the packing relaxation (``packing.py``) on a few hosts, bounded by
branch and bound over each host's *level*, the load of the heaviest configuration one of
its ranks takes.

The packing relaxation's own LP lets a host's ranks take a fraction of a heavy
configuration and pay for it on average only, so on two and four hosts of Criteo its bound
stays 5-10% under an optimum that CP-SAT proves only after several deterministic seconds
of tree search. Once each host's level is known, the makespan must cover the every-rank
load, the host's table-row-wise load and that level, on every host: averages no longer
hide the heaviest rank. This module branches on ranges of levels, one per host, and
bounds each range by an LP (GLOP):

- per class and free option a fractional count of tables, the class's every-rank load
  above its chords, table-row-wise tables split fractionally among hosts, as in
  ``packing.py``;
- per host and configuration of load at most the range's top a fractional count of ranks,
  the host's ranks in all; the items the configurations take equal the items the option
  counts supply;
- the makespan at least the every-rank load plus the host's table-row-wise load plus the
  range's bottom, and at least their per-host average with the configurations' loads;
- some rank of the host takes a configuration of load at least the range's bottom (the
  level is the load of one it takes).

Every plan maps onto a solution of the packing relaxation with no larger makespan, which
gives each host a level; the LP of any range holding those levels admits that solution
with its makespan (fractional counts include integer ones). So each range's LP optimum is
a lower bound for the plans whose levels lie in it, and the least over the ranges still
open is a lower bound for the request, whenever the search stops. A range whose LP has no
solution holds no plan within the cap.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from ortools.linear_solver import pywraplp

from planner_service.plan.types import BoundSource
from planner_service.solve.bounds.lp import LP_SAFETY
from planner_service.solve.bounds.packing import (
    MAX_CONFIG_VARS,
    PER_HOST_MAX_HOSTS,
    PackingClass,
    configurations,
    packing_classes,
)
from planner_service.solve.bounds.relaxed import (
    MEMORY_UNITS,
    RESOLUTION,
    MemoryWeights,
    relaxed_options,
)
from planner_service.solve.bounds.simple import LowerBound
from planner_service.solve.deadline import Deadline
from planner_service.solve.problem import Group, Problem

MAX_NODES = 4_000  # ranges bounded before the search gives up (the bound so far stands)
# The most of what is left of the deadline it may take in wall time (it needs tenths of a
# second alone on the public workloads, several times that beside other work; CP-SAT
# gets the rest).
HOST_LEVELS_WALL_SHARE = 0.3

_Ranges = tuple[tuple[int, int], ...]  # per host: (lowest, highest) index into the levels


@dataclass(frozen=True, order=True)
class _Node:
    """A range of levels per host and its LP bound (in units)."""

    bound: float
    ranges: _Ranges


def host_level_bound(
    problem: Problem,
    groups: list[Group],
    upper: float,
    *,
    target: float = math.inf,
    deadline: Deadline | None = None,
) -> LowerBound | None:
    """The least LP bound over the ranges of host levels still open when the search ends:
    once every range is a single level per host, once the least bound reaches ``target``
    (in milliseconds), at ``MAX_NODES`` ranges, or at ``deadline``. ``upper`` is a plan's
    makespan: configurations are enumerated up to it, as in ``packing.py``. None when the
    request is not a few hosts of equal size or its configurations are too many."""
    deadline = deadline or Deadline.never()
    hosts, local = problem.num_hosts, problem.local_world_size
    if upper <= 0 or hosts * local != problem.world_size or hosts > PER_HOST_MAX_HOSTS:
        return None
    scale = RESOLUTION / upper
    memory = MemoryWeights.of(problem)
    classes = packing_classes(groups, relaxed_options(problem, groups, upper, scale, memory))
    kinds = sorted(
        {kind for c in classes for o in c.free for kind in o.items if kind[0] > 0}, reverse=True
    )
    supply = [
        sum(len(c.tables) * max(o.items.get(kind, 0) for o in c.free) for c in classes if c.free)
        for kind in kinds
    ]
    configs = configurations(kinds, supply, (RESOLUTION, MEMORY_UNITS, MEMORY_UNITS))
    if configs is None or len(configs) * hosts > MAX_CONFIG_VARS:
        return None
    lp = _LevelLp(classes, kinds, configs, hosts, local)
    least = _search(lp, target * scale, deadline)
    if least is None:
        return None
    value = min(least, RESOLUTION) / scale * (1 - LP_SAFETY)
    return LowerBound(value, BoundSource.PACKING) if value > 0 else None


def _search(lp: _LevelLp, target_units: float, deadline: Deadline) -> float | None:
    """Best-first branch and bound over the ranges; the least open bound (units), or
    ``RESOLUTION`` when no range admits a solution (no plan within the cap)."""
    top = len(lp.levels) - 1
    root = lp.bound(tuple((0, top) for _ in range(lp.hosts)))
    if root is None:
        return None
    heap = [_Node(root, tuple((0, top) for _ in range(lp.hosts)))]
    nodes = 1
    while heap:
        node = heap[0]
        if node.bound >= target_units or nodes >= MAX_NODES or deadline.expired():
            return node.bound
        heapq.heappop(heap)
        wide = max(range(lp.hosts), key=lambda h: node.ranges[h][1] - node.ranges[h][0])
        low, high = node.ranges[wide]
        if low == high:
            return node.bound  # every host at one level: the least open bound is exact
        middle = (low + high) // 2
        for part in ((low, middle), (middle + 1, high)):
            ranges = node.ranges[:wide] + (part,) + node.ranges[wide + 1 :]
            if not _ordered(ranges):
                continue
            nodes += 1
            bound = lp.bound(ranges)
            if bound is not None:
                heapq.heappush(heap, _Node(max(bound, node.bound), ranges))
    return float(RESOLUTION)


def _ordered(ranges: _Ranges) -> bool:
    """Whether some levels in ``ranges`` descend from host to host: hosts are
    interchangeable in the relaxation, so only plans with levels in that order are kept."""
    least = 0
    for low, high in reversed(ranges):  # the least descending levels, from the last host
        least = max(low, least)
        if least > high:
            return False
    return True


class _LevelLp:
    """The LP of a range of levels, built once; each range sets bounds and re-solves."""

    def __init__(
        self,
        classes: list[PackingClass],
        kinds: list[tuple[int, int, int]],
        configs: list[tuple[int, tuple[int, ...]]],
        hosts: int,
        local: int,
    ) -> None:
        self.hosts, self.local = hosts, local
        self.levels = sorted({load for load, _ in configs})
        self.solver = solver = pywraplp.Solver.CreateSolver("GLOP")
        inf = solver.infinity()
        self.makespan = solver.NumVar(0.0, inf, "T")
        every_rank = []
        supplied: dict[tuple[int, int, int], list[tuple[pywraplp.Variable, int]]] = {
            kind: [] for kind in kinds
        }
        host_sizes: dict[int, list[pywraplp.Variable]] = {}
        for c in classes:
            n = len(c.tables)
            counts = [solver.NumVar(0.0, n, "") for _ in c.free]
            chosen = solver.Constraint(0.0 if c.fixed_of else n, n)
            for x in counts:
                chosen.SetCoefficient(x, 1.0)
            for o, x in zip(c.free, counts, strict=True):
                if o.per_host_rank:
                    host_sizes.setdefault(o.per_host_rank, []).append(x)
                for kind, count in o.items.items():
                    if kind in supplied:
                        supplied[kind].append((x, count))
            if c.fixed_of:
                every_rank.append(self._class_every_rank(c, counts))
        # Per host: the rows "T - every rank - host load >= level" and the configurations.
        self.level_rows: list[pywraplp.Constraint] = []
        self.slots: list[list[tuple[int, pywraplp.Variable]]] = []
        # Per host: "some rank takes a configuration at least the range's bottom".
        self.at_level: list[pywraplp.Constraint] = []
        per_host_sizes: dict[int, list[pywraplp.Variable]] = {size: [] for size in host_sizes}
        placed: dict[tuple[int, int, int], list[tuple[pywraplp.Variable, int]]] = {
            kind: [] for kind in kinds
        }
        for _ in range(hosts):
            level = solver.Constraint(0.0, inf)
            average = solver.Constraint(0.0, inf)
            level.SetCoefficient(self.makespan, 1.0)
            average.SetCoefficient(self.makespan, float(local))
            for e in every_rank:
                level.SetCoefficient(e, -1.0)
                average.SetCoefficient(e, -float(local))
            for size in host_sizes:
                z = solver.NumVar(0.0, inf, "")
                per_host_sizes[size].append(z)
                level.SetCoefficient(z, -float(size))
                average.SetCoefficient(z, -float(size * local))
            ranks = solver.Constraint(local, local)
            slots = []
            for load, config in configs:
                y = solver.NumVar(0.0, local, "")
                ranks.SetCoefficient(y, 1.0)
                average.SetCoefficient(y, -float(load))
                slots.append((load, y))
                for kind, count in zip(kinds, config, strict=True):
                    if count:
                        placed[kind].append((y, count))
            self.level_rows.append(level)
            self.slots.append(slots)
            self.at_level.append(solver.Constraint(0.0, inf))
        for size, tables in host_sizes.items():
            row = solver.Constraint(0.0, 0.0)
            for x in tables:
                row.SetCoefficient(x, 1.0)
            for z in per_host_sizes[size]:
                row.SetCoefficient(z, -1.0)
        for kind in kinds:
            row = solver.Constraint(0.0, 0.0)
            for y, count in placed[kind]:
                row.SetCoefficient(y, float(count))
            for x, count in supplied[kind]:
                row.SetCoefficient(x, -float(count))
        solver.Minimize(self.makespan)

    def _class_every_rank(
        self, c: PackingClass, counts: list[pywraplp.Variable]
    ) -> pywraplp.Variable:
        """The class's least load on every rank: above each chord of ``packing.PackingClass``."""
        units = [entry[0] for entry in c.tables]
        left = float(sum(units))
        e = self.solver.NumVar(0.0, left, "")
        for j, u in enumerate(units):
            if u:  # e >= left - u * (chosen - j)
                row = self.solver.Constraint(left + u * j, self.solver.infinity())
                row.SetCoefficient(e, 1.0)
                for x in counts:
                    row.SetCoefficient(x, float(u))
            left -= u
        return e

    def bound(self, ranges: _Ranges) -> float | None:
        """The LP optimum with every host's level within its range (units), or None when
        the range admits no solution."""
        rows = zip(ranges, self.level_rows, self.slots, self.at_level, strict=True)
        for (low, high), row, slots, at_level in rows:
            row.SetLb(float(self.levels[low]))
            at_level.SetLb(1.0 if low > 0 else 0.0)
            for load, y in slots:
                y.SetUb(0.0 if load > self.levels[high] else float(self.local))
                at_level.SetCoefficient(y, 1.0 if load >= self.levels[low] else 0.0)
        status = self.solver.Solve()
        if status == pywraplp.Solver.INFEASIBLE:
            return None
        if status != pywraplp.Solver.OPTIMAL:
            return 0.0
        return float(self.makespan.solution_value())
