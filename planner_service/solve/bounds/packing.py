"""The packing relaxation: how whole shards pack into ranks. A lower bound, and often a plan.

The LP relaxation and CP-SAT's own bound spread load fractionally, so on the public
workloads they stop short of optima set by the arithmetic of a few shard sizes (tiny on 8
ranks: every rank carries the same row-wise load plus four or five whole tables of two
sizes). This module solves, with CP-SAT, the relaxed view of ``relaxed.py`` (constraints
and pins dropped, coarse memory, shards at their cheapest class), small and symmetric
enough to solve outright within a short budget.

In the relaxation the ranks of a host are interchangeable, and so are hosts with the same
table-row-wise load, so it is written over *configurations* instead of ranks: a
configuration is how many items of each kind (cost and memory weight) one rank holds, and
the model counts how many ranks of each pool (a host, or all hosts of one table-row-wise
mix) take each configuration. Symmetric rank-indexed models are what CP-SAT proves bounds
on slowly; this one has no rank symmetry left.

The search starts from the warm start (mapped into configurations) and restarts from its
best solution a few times (``PACKING_RUNS``). That best solution maps back onto ranks
(``_RelaxedModel.decode``): when the request has no pins or link groups, and the items fit
each rank's real memory, it is a plan costing what the relaxation says, up to rounding. On
the public models with few shard shapes it is the optimum, proven by the same model; the
pipeline (``pipeline.py``) takes it as a candidate beside the warm start.

Only plans at least as good as the warm start matter, so configurations are enumerated up to
the warm start's makespan; the model is skipped when they would be too many (many distinct
shard sizes), and the other bounds stand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from planner_service.costs.options import Placement
from planner_service.plan.types import BoundSource, ShardingType
from planner_service.solve.bounds.relaxed import (
    MEMORY_UNITS,
    RESOLUTION,
    Expr,
    Item,
    MemoryWeights,
    RelaxedOption,
    item_of,
    relaxation_solver,
    relaxed_options,
    total,
)
from planner_service.solve.bounds.simple import LowerBound
from planner_service.solve.cpsat_runner import solve_within
from planner_service.solve.deadline import Deadline, OutOfTime
from planner_service.solve.problem import Choice, Group, Problem, loads_of

# Runs of the relaxation, each a share of the request's time limit in deterministic
# seconds, each from the best solution so far with the next seed: restarts find the
# relaxation's optimum more reliably than one long run (medium on 32 ranks, seeds 0-3: three
# runs found it every time, one run of the same total never; see docs/solver.md).
PACKING_RUNS = (0.1, 0.1, 0.1)
# The most of what is left of the deadline it may take in wall time: at least half is left
# to the CP-SAT search.
PACKING_WALL_SHARE = 0.5
DEADLINE_CHECK_EVERY = 256  # configurations added to the model between looks at the clock
MAX_CONFIG_VARS = 20_000  # pool x configuration counts; beyond this the bound is skipped
# Relaxing the options and classing them, before the model's size is known, per option of
# the groups: 0.29 s for 88,596 options (5,384 distinct memory-tight shapes on 1,024
# ranks), started with 0.09 s left of a 10 s limit, then found too large; the answer came
# 0.2 s late. Not started when the deadline cannot hold it.
PREPARE_S_PER_OPTION = 4e-6
PER_HOST_MAX_HOSTS = 4  # up to this many hosts, each host is its own pool

_Configuration = tuple[int, tuple[int, ...]]  # (load, count of each item kind)


@dataclass
class _Pool:
    """Ranks that share an extra load: ``size`` ranks, each with ``base`` on top (at least
    ``base_least``); ``base_work`` is that load summed over the pool's ranks."""

    size: Expr
    base: Expr
    base_least: int
    base_work: Expr
    counts: list[cp_model.IntVar] = field(default_factory=list)  # ranks per configuration


@dataclass(frozen=True)
class Packing:
    """What the relaxation gives: a lower bound for the request, and its best solution as a
    plan when that maps back onto ranks within every constraint (``plan`` is None when the
    request has pins, colocate or separate groups, or table-column-wise shards in the
    solution, which the relaxation does not model, or when the plan would overflow a rank's
    memory)."""

    bound: LowerBound | None
    plan: list[Choice] | None
    deterministic_time_s: float


def packing_bound(
    problem: Problem,
    groups: list[Group],
    upper: float,
    *,
    time_limit_s: float,
    seed: int,
    hint: list[Choice] | None = None,
    lower_bound: float = 0.0,
    gap_limit: float = 0.0,
    deadline: Deadline | None = None,
) -> Packing | None:
    """Solve the relaxation with ``upper`` as the makespan's cap (a plan's makespan: only
    plans at least as good matter); ``hint``, a plan within the cap, is where the search
    starts. The search stops once its best solution is proven within ``gap_limit`` by its
    own bound or by ``lower_bound`` (the best bound known before it), and at
    ``PACKING_WALL_SHARE`` of what is left of the deadline. None when the relaxation is too
    large to build, or there is no time left to solve it."""
    deadline = deadline or Deadline.never()
    if upper <= 0 or problem.num_hosts * problem.local_world_size != problem.world_size:
        return None
    if not deadline.allows(PREPARE_S_PER_OPTION * sum(len(g.options) for g in groups)):
        return Packing(None, None, 0.0)
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
    host_sizes = sorted({o.per_host_rank for c in classes for o in c.free if o.per_host_rank})
    host_sizes.reverse()
    per_host = bool(host_sizes) and problem.num_hosts <= PER_HOST_MAX_HOSTS
    host_mixes: list[_Configuration] = [(0, ())]
    if host_sizes and not per_host:
        host_supply = [
            sum(len(c.tables) for c in classes for o in c.free if o.per_host_rank == size)
            for size in host_sizes
        ]
        mixes = configurations([(size,) for size in host_sizes], host_supply, (RESOLUTION,))
        if mixes is None:
            return None
        host_mixes = mixes
    configs = configurations(kinds, supply, (RESOLUTION, MEMORY_UNITS, MEMORY_UNITS))
    if configs is None:
        return None
    num_pools = problem.num_hosts if per_host else len(host_mixes)
    pool_bases = [0] * num_pools if per_host else [load for load, _ in host_mixes]
    if sum(load + base <= RESOLUTION for base in pool_bases for load, _ in configs) > (
        MAX_CONFIG_VARS
    ):
        return None
    least = min(math.floor(lower_bound * scale), RESOLUTION)
    stage = Deadline(deadline.cap_s(math.inf, PACKING_WALL_SHARE))
    try:
        model = _RelaxedModel(problem, groups, classes, kinds, configs, scale, memory, least)
        if per_host:
            model.pools_per_host(host_sizes)
        else:
            model.pools_per_host_mix(host_sizes, host_mixes)
        model.finish(stage)
        if hint is not None:
            stage.check()
            model.add_hint(hint)
    except OutOfTime:
        deadline.reached = True
        return Packing(None, None, 0.0)
    best: cp_model.CpSolver | None = None  # the run with the best solution
    proven, spent = 0.0, 0.0
    for run, share in enumerate(PACKING_RUNS):
        if stage.expired():
            break
        solver = relaxation_solver(time_limit_s * share, seed + run)
        solver.parameters.relative_gap_limit = max(solver.parameters.relative_gap_limit, gap_limit)
        status = solve_within(solver, model.model, stage)
        spent += solver.deterministic_time
        if status in (cp_model.INFEASIBLE, cp_model.MODEL_INVALID):
            return None  # the warm start maps into the relaxation, so this cannot happen
        raised = min(solver.best_objective_bound, RESOLUTION) > max(proven, least)
        proven = max(proven, min(solver.best_objective_bound, RESOLUTION))
        found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
        start = best.objective_value if best is not None else model.hint_makespan
        improved = found and (start is None or solver.objective_value < start)
        better = found and (best is None or solver.objective_value < best.objective_value)
        if better:
            best = solver
        if status == cp_model.OPTIMAL or run == len(PACKING_RUNS) - 1:
            break
        if not improved and not raised:
            # Nothing below where it started and no higher bound: the next run would start
            # from the same place (medium on 2 hosts: three runs, none past the warm
            # start); CP-SAT's search gets the time instead.
            break
        if better:
            model.hint_solution(solver)  # where the next run starts
    deadline.reached |= stage.reached
    bound = LowerBound(proven / scale, BoundSource.PACKING) if proven > 0 else None
    return Packing(bound, model.decode(best) if best is not None else None, spent)


@dataclass
class PackingClass:
    """Groups the relaxation cannot tell apart but by what their options on every rank
    cost: the same options elsewhere (``free``: the table-row-wise option with the least
    per-rank load, and each distinct set of items once). A table of the class takes one of
    them or its cheapest option on every rank; of ``k`` tables not on every rank, the
    every-rank load is least when they are the ``k`` whose option there costs most, so the
    class adds at least that (a convex function of ``k``, exact at integers). Tables
    whose options differ only in their row counts (small tables: data-parallel costs grow
    with rows, table-wise ones do not) fall into one class, which takes their symmetry out
    of the model."""

    free: list[RelaxedOption]
    option_of: dict[int, list[int]]  # group -> its option for each of ``free``
    fixed_of: dict[int, int]  # group -> its cheapest option on every rank
    slot: dict[tuple[int, int], int]  # (group, option) -> index into ``free``, -1 every rank
    tables: list[tuple[int, int, int]]  # (every-rank units, group, table), costliest first
    counts: list[cp_model.IntVar] = field(default_factory=list)  # tables per free option
    every_rank: cp_model.IntVar | None = None  # its least load on every rank


def packing_classes(groups: list[Group], options: list[RelaxedOption]) -> list[PackingClass]:
    """The groups' options as the relaxation's classes: on every rank only the cheapest
    option counts, and of table-row-wise ones the one with the least per-rank load (they
    have no items: nothing else of them is modelled); groups with the same options left
    but for those on every rank share a class."""
    by_group: dict[int, list[RelaxedOption]] = {}
    for o in options:
        by_group.setdefault(o.group, []).append(o)
    found: dict[object, PackingClass] = {}
    for g, mine in by_group.items():
        fixed = [o for o in mine if not o.items and not o.per_host_rank]
        host = [o for o in mine if o.per_host_rank]
        cheapest = min(fixed, key=lambda o: (o.every_rank, o.option)) if fixed else None
        free = [min(host, key=lambda o: (o.per_host_rank, o.option))] if host else []
        by_items: dict[tuple[tuple[Item, int], ...], RelaxedOption] = {}
        for o in mine:
            if o.items:
                by_items.setdefault(tuple(sorted(o.items.items())), o)
        free += [by_items[key] for key in sorted(by_items)]
        signature = (
            tuple((o.per_host_rank, tuple(sorted(o.items.items()))) for o in free),
            cheapest is not None,
        )
        c = found.get(signature)
        if c is None:
            c = found[signature] = PackingClass(free, {}, {}, {}, [])
        c.option_of[g] = [o.option for o in free]
        index = {o.option: j for j, o in enumerate(free)}
        for o in mine:
            if o.items:
                c.slot[g, o.option] = index[by_items[tuple(sorted(o.items.items()))].option]
            elif o.per_host_rank:
                c.slot[g, o.option] = 0
            else:
                c.slot[g, o.option] = -1
        if cheapest is not None:
            c.fixed_of[g] = cheapest.option
        units = cheapest.every_rank if cheapest is not None else 0
        c.tables += [(units, g, t) for t in groups[g].members]
    for c in found.values():
        c.tables.sort(key=lambda entry: (-entry[0], entry[1], entry[2]))
    return list(found.values())


def configurations(
    kinds: Sequence[tuple[int, ...]], supply: list[int], limits: tuple[int, ...]
) -> list[_Configuration] | None:
    """Every (load, count of each kind) whose sums stay within ``limits`` coordinate by
    coordinate (the first is the load) and whose counts stay within the supply, or None once
    there would be more than ``MAX_CONFIG_VARS``."""
    found: list[_Configuration] = []
    counts = [0] * len(kinds)

    def extend(index: int, used: tuple[int, ...]) -> bool:
        if index == len(kinds):
            found.append((used[0], tuple(counts)))
            return len(found) <= MAX_CONFIG_VARS
        kind = kinds[index]
        room = [(cap - u) // k for cap, u, k in zip(limits, used, kind, strict=True) if k > 0]
        most = min([supply[index], *room])
        for count in range(most + 1):
            counts[index] = count
            if not extend(index + 1, tuple(u + count * k for u, k in zip(used, kind, strict=True))):
                return False
        counts[index] = 0
        return True

    return found if extend(0, (0,) * len(limits)) else None


class _RelaxedModel:
    """The relaxation over configurations: per group and option a count of tables, per pool
    and configuration a count of ranks; the makespan covers every configuration in use."""

    def __init__(
        self,
        problem: Problem,
        groups: list[Group],
        classes: list[PackingClass],
        kinds: list[Item],
        configs: list[_Configuration],
        scale: float,
        memory: MemoryWeights,
        least: int = 0,
    ) -> None:
        self.problem = problem
        self.groups = groups
        self.classes = classes
        self.kinds = kinds
        self.configs = configs
        self.scale = scale
        self.memory = memory
        self.model = cp_model.CpModel()
        self.every_rank = total(self._class_counts(c) for c in classes)
        self.makespan = self.model.new_int_var(least, RESOLUTION, "T")  # least: a known bound
        self.pools: list[_Pool] = []
        # Per host (pools_per_host): its table-row-wise tables of each size; per host mix
        # (pools_per_host_mix): the mix and how many hosts hold it.
        self.host_tables: list[dict[int, cp_model.IntVar]] = []
        self.host_mixes: list[tuple[_Configuration, cp_model.IntVar]] = []
        self.host_sizes: list[int] = []
        self.hint_makespan: int | None = None  # the hint's makespan, in units
        # Per pool, per configuration: (ranks taking it, whether any does).
        self.slots: list[dict[_Configuration, tuple[cp_model.IntVar, cp_model.IntVar]]] = []

    def _class_counts(self, c: PackingClass) -> Expr:
        """The class's tables per free option, all placed; its least every-rank load."""
        model, n = self.model, len(c.tables)
        c.counts = [model.new_int_var(0, n, "") for _ in c.free]
        chosen = sum(c.counts)
        if not c.fixed_of:
            model.add(chosen == n)
            return 0
        model.add(chosen <= n)
        units = [entry[0] for entry in c.tables]
        left = sum(units)
        c.every_rank = model.new_int_var(0, left, "")
        for j, u in enumerate(units):  # the chord between j and j + 1 tables off every rank
            if u:
                model.add(c.every_rank >= left - u * (chosen - j))
            left -= u
        return c.every_rank

    def _host_tables(self, size: int) -> Expr:
        return sum(
            count
            for c in self.classes
            for o, count in zip(c.free, c.counts, strict=True)
            if o.per_host_rank == size
        )

    def pools_per_host(self, host_sizes: list[int]) -> None:
        """Each host a pool whose base is its own table-row-wise load; hosts ordered by that
        load (they are interchangeable)."""
        self.host_sizes = host_sizes
        self.host_tables = [
            {size: self.model.new_int_var(0, RESOLUTION // size, "") for size in host_sizes}
            for _ in range(self.problem.num_hosts)
        ]
        for size in host_sizes:
            self.model.add(sum(host[size] for host in self.host_tables) == self._host_tables(size))
        bases = [sum(size * host[size] for size in host_sizes) for host in self.host_tables]
        local = self.problem.local_world_size
        for base in bases:
            self.model.add(base <= RESOLUTION)
            self.pools.append(_Pool(local, base, 0, local * base))
        for heavier, lighter in zip(bases, bases[1:], strict=False):
            self.model.add(heavier >= lighter)

    def pools_per_host_mix(self, host_sizes: list[int], mixes: list[_Configuration]) -> None:
        """One pool per mix of table-row-wise tables a host could hold, sized by how many
        hosts hold that mix."""
        self.host_sizes = host_sizes
        hosts = [self.model.new_int_var(0, self.problem.num_hosts, "") for _ in mixes]
        self.host_mixes = list(zip(mixes, hosts, strict=True))
        self.model.add(sum(hosts) == self.problem.num_hosts)
        for i, size in enumerate(host_sizes):
            self.model.add(
                sum(mix[i] * n for (_, mix), n in self.host_mixes if mix[i])
                == self._host_tables(size)
            )
        local = self.problem.local_world_size
        for (load, _), n in self.host_mixes:
            self.pools.append(_Pool(local * n, load, load, local * load * n))

    def finish(self, deadline: Deadline) -> None:
        """The configurations' slots in every pool, the supply rows and the objective;
        ``OutOfTime`` if the deadline passes while they are built."""
        model, configs = self.model, self.configs
        world = self.problem.world_size
        placed: list[list[tuple[cp_model.IntVar, int]]] = [[] for _ in self.kinds]
        work = []
        for pool in self.pools:
            slots = {}
            most = pool.size if isinstance(pool.size, int) else world  # ranks it may have
            for c, config in enumerate(configs):
                if c % DEADLINE_CHECK_EVERY == 0:
                    deadline.check()
                load, counts = config
                if pool.base_least + load > RESOLUTION:
                    continue
                ranks = model.new_int_var(0, most, "")
                pool.counts.append(ranks)
                used = model.new_bool_var("")
                slots[config] = (ranks, used)
                model.add(ranks == 0).only_enforce_if(~used)
                model.add(self.makespan >= self.every_rank + pool.base + load).only_enforce_if(used)
                work.append(load * ranks)
                for i, count in enumerate(counts):
                    if count:
                        placed[i].append((ranks, count))
            model.add(total(pool.counts) == pool.size)
            self.slots.append(slots)
        supplied: dict[Item, list[Expr]] = {kind: [] for kind in self.kinds}
        for cls in self.classes:
            for o, tables in zip(cls.free, cls.counts, strict=True):
                for item, count in o.items.items():
                    if item in supplied:
                        supplied[item].append(count * tables)
        for kind, terms in zip(self.kinds, placed, strict=True):
            model.add(total(count * ranks for ranks, count in terms) == total(supplied[kind]))
        # Redundant, but it hands the LP the average-load bound from the start.
        model.add(
            world * self.makespan
            >= world * self.every_rank + total(pool.base_work for pool in self.pools) + total(work)
        )
        model.minimize(self.makespan)

    # ---- a plan in, a plan out

    def hint_solution(self, solver: cp_model.CpSolver) -> None:
        """The next run starts from this run's solution."""
        model = self.model
        model.clear_hints()
        for index in range(len(model.proto.variables)):
            var = model.get_int_var_from_proto_index(index)
            model.add_hint(var, solver.value(var))

    def add_hint(self, choices: list[Choice]) -> None:
        """Where the search starts: the configurations ``choices`` put on each rank. Left out
        when the plan is not inside the cap (one of its options was dropped)."""
        problem, local = self.problem, self.problem.local_world_size
        host_load = [dict.fromkeys(self.host_sizes, 0) for _ in range(problem.num_hosts)]
        rank_kinds = [dict.fromkeys(self.kinds, 0) for _ in range(problem.world_size)]
        every_rank = 0
        for c in self.classes:
            per_option = [0] * len(c.free)
            class_every_rank = 0
            for units, g, t in c.tables:
                choice = choices[t]
                j = c.slot.get((g, choice.option))
                if j is None:
                    return
                if j < 0:
                    class_every_rank += units
                    continue
                per_option[j] += 1
                option = c.free[j]
                if option.per_host_rank:
                    host_load[choice.ranks[0] // local][option.per_host_rank] += 1
                    continue
                costs = self.problem.costs(self.groups[g].options[choice.option])
                for shard, rank in enumerate(choice.ranks):
                    kind = item_of(costs, shard, self.scale, self.memory)
                    if kind[0] > 0:
                        rank_kinds[rank][kind] += 1
            for var, count in zip(c.counts, per_option, strict=True):
                self.model.add_hint(var, count)
            if c.every_rank is not None:
                self.model.add_hint(c.every_rank, class_every_rank)
            every_rank += class_every_rank
        bases = [sum(size * n for size, n in load.items()) for load in host_load]
        if self.host_tables:  # pools are hosts, heaviest first
            hosts = sorted(range(problem.num_hosts), key=lambda h: (-bases[h], h))
            pool_of_host = {h: pool for pool, h in enumerate(hosts)}
            for pool, h in enumerate(hosts):
                for size, var in self.host_tables[pool].items():
                    self.model.add_hint(var, host_load[h][size])
        else:  # pools are host mixes
            mixes = [tuple(load[size] for size in self.host_sizes) for load in host_load]
            index = {mix: i for i, ((_, mix), _) in enumerate(self.host_mixes)}
            pool_of_host = {h: index[mix] for h, mix in enumerate(mixes)}
            for i, (_, var) in enumerate(self.host_mixes):
                self.model.add_hint(var, sum(pool == i for pool in pool_of_host.values()))
        in_use: list[dict[_Configuration, int]] = [{} for _ in self.slots]
        makespan = 0
        for rank in range(problem.world_size):
            counts = tuple(rank_kinds[rank][kind] for kind in self.kinds)
            config = (sum(n * kind[0] for n, kind in zip(counts, self.kinds, strict=True)), counts)
            pool = pool_of_host[rank // local]
            in_use[pool][config] = in_use[pool].get(config, 0) + 1
            makespan = max(makespan, every_rank + bases[rank // local] + config[0])
        for pool, slots in enumerate(self.slots):
            for config, (ranks, used) in slots.items():
                self.model.add_hint(ranks, in_use[pool].get(config, 0))
                self.model.add_hint(used, in_use[pool].get(config, 0) > 0)
        self.model.add_hint(self.makespan, makespan)
        self.hint_makespan = makespan

    def decode(self, solver: cp_model.CpSolver) -> list[Choice] | None:
        """The solution as a plan: options by the table counts, table-row-wise tables onto
        hosts, and every item onto a rank whose configuration asks for its kind (the
        heaviest in HBM first, each to such a rank with the most HBM left). None when the
        relaxation dropped something the request needs, or the plan overflows a rank."""
        problem = self.problem
        constraints = problem.request.constraints
        everywhere = tuple(range(problem.world_size))
        if constraints.colocate or constraints.separate:
            return None
        if any(group.allowed != everywhere for group in self.groups):
            return None
        choices: list[Choice | None] = [None] * len(problem.tables)
        by_host_size: dict[int, list[tuple[int, int]]] = {}  # per-rank units -> (table, option)
        # Free shards: (-HBM, -DDR, table, shard, option, kind index or -1 if too cheap to count)
        items: list[tuple[int, int, int, int, int, int]] = []
        kind_index = {kind: i for i, kind in enumerate(self.kinds)}
        for c in self.classes:
            order = iter(c.tables)  # costliest on every rank first: those leave it
            taken = [
                (j, entry)
                for j, var in enumerate(c.counts)
                for entry in (next(order) for _ in range(int(solver.value(var))))
            ]
            taken += [(-1, entry) for entry in order]
            for j, (_, g, t) in taken:
                o = c.option_of[g][j] if j >= 0 else c.fixed_of[g]
                option = self.groups[g].options[o]
                if option.sharding_type is ShardingType.TABLE_COLUMN_WISE:
                    return None  # its shards must share a host, which items do not
                costs = problem.costs(option)
                if option.placement is Placement.FIXED:
                    choices[t] = Choice(o, everywhere)
                elif j >= 0 and c.free[j].per_host_rank:
                    by_host_size.setdefault(c.free[j].per_host_rank, []).append((t, o))
                else:
                    for shard in range(costs.num_shards):
                        item = item_of(costs, shard, self.scale, self.memory)
                        kind = kind_index.get(item, -1)
                        hbm, ddr = int(costs.hbm[shard]), int(costs.ddr[shard])
                        items.append((-hbm, -ddr, t, shard, o, kind))
        pool_hosts = self._decode_hosts(solver, by_host_size, choices)
        wanted = np.zeros((problem.world_size, len(self.kinds)), dtype=np.int64)
        for pool, slots in enumerate(self.slots):
            ranks = iter(r for h in pool_hosts[pool] for r in problem.host_ranks(h))
            for (_, counts), (var, _) in slots.items():
                for rank in (next(ranks) for _ in range(int(solver.value(var)))):
                    wanted[rank] = counts
        hbm_used = np.zeros(problem.world_size, dtype=np.int64)
        for t, choice in enumerate(choices):
            if choice is not None:
                costs = problem.costs(problem.tables[t].options[choice.option])
                np.add.at(hbm_used, list(choice.ranks), costs.hbm)
        shard_ranks: dict[int, tuple[int, list[int]]] = {}  # table -> (option, shard ranks)
        for minus_hbm, _, t, shard, o, kind in sorted(items):  # heaviest in HBM first
            free = (problem.hbm_cap - hbm_used).astype(float)
            if kind >= 0:
                free[wanted[:, kind] == 0] = -np.inf
            rank = int(np.argmax(free))
            if kind >= 0:
                wanted[rank, kind] -= 1
            hbm_used[rank] -= minus_hbm
            num_shards = problem.costs(problem.tables[t].options[o]).num_shards
            shard_ranks.setdefault(t, (o, [-1] * num_shards))[1][shard] = rank
        for t, (o, placed) in shard_ranks.items():
            choices[t] = Choice(o, tuple(placed))
        plan = [choice for choice in choices if choice is not None]
        if len(plan) != len(problem.tables) or not loads_of(problem, plan).fits(problem):
            return None
        return plan

    def _decode_hosts(
        self,
        solver: cp_model.CpSolver,
        by_host_size: dict[int, list[tuple[int, int]]],
        choices: list[Choice | None],
    ) -> list[list[int]]:
        """Put table-row-wise tables on hosts as the solution says; the hosts of each pool."""
        problem = self.problem
        pending = {size: iter(tables) for size, tables in by_host_size.items()}

        def place(host: int, size: int, count: int) -> None:
            for t, o in (next(pending[size]) for _ in range(count)):
                choices[t] = Choice(o, tuple(problem.host_ranks(host)))

        if self.host_tables:
            for host, sizes in enumerate(self.host_tables):
                for size, var in sizes.items():
                    place(host, size, int(solver.value(var)))
            return [[host] for host in range(problem.num_hosts)]
        pools, next_host = [], 0
        for (_, mix), var in self.host_mixes:
            hosts = list(range(next_host, next_host + int(solver.value(var))))
            next_host += len(hosts)
            pools.append(hosts)
            for host in hosts:
                for size, count in zip(self.host_sizes, mix, strict=True):
                    place(host, size, count)
        return pools
