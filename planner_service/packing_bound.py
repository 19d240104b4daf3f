"""A lower bound that sees how whole shards pack into ranks.

The LP relaxation and CP-SAT's own bound spread load fractionally, so on the public
workloads they stop short of optima set by the arithmetic of a few shard sizes (tiny on 8
ranks: every rank carries the same row-wise load plus four or five whole tables of two
sizes). This bound solves, with CP-SAT, a relaxation small and symmetric enough to solve
outright within a short budget:

- memory, pinned ranks and colocate/separate groups are dropped;
- every shard costs what it costs on its cheapest device class;
- an option on every rank (row-wise, data-parallel) adds its cheapest shard to every rank;
- a table-row-wise table adds its cheapest shard to every rank of one host;
- every other shard (table-wise, column-wise, table-column-wise) is an *item* any rank may
  take, shards of one table included.

Every plan maps onto a solution of this relaxation with no larger makespan, so its optimum
(and any bound CP-SAT proves on it) is a lower bound for the request. In the relaxation the
ranks of a host are interchangeable, and so are hosts with the same table-row-wise load, so
it is written over *configurations* instead of ranks: a configuration is how many items of
each size one rank holds, and the model counts how many ranks of each pool (a host, or all
hosts of one table-row-wise mix) take each configuration. Symmetric rank-indexed models are
what CP-SAT proves bounds on slowly; this one has no rank symmetry left.

Only plans at least as good as the warm start matter, so configurations are enumerated up to
the warm start's makespan; the model is skipped when they would be too many (many distinct
shard sizes), and the other bounds stand. Perf is scaled to integers rounding down, as in
``cpsat.py``, so the scaled optimum never exceeds the true one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from planner_service.bounds import LowerBound
from planner_service.cpsat import COST_RESOLUTION, deterministic_solver
from planner_service.enumerator import Placement
from planner_service.problem import Group, Problem
from planner_service.types import ShardingType

PACKING_SHARE = 0.1  # of the request's time limit, in deterministic seconds
RESOLUTION = COST_RESOLUTION  # integer units per warm-start makespan, as in the main model
MAX_CONFIG_VARS = 20_000  # pool x configuration counts; beyond this the bound is skipped
PER_HOST_MAX_HOSTS = 4  # up to this many hosts, each host is its own pool


_Expr = cp_model.LinearExpr | int
_Configuration = tuple[int, tuple[int, ...]]  # (load, count of each size)


@dataclass(frozen=True)
class _Option:
    group: int
    option: int
    every_rank: int  # units added to every rank
    per_host_rank: int  # units added to every rank of one host (table-row-wise)
    items: dict[int, int]  # item size (units) -> how many per table


@dataclass
class _Pool:
    """Ranks that share an extra load: ``size`` ranks, each with ``base`` on top (at least
    ``base_least``); ``base_work`` is that load summed over the pool's ranks."""

    size: _Expr
    base: _Expr
    base_least: int
    base_work: _Expr
    counts: list[cp_model.IntVar] = field(default_factory=list)  # ranks per configuration


def packing_bound(
    problem: Problem, groups: list[Group], upper: float, *, time_limit_s: float, seed: int
) -> LowerBound | None:
    """A lower bound on the request's optimum, ``upper`` being a plan's makespan; None when
    the relaxation is too large to build or nothing was proven."""
    if upper <= 0 or problem.num_hosts * problem.local_world_size != problem.world_size:
        return None
    scale = RESOLUTION / upper
    options = _options(problem, groups, upper, scale)
    sizes = sorted({size for o in options for size in o.items if size > 0}, reverse=True)
    supply = {
        size: sum(groups[o.group].size * o.items.get(size, 0) for o in options) for size in sizes
    }
    host_sizes = sorted({o.per_host_rank for o in options if o.per_host_rank}, reverse=True)
    per_host = bool(host_sizes) and problem.num_hosts <= PER_HOST_MAX_HOSTS
    host_mixes: list[_Configuration] = [(0, ())]
    if host_sizes and not per_host:
        host_supply = {
            size: sum(groups[o.group].size for o in options if o.per_host_rank == size)
            for size in host_sizes
        }
        mixes = _configurations(host_sizes, host_supply, RESOLUTION, MAX_CONFIG_VARS)
        if mixes is None:
            return None
        host_mixes = mixes
    configs = _configurations(sizes, supply, RESOLUTION, MAX_CONFIG_VARS)
    if configs is None:
        return None
    num_pools = problem.num_hosts if per_host else len(host_mixes)
    pool_bases = [0] * num_pools if per_host else [load for load, _ in host_mixes]
    if sum(load + base <= RESOLUTION for base in pool_bases for load, _ in configs) > (
        MAX_CONFIG_VARS
    ):
        return None
    model = _RelaxedModel(problem, groups, options, sizes, configs)
    if per_host:
        model.pools_per_host(host_sizes)
    else:
        model.pools_per_host_mix(host_sizes, host_mixes)
    model.finish()
    solver = _solver(time_limit_s * PACKING_SHARE, seed)
    status = solver.solve(model.model)
    if status in (cp_model.INFEASIBLE, cp_model.MODEL_INVALID):
        return None  # the warm start maps into the relaxation, so this cannot happen
    proven = min(solver.best_objective_bound, RESOLUTION)
    if proven <= 0:
        return None
    return LowerBound(proven / scale, "packing")


def _solver(budget: float, seed: int) -> cp_model.CpSolver:
    """One deterministic worker searching on the objective's lower bound, without presolve:
    on these small, dense models presolve (probing, clique merging) spent the whole budget,
    and a portfolio overshot its deterministic limit several times over (measured on the
    public workloads, see docs/solver.md)."""
    solver = deterministic_solver(budget, seed)
    parameters = solver.parameters
    parameters.num_workers = 1
    parameters.interleave_search = False
    parameters.cp_model_presolve = False
    parameters.use_objective_lb_search = True
    return solver


def _options(problem: Problem, groups: list[Group], upper: float, scale: float) -> list[_Option]:
    """Each group's options as the relaxation sees them; options with a shard over the upper
    bound cannot be in a plan at least as good, and are left out."""
    result = []
    for g, group in enumerate(groups):
        for o, option in enumerate(group.options):
            costs = problem.costs(option)
            if costs.largest_shard > upper:
                continue
            if option.placement is Placement.FIXED:
                result.append(_Option(g, o, _units(costs.min_cost.min(), scale), 0, {}))
            elif option.sharding_type is ShardingType.TABLE_ROW_WISE:
                result.append(_Option(g, o, 0, _units(costs.min_cost.min(), scale), {}))
            else:
                items: dict[int, int] = {}
                for cost in costs.min_cost:
                    size = _units(cost, scale)
                    items[size] = items.get(size, 0) + 1
                result.append(_Option(g, o, 0, 0, items))
    return result


def _units(cost: float, scale: float) -> int:
    return math.floor(cost * scale)


def _configurations(
    sizes: list[int], supply: dict[int, int], capacity: int, limit: int
) -> list[_Configuration] | None:
    """Every (load, counts per size) with load within ``capacity`` and counts within the
    supply, or None once there would be more than ``limit``."""
    found: list[_Configuration] = []
    counts = [0] * len(sizes)

    def extend(index: int, load: int) -> bool:
        if index == len(sizes):
            found.append((load, tuple(counts)))
            return len(found) <= limit
        size = sizes[index]
        most = min(supply[size], (capacity - load) // size)
        for count in range(most + 1):
            counts[index] = count
            if not extend(index + 1, load + count * size):
                return False
        counts[index] = 0
        return True

    return found if extend(0, 0) else None


class _RelaxedModel:
    """The relaxation over configurations: per group and option a count of tables, per pool
    and configuration a count of ranks; the makespan covers every configuration in use."""

    def __init__(
        self,
        problem: Problem,
        groups: list[Group],
        options: list[_Option],
        sizes: list[int],
        configs: list[_Configuration],
    ) -> None:
        self.problem = problem
        self.options = options
        self.sizes = sizes
        self.configs = configs
        self.model = cp_model.CpModel()
        self.tables = {}
        for g, group in enumerate(groups):
            chosen = [o for o in options if o.group == g]
            for o in chosen:
                self.tables[o.group, o.option] = self.model.new_int_var(0, group.size, "")
            self.model.add(sum(self.tables[o.group, o.option] for o in chosen) == group.size)
        self.every_rank = sum(
            o.every_rank * self.tables[o.group, o.option] for o in options if o.every_rank
        )
        self.makespan = self.model.new_int_var(0, RESOLUTION, "T")
        self.pools: list[_Pool] = []

    def _host_tables(self, size: int) -> _Expr:
        return sum(self.tables[o.group, o.option] for o in self.options if o.per_host_rank == size)

    def pools_per_host(self, host_sizes: list[int]) -> None:
        """Each host a pool whose base is its own table-row-wise load; hosts ordered by that
        load (they are interchangeable)."""
        per_host = [
            {size: self.model.new_int_var(0, RESOLUTION // size, "") for size in host_sizes}
            for _ in range(self.problem.num_hosts)
        ]
        for size in host_sizes:
            self.model.add(sum(host[size] for host in per_host) == self._host_tables(size))
        bases = [sum(size * host[size] for size in host_sizes) for host in per_host]
        local = self.problem.local_world_size
        for base in bases:
            self.model.add(base <= RESOLUTION)
            self.pools.append(_Pool(local, base, 0, local * base))
        for heavier, lighter in zip(bases, bases[1:], strict=False):
            self.model.add(heavier >= lighter)

    def pools_per_host_mix(self, host_sizes: list[int], mixes: list[_Configuration]) -> None:
        """One pool per mix of table-row-wise tables a host could hold, sized by how many
        hosts hold that mix."""
        hosts = [self.model.new_int_var(0, self.problem.num_hosts, "") for _ in mixes]
        self.model.add(sum(hosts) == self.problem.num_hosts)
        for i, size in enumerate(host_sizes):
            self.model.add(
                sum(mix[i] * n for (_, mix), n in zip(mixes, hosts, strict=True) if mix[i])
                == self._host_tables(size)
            )
        local = self.problem.local_world_size
        for (load, _), n in zip(mixes, hosts, strict=True):
            self.pools.append(_Pool(local * n, load, load, local * load * n))

    def finish(self) -> None:
        model, configs = self.model, self.configs
        world = self.problem.world_size
        placed: list[list[tuple[cp_model.IntVar, int]]] = [[] for _ in self.sizes]
        work = []
        for pool in self.pools:
            for load, counts in configs:
                if pool.base_least + load > RESOLUTION:
                    continue
                ranks = model.new_int_var(0, world, "")
                pool.counts.append(ranks)
                used = model.new_bool_var("")
                model.add(ranks == 0).only_enforce_if(~used)
                model.add(self.makespan >= self.every_rank + pool.base + load).only_enforce_if(used)
                work.append(load * ranks)
                for i, count in enumerate(counts):
                    if count:
                        placed[i].append((ranks, count))
            model.add(sum(pool.counts) == pool.size)
        for size, terms in zip(self.sizes, placed, strict=True):
            supplied = sum(
                count * self.tables[o.group, o.option]
                for o in self.options
                for item, count in o.items.items()
                if item == size
            )
            model.add(sum(count * ranks for ranks, count in terms) == supplied)
        # Redundant, but it hands the LP the average-load bound from the start.
        model.add(
            world * self.makespan
            >= world * self.every_rank + sum(pool.base_work for pool in self.pools) + sum(work)
        )
        model.minimize(self.makespan)
