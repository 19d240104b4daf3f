"""The CP-SAT model: choose options and place shards so the most loaded rank is lightest.

Identical tables are aggregated (see ``problem.group_tables``): per group and option an
integer count of tables choosing it, and per free shard kind and rank an integer count of
shards placed there. Column shards of one table may share a rank, so a column-wise option
is just ``k`` interchangeable shards; a table-row-wise option is a count per host. The model
therefore grows with distinct shapes x options x ranks, not with tables. When even that
exceeds ``search.MAX_PLACEMENT_VARS``, each group keeps the options and ranks of the warm
start plus its cheapest options and the least-loaded ranks (``restrict``); the model is then
a neighbourhood of the warm start and its bound is not used as a proof.

Perf is scaled to integers rounding down (``run.COST_RESOLUTION``), so the model's optimum
never exceeds the true one and its proven bound (divided by the scale) is a valid lower
bound. Memory is exact bytes. The search that solves it is ``search.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from planner_service.costs.options import Placement, ShardingOption
from planner_service.plan.types import ShardingType
from planner_service.solve.deadline import Deadline, OutOfTime
from planner_service.solve.problem import Choice, Group, Problem, loads_of

HBM_STEPS = 1000  # resolution of the peak-HBM tie-break
# What the model's constraints over ranks (capacities, makespan, peak HBM) take to build,
# relative to the groups' variables before them: at 5,384 distinct tables on 1,024 ranks
# (738,741 variables) the groups took 21.7 s, then 9.0, 10.2 and 13.2 s. A build that
# cannot finish by the deadline at this rate is not continued: it would end past the
# time limit with nothing to search (it did: 30 s past a 60 s limit).
REST_OF_BUILD_FACTOR = 1.5
# The whole build, per load term (a placement variable on a rank, or a rank of a fixed
# option), measured on the 2-core EPYC: 6,587,165 terms (738,741 variables) took 54 s,
# 8.2 us each; 192,000 terms on 64 ranks about 1.3 s, 6.8 us each. A model expected to
# take longer than the deadline leaves is not started (``build_s``).
BUILD_S_PER_TERM = 8e-6
LIGHTEST_KEPT = 8  # ranks a restricted model keeps per option besides the warm start's
CHEAPEST_KEPT = 3  # options a restricted model keeps per group besides the warm start's


@dataclass
class _OptionVars:
    group: int
    option: int
    count: cp_model.IntVar
    per_rank: dict[int, cp_model.IntVar] = field(default_factory=dict)  # free shards
    per_host: dict[int, cp_model.IntVar] = field(default_factory=dict)  # host-local tables


class PlacementModel:
    """The aggregated model of one request, with its hint and the decoding of a solution."""

    def __init__(
        self,
        problem: Problem,
        groups: list[Group],
        hint: list[Choice] | None,
        scale: float,
        restrict: bool,
        deadline: Deadline,
    ) -> None:
        """Every group's variables and loads, capacities and links; ``OutOfTime`` if the
        deadline passes while they are built, or if what is left to build cannot end by it
        (``REST_OF_BUILD_FACTOR``). ``makespan`` and ``peak_hbm`` look at the same
        deadline."""
        self.problem = problem
        self.deadline = deadline
        self.groups = groups
        self.scale = scale
        self.model = cp_model.CpModel()
        world = problem.world_size
        self.perf_terms: list[list[tuple[cp_model.IntVar, int]]] = [[] for _ in range(world)]
        self.hbm_terms: list[list[tuple[cp_model.IntVar, int]]] = [[] for _ in range(world)]
        self.ddr_terms: list[list[tuple[cp_model.IntVar, int]]] = [[] for _ in range(world)]
        self.usage_terms: dict[int, list[list[tuple[cp_model.IntVar, int]]]] = {}
        self.option_vars: list[_OptionVars] = []
        self.hint = hint
        self.hint_loads = loads_of(problem, hint) if hint is not None else None
        self.restrict = restrict
        self._lightest_of: dict[int, list[int]] = {}
        self.num_placement_vars = 0
        self.linked = _linked_groups(problem, groups)
        for g in self.linked.values():
            self.usage_terms[g] = [[] for _ in range(world)]
        started = deadline.remaining_s()
        for g, group in enumerate(groups):
            deadline.check()
            self._add_group(g, group)
        deadline.check()
        if not math.isinf(started):
            groups_s = started - deadline.remaining_s()
            if not deadline.allows(REST_OF_BUILD_FACTOR * groups_s):
                raise OutOfTime
        self._add_capacities()
        self._add_links()

    # ---- variables

    def _add_group(self, g: int, group: Group) -> None:
        counts = []
        for o in self._kept_options(group):
            option = group.options[o]
            count = self.model.new_int_var(0, group.size, f"y{g}_{o}")
            counts.append(count)
            entry = _OptionVars(g, o, count)
            self.option_vars.append(entry)
            if option.placement is Placement.FIXED:
                self._add_fixed(entry, option, count, tuple(range(self.problem.world_size)))
            elif option.sharding_type is ShardingType.TABLE_ROW_WISE:
                self._add_per_host(entry, option, group, free_within_host=False)
            elif option.sharding_type is ShardingType.TABLE_COLUMN_WISE:
                self._add_per_host(entry, option, group, free_within_host=True)
            else:
                self._add_free(entry, option, group, count, self._kept_ranks(g, o, group.allowed))
        self.model.add(sum(counts) == group.size)

    def _add_fixed(
        self,
        entry: _OptionVars,
        option: ShardingOption,
        count: cp_model.IntVar,
        ranks: tuple[int, ...],
    ) -> None:
        costs = self.problem.costs(option)
        for shard, rank in enumerate(ranks):
            cost = costs.cost[shard, self.problem.class_of_rank[rank]]
            self._load(rank, count, cost, int(costs.hbm[shard]), int(costs.ddr[shard]), entry.group)

    def _add_free(
        self,
        entry: _OptionVars,
        option: ShardingOption,
        group: Group,
        count: cp_model.IntVar,
        ranks: list[int],
    ) -> None:
        """``k`` equal shards per table, each on any allowed rank (shards may share one)."""
        costs = self.problem.costs(option)
        k = costs.num_shards
        placed = []
        for rank in ranks:
            z = self.model.new_int_var(0, group.size * k, f"z{entry.group}_{entry.option}_{rank}")
            entry.per_rank[rank] = z
            placed.append(z)
            cost = costs.cost[0, self.problem.class_of_rank[rank]]
            self._load(rank, z, cost, int(costs.hbm[0]), int(costs.ddr[0]), entry.group)
        self.num_placement_vars += len(ranks)
        self.model.add(sum(placed) == k * count)

    def _add_per_host(
        self, entry: _OptionVars, option: ShardingOption, group: Group, free_within_host: bool
    ) -> None:
        problem = self.problem
        allowed = set(group.allowed)
        hosts = []
        for host in range(problem.num_hosts):
            ranks = tuple(problem.host_ranks(host))
            usable = [r for r in ranks if r in allowed]
            if not usable or (not free_within_host and len(usable) < len(ranks)):
                continue
            h = self.model.new_int_var(0, group.size, f"h{entry.group}_{entry.option}_{host}")
            entry.per_host[host] = h
            hosts.append(h)
            if free_within_host:
                self._add_free(entry, option, group, h, usable)
            else:
                self._add_fixed(entry, option, h, ranks)
        self.model.add(sum(hosts) == entry.count)

    def _load(
        self, rank: int, var: cp_model.IntVar, cost: float, hbm: int, ddr: int, group: int
    ) -> None:
        self.perf_terms[rank].append((var, math.floor(cost * self.scale)))
        if hbm:
            self.hbm_terms[rank].append((var, hbm))
        if ddr:
            self.ddr_terms[rank].append((var, ddr))
        if group in self.usage_terms:
            self.usage_terms[group][rank].append((var, 1))

    # ---- restriction to a neighbourhood of the warm start

    def _kept_options(self, group: Group) -> list[int]:
        return kept_options(self.problem, group, self.hint if self.restrict else None)

    def _kept_ranks(self, g: int, o: int, allowed: tuple[int, ...]) -> list[int]:
        if not self.restrict or self.hint is None or self.hint_loads is None:
            return list(allowed)
        group = self.groups[g]
        used = {r for t in group.members if self.hint[t].option == o for r in self.hint[t].ranks}
        return sorted(used | set(self._lightest(allowed)))

    def _lightest(self, allowed: tuple[int, ...]) -> list[int]:
        """The ``LIGHTEST_KEPT`` least loaded of ``allowed`` under the warm start, once per
        rank set (groups share their allowed tuples)."""
        found = self._lightest_of.get(id(allowed))
        if found is None:
            assert self.hint_loads is not None
            loads = self.hint_loads.perf
            found = sorted(allowed, key=lambda r: (loads[r], r))[:LIGHTEST_KEPT]
            self._lightest_of[id(allowed)] = found
        return found

    # ---- constraints

    def _add_capacities(self) -> None:
        problem = self.problem
        for rank in range(problem.world_size):
            self.deadline.check()
            for terms, cap in (
                (self.hbm_terms[rank], problem.hbm_cap[rank]),
                (self.ddr_terms[rank], problem.ddr_cap[rank]),
            ):
                if terms:
                    self.model.add(_weighted(terms) <= int(cap))

    def _add_links(self) -> None:
        """Colocate and separate groups, over which ranks each linked table uses."""
        constraints = self.problem.request.constraints
        if not constraints.colocate and not constraints.separate:
            return
        used = self._usage_booleans()
        for group in constraints.colocate:
            first, *rest = (used[name] for name in group)
            for other in rest:
                for a, b in zip(first, other, strict=True):
                    self.model.add(a == b)
        for group in constraints.separate:
            for i, name in enumerate(group):
                for partner in group[i + 1 :]:
                    for a, b in zip(used[name], used[partner], strict=True):
                        self.model.add(a + b <= 1)

    def _usage_booleans(self) -> dict[str, list[cp_model.IntVar]]:
        """For each linked (singleton) table, a boolean per rank: is any shard of it there?"""
        used = {}
        for name, g in self.linked.items():
            most = max(len(option.shards) for option in self.groups[g].options)
            flags = []
            for rank, terms in enumerate(self.usage_terms[g]):
                flag = self.model.new_bool_var(f"u{g}_{rank}")
                if terms:
                    shards = _weighted(terms)
                    self.model.add(shards <= most * flag)
                    self.model.add(shards >= flag)
                else:
                    self.model.add(flag == 0)
                flags.append(flag)
            used[name] = flags
        return used

    # ---- objective

    def makespan(self, lower: int, upper: int) -> cp_model.IntVar:
        makespan = self.model.new_int_var(min(lower, upper), upper, "T")
        for terms in self.perf_terms:
            self.deadline.check()
            if terms:
                self.model.add(_weighted(terms) <= makespan)
        return makespan

    def peak_hbm(self) -> cp_model.IntVar:
        """Peak HBM over ranks in steps of 1/HBM_STEPS of the largest rank's capacity."""
        step = max(1, math.ceil(int(self.problem.hbm_cap.max(initial=0)) / (HBM_STEPS - 1)))
        peak = self.model.new_int_var(0, HBM_STEPS - 1, "peak_hbm")
        for terms in self.hbm_terms:
            self.deadline.check()
            if terms:
                self.model.add(_weighted(terms) <= peak * step)
        return peak

    # ---- hints and decoding

    def add_hint(self, choices: list[Choice]) -> None:
        counts: dict[tuple[int, int], int] = {}
        ranks: dict[tuple[int, int, int], int] = {}
        hosts: dict[tuple[int, int, int], int] = {}
        for g, group in enumerate(self.groups):
            for t in group.members:
                choice = choices[t]
                counts[g, choice.option] = counts.get((g, choice.option), 0) + 1
                option = group.options[choice.option]
                if option.placement is Placement.PER_HOST:
                    host = self.problem.topology.host_of(choice.ranks[0])
                    hosts[g, choice.option, host] = hosts.get((g, choice.option, host), 0) + 1
                if _has_free_shards(option):
                    for rank in choice.ranks:
                        key = (g, choice.option, rank)
                        ranks[key] = ranks.get(key, 0) + 1
        for entry in self.option_vars:
            self.model.add_hint(entry.count, counts.get((entry.group, entry.option), 0))
            for rank, var in entry.per_rank.items():
                self.model.add_hint(var, ranks.get((entry.group, entry.option, rank), 0))
            for host, var in entry.per_host.items():
                self.model.add_hint(var, hosts.get((entry.group, entry.option, host), 0))

    def decode(self, solver: cp_model.CpSolver) -> list[Choice]:
        choices: list[Choice | None] = [None] * len(self.problem.tables)
        by_group: dict[int, list[_OptionVars]] = {}
        for entry in self.option_vars:
            by_group.setdefault(entry.group, []).append(entry)
        for g, group in enumerate(self.groups):
            members = iter(group.members)
            for entry in by_group.get(g, []):
                option = group.options[entry.option]
                for ranks in self._assign(solver, entry, option, int(solver.value(entry.count))):
                    choices[next(members)] = Choice(entry.option, ranks)
        return [choice for choice in choices if choice is not None]

    def _assign(
        self, solver: cp_model.CpSolver, entry: _OptionVars, option: ShardingOption, count: int
    ) -> list[tuple[int, ...]]:
        """The rank tuples of ``count`` tables taking this option, from the counts."""
        k = len(option.shards)
        if option.placement is Placement.FIXED:
            return [tuple(range(self.problem.world_size))] * count
        if option.sharding_type is ShardingType.TABLE_ROW_WISE:
            result = []
            for host, var in entry.per_host.items():
                result += [tuple(self.problem.host_ranks(host))] * int(solver.value(var))
            return result
        if option.sharding_type is ShardingType.TABLE_COLUMN_WISE:
            result = []
            for host, var in entry.per_host.items():
                ranks = [r for r in self.problem.host_ranks(host) if r in entry.per_rank]
                pool = _expand({r: int(solver.value(entry.per_rank[r])) for r in ranks})
                tables = int(solver.value(var))
                result += [tuple(pool[i * k : (i + 1) * k]) for i in range(tables)]
            return result
        pool = _expand({r: int(solver.value(v)) for r, v in entry.per_rank.items()})
        return [tuple(pool[i * k : (i + 1) * k]) for i in range(count)]


def kept_options(problem: Problem, group: Group, hint: list[Choice] | None) -> list[int]:
    """The options of ``group`` a model keeps: all of them, or with a warm start to restrict
    to (``hint``), those it uses and the ``CHEAPEST_KEPT`` of least work."""
    everything = list(range(len(group.options)))
    if hint is None:
        return everything
    used = {hint[t].option for t in group.members}
    by_work = sorted(everything, key=lambda o: (problem.costs(group.options[o]).work, o))
    return sorted(used | set(by_work[:CHEAPEST_KEPT]))


def build_s(
    problem: Problem, groups: list[Group], hint: list[Choice] | None, restrict: bool
) -> float:
    """What building the model of ``groups`` will take (``BUILD_S_PER_TERM``), from the
    load terms it will have: a rank of every fixed option, every rank a per-host option
    may use, and every rank a free option may use (restricted: its warm-start ranks and
    ``LIGHTEST_KEPT`` more), for every option kept. Counted without building anything."""
    world = problem.world_size
    restricted = hint if restrict else None
    used: dict[tuple[int, int], set[int]] = {}
    if restricted is not None:
        for g, group in enumerate(groups):
            for t in group.members:
                used.setdefault((g, restricted[t].option), set()).update(restricted[t].ranks)
    terms = 0
    for g, group in enumerate(groups):
        for o in kept_options(problem, group, restricted):
            placement = group.options[o].placement
            if placement is Placement.FIXED:
                terms += world
            elif restricted is None or placement is Placement.PER_HOST:
                terms += len(group.allowed)  # a host's ranks are never restricted
            else:
                terms += min(len(group.allowed), len(used.get((g, o), ())) + LIGHTEST_KEPT)
    return terms * BUILD_S_PER_TERM


def _has_free_shards(option: ShardingOption) -> bool:
    """Whether the model places this option's shards rank by rank (z variables)."""
    return option.placement is not Placement.FIXED and (
        option.sharding_type is not ShardingType.TABLE_ROW_WISE
    )


def _linked_groups(problem: Problem, groups: list[Group]) -> dict[str, int]:
    """Group index of every table named in a colocate or separate group (singletons)."""
    constraints = problem.request.constraints
    names = {name for group in (*constraints.colocate, *constraints.separate) for name in group}
    return {
        problem.tables[group.members[0]].table.name: g
        for g, group in enumerate(groups)
        if problem.tables[group.members[0]].table.name in names
    }


def _expand(counts: dict[int, int]) -> list[int]:
    return [rank for rank in sorted(counts) for _ in range(counts[rank])]


def _weighted(terms: list[tuple[cp_model.IntVar, int]]) -> cp_model.LinearExpr:
    return cp_model.LinearExpr.weighted_sum([v for v, _ in terms], [c for _, c in terms])
