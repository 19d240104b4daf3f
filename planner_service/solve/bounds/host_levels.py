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

At one level per host the LP may still mix a table's options (on Criteo's 26 tables on
two hosts, half a table table-row-wise and half table-wise: 4.9% under the optimum), so
the search then branches on the variables that are whole numbers in every plan (a
host's table-row-wise tables, a class's tables on an option, a host's ranks on a
configuration): one half with the variable at most its LP value rounded down, the other
at least rounded up. Every plan's solution lies in one half, so the least open bound
stays a proof; a node whose bound reaches the cap's plan holds no cheaper plan and is
dropped.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

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

MAX_NODES = 4_000  # LPs solved before the search gives up (the bound so far stands)
# The most of what is left of the deadline it may take in wall time (it needs tenths of a
# second alone on the public workloads, several times that beside other work; CP-SAT
# gets the rest).
HOST_LEVELS_WALL_SHARE = 0.3

# The LPs solved once the least open node has had one level per host (where the search
# stopped before it branched on whole numbers), counted in variables (an LP's time grows
# with them: 1.3 ms for 182 variables, 50 ms for 11,495, measured): a deterministic
# budget, so that requests without a deadline do not branch for minutes. About 5,500 LPs
# on criteo-60 on four hosts (so MAX_NODES ends it first), 87 on medium (311 tables, 4 s)
# on two.
WHOLE_NUMBER_WORK = 1_000_000
# The least distance from an integer at which an LP value counts as fractional (GLOP's
# primal tolerance is 1e-7): a value closer than this is taken as the integer.
FRACTIONAL = 1e-6

_Ranges = tuple[tuple[int, int], ...]  # per host: (lowest, highest) index into the levels
_Fixes = tuple[tuple[int, float, float], ...]  # (integer variable, lowest, highest)
_Branch = tuple[int, float]  # an integer variable with a fractional value, and the value


@dataclass(frozen=True, order=True)
class _Node:
    """A range of levels per host, bounds on some integer variables of the relaxation, and
    the LP bound of both (in units); ``branch``: an integer variable the LP left
    fractional, and its value (None when none is)."""

    bound: float
    serial: int
    ranges: _Ranges = field(compare=False)
    fixes: _Fixes = field(compare=False, default=())
    branch: _Branch | None = field(compare=False, default=None)


def host_level_bound(
    problem: Problem,
    groups: list[Group],
    upper: float,
    *,
    target: float = math.inf,
    deadline: Deadline | None = None,
) -> LowerBound | None:
    """The least LP bound over the nodes still open when the search ends: at a node with
    one level per host and every whole-number variable whole, at a node with one level per
    host whose bound reaches ``target`` (in milliseconds: no branching on whole numbers
    past it), at ``MAX_NODES`` LPs, or at ``deadline``. ``upper`` is a plan's
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
    """Best-first branch and bound: on the ranges of host levels until each host has one,
    then on the integer variables the LP leaves fractional (the table-row-wise tables on a
    host, the tables of a class on an option, the ranks of a host on a configuration:
    whole numbers in every plan). The least open bound (units), or ``RESOLUTION`` when no
    node admits a solution below it (no plan within the cap, or none cheaper than the
    cap's plan)."""
    top = len(lp.levels) - 1
    whole = tuple((0, top) for _ in range(lp.hosts))
    serials = itertools.count()
    root = lp.bound(whole, ())
    if root is None:
        return None
    heap = [_Node(root[0], next(serials), whole, (), root[1])]
    nodes = whole_number_work = 0
    settled = False  # whether the least open node has had one level per host yet
    while heap:
        node = heap[0]
        if nodes >= MAX_NODES or deadline.expired():
            return node.bound
        if all(low == high for low, high in node.ranges):
            settled = True
            if node.bound >= target_units or whole_number_work >= WHOLE_NUMBER_WORK:
                return node.bound  # no branching on whole numbers past target or budget
        heapq.heappop(heap)
        children = _children(lp, node)
        if children is None:
            return node.bound  # one level per host and every integer whole: exact
        for ranges, fixes in children:
            nodes += 1
            if settled:
                whole_number_work += lp.solver.NumVariables()
            found = lp.bound(ranges, fixes)
            if found is not None and found[0] < RESOLUTION:
                bound = max(found[0], node.bound)
                heapq.heappush(heap, _Node(bound, next(serials), ranges, fixes, found[1]))
    return float(RESOLUTION)


def _children(lp: _LevelLp, node: _Node) -> list[tuple[_Ranges, _Fixes]] | None:
    """The node's two halves: of its widest range of levels, or, at one level per host,
    of its fractional variable's values; None when it has neither."""
    wide = max(range(lp.hosts), key=lambda h: node.ranges[h][1] - node.ranges[h][0])
    low, high = node.ranges[wide]
    if low < high:
        middle = (low + high) // 2
        halves = [
            node.ranges[:wide] + (part,) + node.ranges[wide + 1 :]
            for part in ((low, middle), (middle + 1, high))
        ]
        return [(ranges, node.fixes) for ranges in halves if _ordered(ranges)]
    if node.branch is None:
        return None
    index, value = node.branch
    lowest, highest = lp.limits(index, node.fixes)
    kept = tuple(fix for fix in node.fixes if fix[0] != index)
    return [
        (node.ranges, kept + ((index, lowest, float(math.floor(value))),)),
        (node.ranges, kept + ((index, float(math.ceil(value)), highest),)),
    ]


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
        chosen_counts: list[tuple[pywraplp.Variable, float, float]] = []
        splits: list[tuple[pywraplp.Variable, float, float]] = []
        ranks_on: list[tuple[pywraplp.Variable, float, float]] = []
        for c in classes:
            n = len(c.tables)
            counts = [solver.NumVar(0.0, n, "") for _ in c.free]
            chosen_counts.extend((x, 0.0, float(n)) for x in counts)
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
                splits.append((z, 0.0, inf))
                per_host_sizes[size].append(z)
                level.SetCoefficient(z, -float(size))
                average.SetCoefficient(z, -float(size * local))
            ranks = solver.Constraint(local, local)
            slots = []
            for load, config in configs:
                y = solver.NumVar(0.0, local, "")
                ranks_on.append((y, 0.0, float(local)))
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
        # Whole numbers in every plan, with their own bounds: what the search branches on,
        # in this order of kinds. Host splits first: they set each host's load (measured,
        # 4,000 LPs on criteo-60 on 4 hosts: 0.8% under the optimum, against 1.9% with the
        # option counts first and 2.2% with the most fractional of all).
        in_order = (splits, chosen_counts, ranks_on)
        self.integers = [variable for of_kind in in_order for variable in of_kind]
        self.kind_ends = list(itertools.accumulate(map(len, in_order)))

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

    def limits(self, index: int, fixes: _Fixes) -> tuple[float, float]:
        """Integer variable ``index``'s bounds under ``fixes``."""
        for fixed, lowest, highest in fixes:
            if fixed == index:
                return lowest, highest
        _, lowest, highest = self.integers[index]
        return lowest, highest

    def bound(self, ranges: _Ranges, fixes: _Fixes) -> tuple[float, _Branch | None] | None:
        """The LP optimum with every host's level within its range and the integer
        variables within ``fixes`` (units), and the variable to branch on next; None when
        they admit no solution."""
        for variable, lowest, highest in self.integers:
            variable.SetBounds(lowest, highest)
        rows = zip(ranges, self.level_rows, self.slots, self.at_level, strict=True)
        for (low, high), row, slots, at_level in rows:
            row.SetLb(float(self.levels[low]))
            at_level.SetLb(1.0 if low > 0 else 0.0)
            for load, y in slots:
                y.SetUb(0.0 if load > self.levels[high] else float(self.local))
                at_level.SetCoefficient(y, 1.0 if load >= self.levels[low] else 0.0)
        for index, lowest, highest in fixes:
            variable = self.integers[index][0]
            variable.SetBounds(max(lowest, variable.lb()), min(highest, variable.ub()))
            if variable.lb() > variable.ub():
                return None
        status = self.solver.Solve()
        if status == pywraplp.Solver.INFEASIBLE:
            return None
        if status != pywraplp.Solver.OPTIMAL:
            return 0.0, None
        return float(self.makespan.solution_value()), self._fractional()

    def _fractional(self) -> _Branch | None:
        """The most fractional integer variable in the LP's solution, of the first kind
        that has one (host splits, then option counts, then ranks on configurations)."""
        start = 0
        for end in self.kind_ends:
            best: tuple[float, int, float] | None = None
            for index in range(start, end):
                value = self.integers[index][0].solution_value()
                distance = abs(value - round(value))
                if distance > FRACTIONAL and (best is None or distance > best[0]):
                    best = (distance, index, value)
            if best is not None:
                return best[1], best[2]
            start = end
        return None
