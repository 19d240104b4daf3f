"""A fast constructive plan: the warm start for CP-SAT and the answer when time is short.

Longest-processing-time first with option choice against a target makespan: tables are
taken in decreasing order of the least work they need; for each, every option is placed
tentatively (each free shard on the least-loaded rank that can hold it, host-local options
on the best host). Options that keep every rank under the target compete on total work
added (spreading a table row-wise costs more work than keeping it whole, so it is only
worth it when the whole table would overshoot); otherwise the option with the lightest
most-loaded rank wins. Ties go to less HBM, then the earlier option. ``greedy_plan`` tries a
few targets from the lower bound upwards and keeps the best plan.

Colocate groups follow the ranks of their first placed member; separate groups avoid the
ranks of theirs. Deterministic: every tie is broken by index.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner_service.enumerator import Placement, ShardingOption
from planner_service.problem import Choice, OptionCosts, Problem, loads_of
from planner_service.types import ShardingType


@dataclass
class _State:
    perf: np.ndarray
    hbm: np.ndarray
    ddr: np.ndarray
    max_perf: float = 0.0
    placed: dict[int, frozenset[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Candidate:
    key: tuple[float, float, int, int]
    choice: Choice


TARGET_FACTORS = (1.0, 1.03, 1.1, 1.3)


def greedy_plan(
    problem: Problem, lower_bound: float = 0.0, guides: list[list[list[int]]] | None = None
) -> list[Choice] | None:
    """The best plan over several targets, unguided and with each guide (per table, the
    options to try first: the LP relaxation's rounded option mix, which knows which tables
    memory should push into slower tiers), or None when no pass places every table."""
    best: tuple[tuple[float, int], list[Choice]] | None = None
    for guide in [None, *(guides or [])]:
        for factor in TARGET_FACTORS:
            choices = _greedy(problem, lower_bound * factor, guide)
            if choices is None:
                continue
            loads = loads_of(problem, choices)
            key = (loads.objective, loads.peak_hbm)
            if best is None or key < best[0]:
                best = (key, choices)
            if lower_bound > 0 and loads.objective <= lower_bound * factor:
                break  # met its target: larger targets cannot do better
    return best[1] if best else None


def _greedy(
    problem: Problem, target: float, preferred: list[list[int]] | None
) -> list[Choice] | None:
    """One pass at ``target``; None when this pass cannot place some table. With
    ``preferred``, a table tries only its preferred options first."""
    world = problem.world_size
    state = _State(np.zeros(world), np.zeros(world, np.int64), np.zeros(world, np.int64))
    groups = _GroupIndex(problem)
    choices: list[Choice | None] = [None] * len(problem.tables)
    for t in _order(problem, target, preferred):
        options = problem.tables[t].options
        rounds = (
            [preferred[t], range(len(options))]
            if preferred and preferred[t]
            else [range(len(options))]
        )
        best: _Candidate | None = None
        for indices in rounds:
            for index in indices:
                candidate = _try_option(problem, state, groups, t, index, options[index], target)
                if candidate is not None and (best is None or candidate.key < best.key):
                    best = candidate
            if best is not None:
                break
        if best is None:
            return None
        _commit(problem, state, t, best.choice)
        choices[t] = best.choice
    return [choice for choice in choices if choice is not None]


def _order(problem: Problem, target: float, preferred: list[list[int]] | None) -> list[int]:
    """Biggest first, where big means a large share of a rank's time (at the target) or of
    a rank's HBM: memory-heavy tables must be packed while there is still room."""
    hbm_cap = float(problem.hbm_cap.max(initial=0)) or 1.0

    def size(t: int) -> float:
        options = problem.tables[t].options
        indices = preferred[t] if preferred and preferred[t] else range(len(options))
        costs = [problem.costs(options[i]) for i in indices]
        time_share = min(c.work for c in costs) / target if target > 0 else 0.0
        memory_share = min(float(c.hbm.max()) for c in costs) / hbm_cap
        return max(time_share, memory_share, min(c.work for c in costs) * 1e-12)

    return sorted(
        range(len(problem.tables)), key=lambda t: (-size(t), problem.tables[t].table.name)
    )


class _GroupIndex:
    """Which already-placed tables constrain a table through colocate or separate groups."""

    def __init__(self, problem: Problem) -> None:
        index = {entry.table.name: i for i, entry in enumerate(problem.tables)}
        constraints = problem.request.constraints
        self.colocate: dict[int, list[int]] = {}
        self.separate: dict[int, list[int]] = {}
        for target, groups in (
            (self.colocate, constraints.colocate),
            (self.separate, constraints.separate),
        ):
            for group in groups:
                members = [index[name] for name in group]
                for member in members:
                    target.setdefault(member, []).extend(m for m in members if m != member)

    def target(self, state: _State, t: int) -> frozenset[int] | None:
        """The rank set ``t`` must use exactly, if a colocated table is already placed."""
        for other in self.colocate.get(t, ()):
            if other in state.placed:
                return state.placed[other]
        return None

    def forbidden(self, state: _State, t: int) -> set[int]:
        ranks: set[int] = set()
        for other in self.separate.get(t, ()):
            ranks |= state.placed.get(other, frozenset())
        return ranks


def _try_option(
    problem: Problem,
    state: _State,
    groups: _GroupIndex,
    t: int,
    index: int,
    option: ShardingOption,
    makespan_target: float,
) -> _Candidate | None:
    costs = problem.costs(option)
    allowed = set(problem.allowed[t]) - groups.forbidden(state, t)
    colocated = groups.target(state, t)
    if colocated is not None:
        allowed &= colocated
    if option.placement is Placement.FIXED:
        ranks_options = [tuple(range(problem.world_size))]
    elif option.sharding_type is ShardingType.TABLE_ROW_WISE:
        ranks_options = [tuple(problem.host_ranks(h)) for h in range(problem.num_hosts)]
    elif option.sharding_type is ShardingType.TABLE_COLUMN_WISE:
        ranks_options = []
        for host in range(problem.num_hosts):
            host_allowed = allowed & set(problem.host_ranks(host))
            placed = _place_free(problem, state, costs, sorted(host_allowed), colocated)
            if placed is not None:
                ranks_options.append(placed)
    else:
        placed = _place_free(problem, state, costs, sorted(allowed), colocated)
        ranks_options = [placed] if placed is not None else []
    best = None
    for ranks in ranks_options:
        if not set(ranks) <= allowed or (colocated is not None and set(ranks) != colocated):
            continue
        key = _score(problem, state, costs, ranks, index, makespan_target)
        if key is not None and (best is None or key < best.key):
            best = _Candidate(key, Choice(index, ranks))
    return best


def _place_free(
    problem: Problem,
    state: _State,
    costs: OptionCosts,
    allowed: list[int],
    target: frozenset[int] | None,
) -> tuple[int, ...] | None:
    """Each shard to the allowed rank with the lowest resulting load that can hold it;
    with a colocate target, every target rank must receive a shard."""
    if not allowed:
        return None
    candidates = np.asarray(allowed, dtype=np.int64)
    perf = state.perf[candidates].copy()
    hbm = state.hbm[candidates].copy()
    ddr = state.ddr[candidates].copy()
    hbm_cap, ddr_cap = problem.hbm_cap[candidates], problem.ddr_cap[candidates]
    shard_costs = costs.cost[:, problem.class_of_rank[candidates]]
    uncovered = np.ones(len(candidates), dtype=bool) if target is not None else None
    ranks = []
    for s in range(costs.num_shards):
        fits = (hbm + costs.hbm[s] <= hbm_cap) & (ddr + costs.ddr[s] <= ddr_cap)
        if uncovered is not None and uncovered.sum() >= costs.num_shards - s:
            fits &= uncovered
        if not fits.any():
            return None
        new_load = np.where(fits, perf + shard_costs[s], np.inf)
        pick = int(np.argmin(new_load))
        perf[pick] = new_load[pick]
        hbm[pick] += costs.hbm[s]
        ddr[pick] += costs.ddr[s]
        if uncovered is not None:
            uncovered[pick] = False
        ranks.append(int(candidates[pick]))
    return tuple(ranks)


def _score(
    problem: Problem,
    state: _State,
    costs: OptionCosts,
    ranks: tuple[int, ...],
    index: int,
    target: float,
) -> tuple[float, float, int, int] | None:
    """(resulting max load if above target else the target, added work, resulting peak HBM
    on touched ranks, option index), or None if the placement overflows a rank."""
    idx = np.asarray(ranks, dtype=np.int64)
    add_perf = np.zeros(problem.world_size)
    add_hbm = np.zeros(problem.world_size, dtype=np.int64)
    add_ddr = np.zeros(problem.world_size, dtype=np.int64)
    shard_cost = costs.cost[np.arange(costs.num_shards), problem.class_of_rank[idx]]
    np.add.at(add_perf, idx, shard_cost)
    np.add.at(add_hbm, idx, costs.hbm)
    np.add.at(add_ddr, idx, costs.ddr)
    touched = np.unique(idx)
    new_hbm = state.hbm[touched] + add_hbm[touched]
    if (new_hbm > problem.hbm_cap[touched]).any():
        return None
    if (state.ddr[touched] + add_ddr[touched] > problem.ddr_cap[touched]).any():
        return None
    new_max = max(state.max_perf, float((state.perf[touched] + add_perf[touched]).max()))
    return (max(new_max, target), float(shard_cost.sum()), int(new_hbm.max()), index)


def _commit(problem: Problem, state: _State, t: int, choice: Choice) -> None:
    costs = problem.costs(problem.tables[t].options[choice.option])
    idx = np.asarray(choice.ranks, dtype=np.int64)
    shard_cost = costs.cost[np.arange(costs.num_shards), problem.class_of_rank[idx]]
    np.add.at(state.perf, idx, shard_cost)
    np.add.at(state.hbm, idx, costs.hbm)
    np.add.at(state.ddr, idx, costs.ddr)
    state.max_perf = float(state.perf.max())
    state.placed[t] = frozenset(choice.ranks)
