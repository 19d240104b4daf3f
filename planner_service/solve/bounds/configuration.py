"""The configuration LP: how whole shards fill ranks in time and memory at once. A lower
bound in milliseconds, for requests whose shards come in few sizes.

The LP relaxation (``lp.py``) pools memory: it lets one rank's free HBM hold another rank's
shards. When memory is tight that is where it goes wrong: a 49 GiB table on a 68 GiB rank
leaves 13 GiB, and the small tables that would bring that rank's time up to the mean take
2 GiB each, so the rank runs short of time while it is full (issue 37, 5,384 tables on
1,024 ranks: the LP proves 5,561 ms, this bound 5,850 ms). The packing relaxation
(``packing.py``) counts memory in sixteenths of a rank, too coarse to see this.

Here a *configuration* is a multiset of shards that one rank can hold within the makespan
``T`` and its HBM and DDR, exactly (to a rounding, below). For a fixed ``T`` the LP is

    minimise  sum_c x_c                       (ranks used, x_c of configuration c)
    such that sum_c a_ci x_c >= sum_go n_oi y_go   for every shard kind i
              sum_o y_go = |g|                     for every group g
              x, y >= 0

where ``a_ci`` counts kind ``i`` in configuration ``c``, ``y_go`` the tables of group ``g``
on option ``o``, and ``n_oi`` the shards of kind ``i`` the option has. Every plan with
makespan at most ``T`` is a solution with ``sum x <= world_size`` (each rank holds a
configuration), so when the LP needs more ranks than there are, no plan reaches ``T``.

Configurations are too many to write down; they are generated (column generation): the
LP's duals ``pi`` price a configuration at ``pi . a``, and CP-SAT finds the dearest one that
fits (a knapsack in time, HBM and DDR). The proof does not depend on convergence or on
floating point: for any ``pi >= 0``, ``sum_g |g| min_o pi . n_o / max_c pi . a_c`` is a
lower bound on the LP (Farley's bound; the dual solution ``pi`` scaled to feasibility),
and ``max_c`` comes from CP-SAT's proven upper bound on a knapsack whose sizes are rounded
down and prices rounded up. ``T`` is proven out of reach when that exceeds the ranks.

What is relaxed, so that every plan stays a solution:

- each shard costs what it costs on its cheapest device class, and every rank has the
  largest rank's HBM and DDR;
- shard times and bytes are rounded down to a geometric grid (``ROUNDING``), so that tables
  of nearly equal shapes share kinds;
- pins, colocate and separate groups, and where table-row-wise and column-wise shards may
  go are dropped: every shard is an item any rank may hold;
- tables whose every option is on every rank (row-wise giants) set a *floor*: each rank
  holds at least each such option's smallest shard time and bytes. Their option choices
  are enumerated (``MAX_FLOORS``) and the bound holds for the least of them; the other
  tables' options on every rank are items like any other (one per rank, relaxed to
  anywhere);
- calibrated fixed costs per sharding type are left out (they only add load).

The makespan is searched upwards from the best bound known: each ``T`` proven out of reach
raises the bound; the first ``T`` not proven ends the search (``configuration_bound``).
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from ortools.linear_solver import pywraplp
from ortools.sat.python import cp_model

from planner_service.costs.options import Placement, ShardingOption
from planner_service.plan.types import BoundSource
from planner_service.solve.bounds.simple import LowerBound
from planner_service.solve.cpsat_runner import single_worker_solver, solve_within
from planner_service.solve.deadline import Deadline
from planner_service.solve.problem import Choice, Group, Problem

ROUNDING = 0.002  # shard times and bytes rounded down to powers of 1.002
MAX_KINDS = 256  # shard kinds after rounding; beyond this the bound is not built
MAX_FLOORS = 16  # option choices of the tables on every rank that are enumerated
MAX_ROUNDS = 150  # column-generation rounds per makespan tried
MAX_TOTAL_ROUNDS = 800  # and in all: the bound's deterministic budget
COLUMNS_PER_ROUND = 5  # configurations added per pricing (its last improving solutions)
TIME_UNITS_PER_MS = 1000  # shard times in integer microseconds (rounded down)
BYTES_PER_UNIT = 1024  # and bytes in KiB
PRICE_SCALE = 1e7  # dual prices in the knapsack's integers (rounded up)
# CP-SAT's deterministic budget per pricing (most take milliseconds); cut short, its proven
# bound still counts.
PRICING_BUDGET_S = 0.05
# When CP-SAT's pricing stops short and found nothing dearer than one rank, SCIP prices
# again (``_Pricing.solve_exactly``) within this many nodes, and this wall time at most.
SCIP_NODES = 20_000
SCIP_WALL_S = 5.0
SCIP_SAFETY = 1e-5
# The makespans tried: the best bound raised by FINE_STEP at a time, FINE_STEPS times (on
# memory-tight requests at scale the bound ends a few percent up; each step that the
# last one's columns prove costs a round or two), then by half as much again each time,
# until one is not proven out of reach; then by bisection until within PRECISION.
FINE_STEP = 0.005
FINE_STEPS = 16
PRECISION = 0.005
MOST_RAISED = 100.0  # times the best bound, where the steps end
SAFETY = 1e-6  # Farley's bound must exceed the ranks by this fraction to count
TIGHT_SHARE = 0.8  # see memory_tight


@dataclass(frozen=True)
class Floor:
    """What every rank holds at least: time (ms), HBM and DDR bytes."""

    time: float
    hbm: int
    ddr: int


@dataclass(frozen=True)
class Instance:
    """A request as the configuration LP sees it: shard kinds (rounded down), groups of
    tables with the kinds each option has, and the floors of the options on every rank."""

    times: np.ndarray  # per kind, in TIME_UNITS_PER_MS (integers: the pricing is exact)
    hbm: np.ndarray  # per kind, in BYTES_PER_UNIT
    ddr: np.ndarray
    groups: list[tuple[int, list[dict[int, int]]]]  # (tables, kinds per option)
    floors: list[Floor]
    world_size: int
    hbm_cap: int
    ddr_cap: int
    run_kinds: dict[int, list[int | None]]  # id of an option -> the kind of each of its runs

    def columns_of(self, problem: Problem, choices: list[Choice]) -> list[dict[int, int]]:
        """What each rank of a plan holds beyond the floor, as configurations (distinct):
        where column generation starts, each one kept where it fits."""
        held: list[Counter[int]] = [Counter() for _ in range(problem.world_size)]
        for entry, choice in zip(problem.tables, choices, strict=True):
            option = entry.options[choice.option]
            of_runs = self.run_kinds.get(id(option))
            if of_runs is None:  # an option of the floor
                continue
            ranks = iter(choice.ranks)
            for kind, (_, count) in zip(of_runs, option.runs, strict=True):
                for rank in itertools.islice(ranks, count):
                    if kind is not None:
                        held[rank][kind] += 1
        distinct = {tuple(sorted(counter.items())) for counter in held if counter}
        return [dict(column) for column in sorted(distinct)]

    @property
    def demand(self) -> np.ndarray:
        """The most shards of each kind the tables could need, over every option choice."""
        most = np.zeros(len(self.times), dtype=np.int64)
        for size, options in self.groups:
            for kind in {k for option in options for k in option}:
                most[kind] += size * max(option.get(kind, 0) for option in options)
        return most


def _down(value: float) -> float:
    """``value`` rounded down to a power of ``1 + ROUNDING`` (0 stays 0)."""
    if value <= 0:
        return 0.0
    step = math.log1p(ROUNDING)
    return min(value, math.exp(math.floor(math.log(value) / step) * step))


def instance_of(problem: Problem, groups: list[Group]) -> Instance | None:
    """The relaxed instance, or None when it has more than ``MAX_KINDS`` shard kinds."""
    kinds: dict[tuple[float, float, float], int] = {}
    run_kinds: dict[int, list[int | None]] = {}
    merged: Counter[tuple[tuple[tuple[int, int], ...], ...]] = Counter()
    forced: list[list[Floor]] = []
    for group in groups:
        costs = [problem.costs(option) for option in group.options]
        if all(option.placement is Placement.FIXED for option in group.options):
            floors = [
                _floor_of(option, c.smallest_shard)
                for option, c in zip(group.options, costs, strict=True)
            ]
            forced.extend([floors] * group.size)
            continue
        options = []
        for option in group.options:
            counts: Counter[int] = Counter()
            of_runs = run_kinds.setdefault(id(option), [])
            for estimate, count in option.runs:
                kind = (
                    _down(min(p.total for p in estimate.perf)),
                    _down(estimate.storage.hbm_bytes),
                    _down(estimate.storage.ddr_bytes),
                )
                if kind == (0.0, 0.0, 0.0):
                    of_runs.append(None)
                    continue
                index = kinds.setdefault(kind, len(kinds))
                of_runs.append(index)
                counts[index] += count
                if len(kinds) > MAX_KINDS:
                    return None
            options.append(tuple(sorted(counts.items())))
        merged[tuple(sorted(set(options)))] += group.size
    order = sorted(kinds, key=kinds.__getitem__)
    return Instance(
        times=np.array([math.floor(k[0] * TIME_UNITS_PER_MS) for k in order], dtype=np.int64),
        hbm=np.array([math.floor(k[1] / BYTES_PER_UNIT) for k in order], dtype=np.int64),
        ddr=np.array([math.floor(k[2] / BYTES_PER_UNIT) for k in order], dtype=np.int64),
        groups=[(size, [dict(o) for o in options]) for options, size in merged.items()],
        floors=_floors(forced),
        world_size=problem.world_size,
        hbm_cap=int(problem.hbm_cap.max(initial=0)),
        ddr_cap=int(problem.ddr_cap.max(initial=0)),
        run_kinds=run_kinds,
    )


def _floor_of(option: ShardingOption, smallest_shard: float) -> Floor:
    """The least an option on every rank puts on each rank."""
    shards = [estimate.storage for estimate, count in option.runs if count]
    return Floor(smallest_shard, min(s.hbm_bytes for s in shards), min(s.ddr_bytes for s in shards))


def _floors(forced: list[list[Floor]]) -> list[Floor]:
    """Every choice of options of the tables on every rank, each a floor; one floor of the
    least of each quantity when the choices are more than ``MAX_FLOORS``."""
    if not forced:
        return [Floor(0.0, 0, 0)]
    if math.prod(len(options) for options in forced) > MAX_FLOORS:
        return [
            Floor(
                sum(min(f.time for f in options) for options in forced),
                sum(min(f.hbm for f in options) for options in forced),
                sum(min(f.ddr for f in options) for options in forced),
            )
        ]
    choices = {
        Floor(sum(f.time for f in combo), sum(f.hbm for f in combo), sum(f.ddr for f in combo))
        for combo in itertools.product(*forced)
    }
    return sorted(choices, key=lambda f: (f.time, f.hbm, f.ddr))


class Progress:
    """What the probes of one bound share: the rounds left (``MAX_TOTAL_ROUNDS``), and the
    solver running now, so that another thread can cancel the bound at once: a solve left
    running in a thread when the interpreter exits aborts the process."""

    def __init__(self) -> None:
        self.rounds = MAX_TOTAL_ROUNDS
        self.cancelled = False
        self._solver: cp_model.CpSolver | pywraplp.Solver | None = None
        self._lock = threading.Lock()

    def running(self, solver: cp_model.CpSolver | pywraplp.Solver) -> bool:
        """Note the solver about to run; False once cancelled (then it must not run)."""
        with self._lock:
            self._solver = solver
            return not self.cancelled

    def cancel(self) -> None:
        """Stop the bound: the solver running now, and every round after it."""
        with self._lock:
            self.cancelled = True
            solver = self._solver
        if isinstance(solver, cp_model.CpSolver):
            solver.stop_search()
        elif solver is not None:
            solver.InterruptSolve()


@dataclass
class _Probe:
    """The column generation of one floor, across the makespans tried: its configurations
    (kind -> count) carry over to larger makespans, where they still fit."""

    instance: Instance
    floor: Floor
    progress: Progress  # shared by every probe of the bound
    columns: list[dict[int, int]] = field(default_factory=list)

    def room(self, makespan: float) -> tuple[int, int, int] | None:
        """What one rank holds beyond the floor, in the instance's units (rounded down: a
        configuration's rounded-down sizes add up to at most the room, rounded down)."""
        f, inst = self.floor, self.instance
        room = (
            math.floor((makespan - f.time) * TIME_UNITS_PER_MS),
            (inst.hbm_cap - f.hbm) // BYTES_PER_UNIT,
            (inst.ddr_cap - f.ddr) // BYTES_PER_UNIT,
        )
        return room if min(room) >= 0 else None

    def out_of_reach(self, makespan: float, deadline: Deadline) -> bool:
        """Whether ``makespan`` is proven out of reach on this floor."""
        room = self.room(makespan)
        if room is None:
            return True
        inst = self.instance
        most = _most_per_rank(inst, room)
        groups = []
        for size, options in inst.groups:
            possible = [o for o in options if all(most[i] > 0 for i in o)]
            if not possible:
                return True  # a group none of whose options fits a rank
            groups.append((size, possible))
        self.columns = [c for c in self.columns if _fits(inst, c, room)]
        singles = [{int(i): int(most[i])} for i in np.flatnonzero(most > 0)]
        master = _Master(len(inst.times), groups, singles + self.columns)
        pricing = _Pricing(inst, room, most, self.progress)
        for _ in range(MAX_ROUNDS):
            if deadline.expired() or self.progress.rounds <= 0 or self.progress.cancelled:
                return False
            self.progress.rounds -= 1
            prices = master.prices()
            if prices is None:  # GLOP failed twice, warm and afresh
                return False
            if master.ranks() <= inst.world_size:
                return False  # configurations found so far fit the ranks: nothing to prove
            dearest, found, exact = pricing.solve(prices, deadline, PRICING_BUDGET_S)
            if not exact and not _improving(found, prices, inst, room):
                # Cut short before it found a dearer configuration: not converged yet.
                dearest, found, exact = pricing.solve_exactly(prices, deadline)
            if dearest <= 0:
                return False
            demand = sum(
                size * min(sum(prices[k] * n for k, n in o.items()) for o in options)
                for size, options in groups
            )
            if demand / dearest > inst.world_size * (1 + SAFETY):
                return True
            improving = _improving(found, prices, inst, room)
            if not improving:
                return False  # the LP fits the ranks (or the pricing found nothing better)
            for column in improving:
                master.add(column)
                self.columns.append(column)
        return False


class _Master:
    """The LP over the configurations generated so far (GLOP), for its duals."""

    def __init__(
        self, num_kinds: int, groups: list[tuple[int, list[dict[int, int]]]], columns: list
    ) -> None:
        self.num_kinds, self.groups = num_kinds, groups
        self.columns: list[dict[int, int]] = []
        self._build()
        for column in columns:
            self.add(column)

    def _build(self) -> None:
        self.solver = solver = pywraplp.Solver.CreateSolver("GLOP")
        inf = solver.infinity()
        self.cover = [solver.Constraint(0.0, inf) for _ in range(self.num_kinds)]
        for size, options in self.groups:
            row = solver.Constraint(size, size)
            for option in options:
                y = solver.NumVar(0.0, inf, "")
                row.SetCoefficient(y, 1.0)
                for kind, count in option.items():
                    self.cover[kind].SetCoefficient(y, -float(count))
        self.objective = solver.Objective()
        self.objective.SetMinimization()

    def add(self, column: dict[int, int]) -> None:
        self.columns.append(column)
        x = self.solver.NumVar(0.0, self.solver.infinity(), "")
        self.objective.SetCoefficient(x, 1.0)
        for kind, count in column.items():
            self.cover[kind].SetCoefficient(x, float(count))

    def prices(self) -> np.ndarray | None:
        """The covering rows' duals (clipped at 0: Farley's bound takes any ``pi >= 0``);
        None when GLOP fails, warm-started and then on the LP built afresh (it does, now
        and then, on a master grown by hundreds of columns)."""
        if self.solver.Solve() != pywraplp.Solver.OPTIMAL:
            columns, self.columns = self.columns, []
            self._build()
            for column in columns:
                self.add(column)
            if self.solver.Solve() != pywraplp.Solver.OPTIMAL:
                return None
        return np.array([max(0.0, row.dual_value()) for row in self.cover])

    def ranks(self) -> float:
        """The ranks the last solution uses: an upper bound on the LP's optimum."""
        return float(self.objective.Value())


def _improving(
    found: list[dict[int, int]], prices: np.ndarray, inst: Instance, room: tuple[int, int, int]
) -> list[dict[int, int]]:
    """The configurations priced above one rank (the LP's cost of a column): the ones
    that lower the LP's optimum."""
    return [
        c
        for c in found
        if sum(prices[k] * n for k, n in c.items()) > 1 + 1e-9 and _fits(inst, c, room)
    ]


def _most_per_rank(inst: Instance, room: tuple[int, int, int]) -> np.ndarray:
    """How many shards of each kind one rank can hold alone, and at most as many as the
    tables could ever need (tiny shards would otherwise give the LP coefficients of
    millions, which GLOP cannot solve reliably)."""
    most = inst.demand
    for sizes, free in zip((inst.times, inst.hbm, inst.ddr), room, strict=True):
        most = np.minimum(most, np.where(sizes > 0, free // np.maximum(sizes, 1), most))
    return most


def _fits(inst: Instance, column: dict[int, int], room: tuple[int, int, int]) -> bool:
    kinds = list(column)
    counts = np.array([column[k] for k in kinds], dtype=np.int64)
    return all(
        int(sizes[kinds] @ counts) <= free
        for sizes, free in zip((inst.times, inst.hbm, inst.ddr), room, strict=True)
    )


class _Pricing:
    """The dearest configuration at given prices: a knapsack in time, HBM and DDR over the
    instance's integer sizes, solved by CP-SAT with prices rounded up, so that its proven
    bound is at least the true dearest price and every configuration it finds fits."""

    def __init__(
        self, inst: Instance, room: tuple[int, int, int], most: np.ndarray, progress: Progress
    ):
        self.inst, self.room, self.most, self.progress = inst, room, most, progress

    def solve(
        self, prices: np.ndarray, deadline: Deadline, budget_s: float
    ) -> tuple[float, list[dict[int, int]], bool]:
        """An upper bound on the dearest configuration's price, the configurations found
        on the way, last (dearest) first, and whether the bound is the price of the first
        (the knapsack solved outright)."""
        kinds = [int(i) for i in np.flatnonzero((self.most > 0) & (prices > 0))]
        if not kinds:
            return 0.0, [], True
        inst = self.inst
        model = cp_model.CpModel()
        counts = [model.new_int_var(0, int(self.most[i]), "") for i in kinds]
        for sizes, free in zip((inst.times, inst.hbm, inst.ddr), self.room, strict=True):
            weights = [int(sizes[i]) for i in kinds]
            if any(weights):
                model.add(cp_model.LinearExpr.weighted_sum(counts, weights) <= free)
        weights = [math.ceil(prices[i] * PRICE_SCALE) for i in kinds]
        model.maximize(cp_model.LinearExpr.weighted_sum(counts, weights))
        solver = single_worker_solver(budget_s, seed=0)
        collected = _Collector(kinds, counts)
        if not self.progress.running(solver):
            return math.inf, [], False
        status = solve_within(solver, model, deadline, callback=collected)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return math.inf, [], False
        found = collected.found[::-1][:COLUMNS_PER_ROUND]
        return solver.best_objective_bound / PRICE_SCALE, found, status == cp_model.OPTIMAL

    def solve_exactly(
        self, prices: np.ndarray, deadline: Deadline
    ) -> tuple[float, list[dict[int, int]], bool]:
        """``solve`` by SCIP, whose cuts close the knapsack bounds that CP-SAT leaves open
        (measured: CP-SAT stopped at 1.06 after 0.5 s where SCIP proves 1.0). Its node
        limit keeps it deterministic; its bound is raised by ``SCIP_SAFETY`` for its
        floating-point tolerances."""
        kinds = [int(i) for i in np.flatnonzero((self.most > 0) & (prices > 0))]
        if not kinds:
            return 0.0, [], True
        inst = self.inst
        solver = pywraplp.Solver.CreateSolver("SCIP")
        solver.SetSolverSpecificParametersAsString(f"limits/nodes = {SCIP_NODES}\n")
        limit_s = deadline.cap_s(SCIP_WALL_S)
        solver.SetTimeLimit(max(1, int(limit_s * 1000)))
        counts = [solver.IntVar(0, int(self.most[i]), "") for i in kinds]
        for sizes, free in zip((inst.times, inst.hbm, inst.ddr), self.room, strict=True):
            weights = [int(sizes[i]) for i in kinds]
            if any(weights):
                row = solver.Constraint(-solver.infinity(), float(free))
                for count, weight in zip(counts, weights, strict=True):
                    row.SetCoefficient(count, float(weight))
        objective = solver.Objective()
        for count, kind in zip(counts, kinds, strict=True):
            objective.SetCoefficient(count, float(prices[kind]))
        objective.SetMaximization()
        if not self.progress.running(solver):
            return math.inf, [], False
        status = solver.Solve()
        deadline.note_stop(limit_s, solver.wall_time() / 1000)
        if status not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
            return math.inf, [], False
        values = [round(count.solution_value()) for count in counts]
        found = [{k: int(v) for k, v in zip(kinds, values, strict=True) if v}]
        bound = objective.BestBound() * (1 + SCIP_SAFETY)
        return bound, found, status == pywraplp.Solver.OPTIMAL


class _Collector(cp_model.CpSolverSolutionCallback):
    def __init__(self, kinds: list[int], counts: list[cp_model.IntVar]) -> None:
        super().__init__()
        self.kinds, self.counts = kinds, counts
        self.found: list[dict[int, int]] = []

    def on_solution_callback(self) -> None:
        values = [self.value(v) for v in self.counts]
        self.found.append({k: int(v) for k, v in zip(self.kinds, values, strict=True) if v})


def memory_tight(problem: Problem, groups: list[Group]) -> bool:
    """Whether every table on its least-work option would fill ``TIGHT_SHARE`` of the memory
    tables live in (all HBM, or all DDR where ranks have no HBM): where the pooled LP is
    weakest, and where this bound earns its time."""
    hbm = ddr = 0
    for group in groups:
        least = min((problem.costs(option) for option in group.options), key=lambda c: c.work)
        hbm += least.hbm_total * group.size
        ddr += least.ddr_total * group.size
    if problem.hbm_total > 0:
        return hbm >= TIGHT_SHARE * problem.hbm_total
    return problem.ddr_total > 0 and ddr >= TIGHT_SHARE * problem.ddr_total


def configuration_bound(
    problem: Problem,
    groups: list[Group],
    lower: float,
    upper: float,
    deadline: Deadline,
    instance: Instance | None = None,
    hint: list[Choice] | None = None,
    progress: Progress | None = None,
) -> LowerBound | None:
    """The largest makespan in ``[lower, upper)`` proven out of reach (from ``lower`` up
    by ``_steps``, then by bisection towards the first not proven), before ``deadline``
    and within ``MAX_TOTAL_ROUNDS``; None if none is, or the instance has too many shard
    kinds. ``hint``: a plan, whose ranks are the first configurations. ``progress``: to
    cancel it from another thread."""
    instance = instance or instance_of(problem, groups)
    if instance is None or lower <= 0 or upper <= lower:
        return None
    progress = progress or Progress()
    start = instance.columns_of(problem, hint) if hint is not None else []
    probes = [_Probe(instance, floor, progress, list(start)) for floor in instance.floors]
    proven, failed = lower, upper
    for makespan in _steps(lower, upper):
        if not _out_of_reach(probes, makespan, deadline):
            failed = makespan
            break
        proven = makespan
    while (
        failed - proven > PRECISION * proven
        and progress.rounds > 0
        and not progress.cancelled
        and not deadline.expired()
    ):
        middle = (proven + failed) / 2
        if _out_of_reach(probes, middle, deadline):
            proven = middle
        else:
            failed = middle
    return LowerBound(proven, BoundSource.CONFIGURATION) if proven > lower else None


def _steps(lower: float, upper: float) -> Iterator[float]:
    """The makespans tried in turn, below ``upper``: ``lower`` raised by ``FINE_STEP`` at a
    time up to ``FINE_STEPS`` of them, then by half as much again each time, up to
    ``MOST_RAISED`` times ``lower``."""
    step, count = FINE_STEP, 0
    while (makespan := lower * (1 + step)) < upper and makespan <= MOST_RAISED * lower:
        yield makespan
        count += 1
        step = step + FINE_STEP if count < FINE_STEPS else step * 1.5


def _out_of_reach(probes: list[_Probe], makespan: float, deadline: Deadline) -> bool:
    """Proven out of reach on every floor (a plan takes one of them)."""
    return all(probe.out_of_reach(makespan, deadline) for probe in probes)
