"""A fast constructive plan: the warm start for CP-SAT and the answer when time is short.

Longest-processing-time first with option choice against a target makespan: tables are
taken in decreasing order of the least work they need; for each, every option is placed
tentatively (each free shard on the least-loaded rank that can hold it, host-local options
on the best host, where ties go to the least-loaded host). Options that keep every rank
under the target compete on total work added (spreading a table row-wise costs more work
than keeping it whole, so it is only worth it when the whole table would overshoot);
otherwise the option with the lightest most-loaded rank wins. Ties go to less HBM, then
the earlier option. ``greedy_plan`` tries a few targets from the lower bound upwards and
keeps the best plan.

Colocate groups follow the ranks of their first placed member; separate groups avoid the
ranks of theirs. Deterministic: every tie is broken by index.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from planner_service.costs.options import Placement, ShardingOption
from planner_service.plan.types import ShardingType
from planner_service.solve.deadline import Deadline
from planner_service.solve.problem import Choice, Loads, OptionCosts, Problem, loads_of


@dataclass
class _State:
    perf: np.ndarray
    hbm: np.ndarray
    ddr: np.ndarray
    max_perf: float = 0.0
    placed: dict[int, frozenset[int]] = field(default_factory=dict)
    # What the tables not yet placed need at least, in total: an option may only use memory
    # beyond this reserve, so early tables cannot starve later ones.
    reserve_hbm: int = 0
    reserve_bytes: int = 0
    free_hbm: int = 0
    free_bytes: int = 0


@dataclass(frozen=True)
class _Where:
    """Where one table may go, given the tables placed so far: ``allowed`` ranks (sorted in
    ``ranks``) and, once a colocated table is placed, the rank set it must use exactly."""

    allowed: set[int]
    ranks: np.ndarray
    colocated: frozenset[int] | None


@dataclass(frozen=True)
class _Candidate:
    key: tuple[float, float, int, int, float]  # see _score
    choice: Choice


# Unguided passes are sensitive to the target; guided ones barely (measured on the public
# workloads), so they run at the bound only.
UNGUIDED_TARGET_FACTORS = (1.0, 1.03, 1.1)
GUIDED_TARGET_FACTORS = (1.0,)
DEADLINE_CHECK_EVERY = 16  # tables placed between looks at the clock


def greedy_plan(
    problem: Problem,
    lower_bound: float = 0.0,
    guides: list[list[list[int]]] | None = None,
    deadline: Deadline | None = None,
) -> list[Choice] | None:
    """The best plan over several targets, unguided and with each guide (per table, the
    options to try first: the LP relaxation's rounded option mix, which knows which tables
    memory should push into slower tiers), or None when no pass places every table. Passes
    stop at the deadline, keeping the best plan of the passes that finished."""
    deadline = deadline or Deadline.never()
    best: tuple[tuple[float, int], list[Choice]] | None = None
    least = _least_memory(problem)
    for guide in [None, *(guides or [])]:
        factors = UNGUIDED_TARGET_FACTORS if guide is None else GUIDED_TARGET_FACTORS
        for factor in factors:
            if best is not None and deadline.expired():
                return best[1]
            # The first plan may use the deadline's grace; better plans only its time.
            stop = deadline.expired if best is not None else deadline.past_grace
            choices = _greedy(problem, lower_bound * factor, guide, least, stop)
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
    problem: Problem,
    target: float,
    preferred: list[list[int]] | None,
    least: tuple[list[int], list[int]],
    out_of_time: Callable[[], bool],
) -> list[Choice] | None:
    """One pass at ``target``; None when this pass cannot place some table, or when it runs
    out of time first. With ``preferred``, a table tries only its preferred options
    first."""
    state = _empty_state(problem)
    groups = _GroupIndex(problem)
    choices: list[Choice | None] = [None] * len(problem.tables)
    least_hbm, least_bytes = least
    state.reserve_hbm, state.reserve_bytes = sum(least_hbm), sum(least_bytes)
    for placed, t in enumerate(_order(problem, target, preferred)):
        if placed % DEADLINE_CHECK_EVERY == 0 and out_of_time():
            return None
        state.reserve_hbm -= least_hbm[t]
        state.reserve_bytes -= least_bytes[t]
        options = problem.tables[t].options
        rounds = (
            [preferred[t], range(len(options))]
            if preferred and preferred[t]
            else [range(len(options))]
        )
        best: _Candidate | None = None
        where = groups.where(problem, state, t)
        for round_number, indices in enumerate(rounds):
            # The guide's options compete on time; when none fits, memory is what ran out,
            # so the fallback takes the option that adds the least HBM, then the least bytes.
            fallback = preferred is not None and round_number > 0
            for index in indices:
                candidate = _try_option(problem, state, where, index, options[index], target)
                if candidate is None:
                    continue
                if fallback:
                    candidate = _by_memory(problem, options[index], candidate)
                if best is None or candidate.key < best.key:
                    best = candidate
            if best is not None:
                break
        if best is None:
            return None
        _commit(problem, state, t, best.choice)
        choices[t] = best.choice
    return [choice for choice in choices if choice is not None]


def _empty_state(problem: Problem) -> _State:
    world = problem.world_size
    state = _State(np.zeros(world), np.zeros(world, np.int64), np.zeros(world, np.int64))
    state.free_hbm = problem.hbm_total
    state.free_bytes = state.free_hbm + problem.ddr_total
    return state


def _by_memory(problem: Problem, option: ShardingOption, candidate: _Candidate) -> _Candidate:
    costs = problem.costs(option)
    hbm, ddr = costs.hbm_total, costs.ddr_total
    return _Candidate(
        (float(hbm), float(hbm + ddr), 0, candidate.key[3], candidate.key[4]), candidate.choice
    )


def _least_memory(problem: Problem) -> tuple[list[int], list[int]]:
    """Per table, the least total HBM and the least total HBM + DDR of any option."""
    hbm, total = [], []
    for entry in problem.tables:
        costs = [problem.costs(option) for option in entry.options]
        hbm.append(min(c.hbm_total for c in costs))
        total.append(min(c.hbm_total + c.ddr_total for c in costs))
    return hbm, total


def _order(problem: Problem, target: float, preferred: list[list[int]] | None) -> list[int]:
    """Options fixed on every rank (or a whole host) first, while every rank still has room;
    then biggest first, where big means a large share of a rank's time (at the target) or
    of a rank's HBM or DDR: memory-heavy tables must be packed while there is room."""
    hbm_cap = float(problem.hbm_cap.max(initial=0)) or 1.0
    ddr_cap = float(problem.ddr_cap.max(initial=0)) or 1.0
    # Tables of one shape share their options, so each shape's size is worked out once.
    sizes: dict[tuple[int, tuple[int, ...]], tuple[bool, float, float]] = {}

    def size(
        options: tuple[ShardingOption, ...], indices: tuple[int, ...]
    ) -> tuple[bool, float, float]:
        costs = [problem.costs(options[i]) for i in indices]
        spread = all(
            options[i].placement is not Placement.PER_SHARD
            and options[i].sharding_type is not ShardingType.TABLE_COLUMN_WISE
            for i in indices
        )
        memory_share = min(
            max(float(c.hbm.max()) / hbm_cap, float(c.ddr.max()) / ddr_cap) for c in costs
        )
        return spread, min(c.work for c in costs), memory_share

    def key(t: int) -> tuple[int, float, str]:
        options = problem.tables[t].options
        indices = tuple(preferred[t]) if preferred and preferred[t] else tuple(range(len(options)))
        known = sizes.get((id(options), indices))
        if known is None:
            known = sizes[id(options), indices] = size(options, indices)
        spread, work, memory_share = known
        time_share = work / target if target > 0 else 0.0
        return (
            0 if spread else 1,
            -max(time_share, memory_share, work * 1e-12),
            problem.tables[t].table.name,
        )

    return sorted(range(len(problem.tables)), key=key)


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
        self.linked = set(self.colocate) | set(self.separate)  # tables in any group

    def where(self, problem: Problem, state: _State, t: int) -> _Where:
        allowed = set(problem.allowed[t])
        for other in self.separate.get(t, ()):
            allowed -= state.placed.get(other, frozenset())
        colocated = next(
            (state.placed[other] for other in self.colocate.get(t, ()) if other in state.placed),
            None,
        )
        if colocated is not None:
            allowed &= colocated
        return _Where(allowed, np.array(sorted(allowed), dtype=np.int64), colocated)


def _try_option(
    problem: Problem,
    state: _State,
    where: _Where,
    index: int,
    option: ShardingOption,
    makespan_target: float,
) -> _Candidate | None:
    costs = problem.costs(option)
    allowed, colocated = where.allowed, where.colocated
    if option.placement is Placement.FIXED:
        ranks_options = [tuple(range(problem.world_size))]
    elif option.sharding_type is ShardingType.TABLE_ROW_WISE:
        return _best_host(problem, state, costs, index, makespan_target, allowed, colocated)
    elif option.sharding_type is ShardingType.TABLE_COLUMN_WISE:
        ranks_options = []
        host_of = where.ranks // problem.local_world_size
        for host in range(problem.num_hosts):
            placed = _place_free(problem, state, costs, where.ranks[host_of == host], colocated)
            if placed is not None:
                ranks_options.append(placed)
    else:
        placed = _place_free(problem, state, costs, where.ranks, colocated)
        ranks_options = [placed] if placed is not None else []
    best = None
    for ranks in ranks_options:
        if not set(ranks) <= allowed or (colocated is not None and set(ranks) != colocated):
            continue
        key = _score(problem, state, costs, ranks, index, makespan_target)
        if key is not None and (best is None or _between_hosts(key) < _between_hosts(best.key)):
            best = _Candidate(key, Choice(index, ranks))
    return best


def _best_host(
    problem: Problem,
    state: _State,
    costs: OptionCosts,
    index: int,
    target: float,
    allowed: set[int],
    colocated: frozenset[int] | None,
) -> _Candidate | None:
    """A table-row-wise option on its best host: ``_score`` and ``_between_hosts`` for
    every host at once."""
    if _eats_reserve(state, costs):
        return None
    grid = problem.host_grid
    usable = np.ones(len(grid), dtype=bool)
    if colocated is not None or len(allowed) < problem.world_size:
        usable = np.array(
            [set(ranks) <= allowed and colocated in (None, set(ranks)) for ranks in grid.tolist()]
        )
    shard_cost = costs.cost[np.arange(grid.shape[1]), problem.class_of_rank[grid]]
    hbm = state.hbm[grid] + costs.hbm
    usable &= (hbm <= problem.hbm_cap[grid]).all(axis=1)
    usable &= (state.ddr[grid] + costs.ddr <= problem.ddr_cap[grid]).all(axis=1)
    if not usable.any():
        return None
    load_after = (state.perf[grid] + shard_cost).max(axis=1)
    floor = np.maximum(np.maximum(load_after, state.max_perf), target)
    work = shard_cost.sum(axis=1)
    peak_hbm = hbm.max(axis=1)
    hosts = np.flatnonzero(usable)
    h = int(hosts[np.lexsort((peak_hbm[hosts], load_after[hosts], work[hosts], floor[hosts]))[0]])
    key = (float(floor[h]), float(work[h]), int(peak_hbm[h]), index, float(load_after[h]))
    return _Candidate(key, Choice(index, tuple(int(r) for r in grid[h])))


def _between_hosts(key: tuple[float, float, int, int, float]) -> tuple[float, float, float, int]:
    """How one option's placements on different hosts compare: as between ranks in
    ``_place_free``, the least loaded after the move wins once the target and the work tie
    (not the least HBM, which would stack tables on one host while all are under the
    target)."""
    return key[0], key[1], key[4], key[2]


def _place_free(
    problem: Problem,
    state: _State,
    costs: OptionCosts,
    candidates: np.ndarray,
    target: frozenset[int] | None,
) -> tuple[int, ...] | None:
    """Each shard to the allowed rank (of ``candidates``, sorted) with the lowest resulting
    load that can hold it; with a colocate target, every target rank must receive a shard."""
    if not len(candidates):
        return None
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
) -> tuple[float, float, int, int, float] | None:
    """(resulting max load if above target else the target, added work, resulting peak HBM
    on touched ranks, option index, resulting max load on touched ranks), or None if the
    placement overflows a rank or eats into what the tables still to place need."""
    if _eats_reserve(state, costs):
        return None
    if costs.num_shards == 1:
        return _score_one(problem, state, costs, ranks[0], index, target)
    idx = np.asarray(ranks, dtype=np.int64)
    shard_cost = costs.cost[np.arange(costs.num_shards), problem.class_of_rank[idx]]
    if len(set(ranks)) == len(ranks):  # one shard per rank: no aggregation needed
        touched, add_perf, add_hbm, add_ddr = idx, shard_cost, costs.hbm, costs.ddr
    else:
        touched, inverse = np.unique(idx, return_inverse=True)
        add_perf = np.bincount(inverse, weights=shard_cost)
        add_hbm = np.bincount(inverse, weights=costs.hbm)
        add_ddr = np.bincount(inverse, weights=costs.ddr)
    new_hbm = state.hbm[touched] + add_hbm
    if (new_hbm > problem.hbm_cap[touched]).any():
        return None
    if (state.ddr[touched] + add_ddr > problem.ddr_cap[touched]).any():
        return None
    load_after = float((state.perf[touched] + add_perf).max())
    new_max = max(state.max_perf, load_after)
    return (max(new_max, target), float(shard_cost.sum()), int(new_hbm.max()), index, load_after)


def _eats_reserve(state: _State, costs: OptionCosts) -> bool:
    """Whether the option would leave less memory than the tables still to place need."""
    return state.free_hbm - costs.hbm_total < state.reserve_hbm or (
        state.free_bytes - costs.hbm_total - costs.ddr_total < state.reserve_bytes
    )


def _score_one(
    problem: Problem, state: _State, costs: OptionCosts, rank: int, index: int, target: float
) -> tuple[float, float, int, int, float] | None:
    """``_score`` for a single shard, without arrays."""
    new_hbm = int(state.hbm[rank]) + int(costs.hbm[0])
    if (
        new_hbm > problem.hbm_cap[rank]
        or int(state.ddr[rank]) + int(costs.ddr[0]) > (problem.ddr_cap[rank])
    ):
        return None
    cost = float(costs.cost[0, problem.class_of_rank[rank]])
    load_after = float(state.perf[rank]) + cost
    return (max(state.max_perf, load_after, target), cost, new_hbm, index, load_after)


def _commit(problem: Problem, state: _State, t: int, choice: Choice) -> None:
    costs = problem.costs(problem.tables[t].options[choice.option])
    idx = np.asarray(choice.ranks, dtype=np.int64)
    shard_cost = costs.cost[np.arange(costs.num_shards), problem.class_of_rank[idx]]
    np.add.at(state.perf, idx, shard_cost)
    np.add.at(state.hbm, idx, costs.hbm)
    np.add.at(state.ddr, idx, costs.ddr)
    state.max_perf = float(state.perf.max())
    state.placed[t] = frozenset(choice.ranks)
    state.free_hbm -= costs.hbm_total
    state.free_bytes -= costs.hbm_total + costs.ddr_total


# --------------------------------------------------------------------------- improvement

MAX_IMPROVEMENT_ROUNDS = 200


def improve(
    problem: Problem, choices: list[Choice], deadline: Deadline | None = None
) -> list[Choice]:
    """Local search on the most loaded rank. Re-insertion: take each table with a shard
    there, remove it, and put it back with its best option and placement (as the greedy
    would, against the current max as target). Swap: exchange a whole single-shard table
    there with a cheaper one elsewhere. Repartition: re-split the whole single-shard tables
    of that rank and another between the two; then the table-row-wise tables of its host
    and another host. A move is kept if the max drops, or stays and
    fewer ranks sit at it. Deterministic; stops at a local optimum, after
    ``MAX_IMPROVEMENT_ROUNDS`` moves, or at the deadline."""
    deadline = deadline or Deadline.never()
    current = list(choices)
    loads = loads_of(problem, current)
    groups = _GroupIndex(problem)
    for _ in range(MAX_IMPROVEMENT_ROUNDS):
        if deadline.expired():
            break
        moved = (
            _improve_once(problem, groups, current, loads)
            or _swap_once(problem, groups, current, loads)
            or _repartition_ranks(problem, groups, current, loads)
            or _repartition_hosts(problem, groups, current, loads)
        )
        if moved is None:
            break
        current, loads = moved
    return current


def _swap_once(
    problem: Problem, groups: _GroupIndex, choices: list[Choice], loads: Loads
) -> tuple[list[Choice], Loads] | None:
    """Swap a single-shard table on the most loaded rank with a cheaper single-shard table
    on another rank, when both ranks end below the current max and within memory. Each
    candidate pair is checked in O(1); loads are updated incrementally."""
    peak = loads.objective
    bottleneck = int(np.argmax(loads.perf))
    singles = _movable_singles(problem, groups, choices)
    here = [t for t in singles if choices[t].ranks[0] == bottleneck]
    elsewhere = [t for t in singles if choices[t].ranks[0] != bottleneck]
    here.sort(key=lambda t: (-_single_cost(problem, t, choices[t], bottleneck), t))
    for a in here:
        costs_a = problem.costs(problem.tables[a].options[choices[a].option])
        for b in elsewhere:
            other = choices[b].ranks[0]
            costs_b = problem.costs(problem.tables[b].options[choices[b].option])
            class_here, class_other = (
                problem.class_of_rank[bottleneck],
                problem.class_of_rank[other],
            )
            new_here = (
                loads.perf[bottleneck] - costs_a.cost[0, class_here] + costs_b.cost[0, class_here]
            )
            new_other = (
                loads.perf[other] - costs_b.cost[0, class_other] + costs_a.cost[0, class_other]
            )
            if max(new_here, new_other) >= peak * (1 - 1e-12):
                continue
            hbm_delta = int(costs_a.hbm[0]) - int(costs_b.hbm[0])
            ddr_delta = int(costs_a.ddr[0]) - int(costs_b.ddr[0])
            if (
                loads.hbm[other] + hbm_delta > problem.hbm_cap[other]
                or loads.ddr[other] + ddr_delta > problem.ddr_cap[other]
                or loads.hbm[bottleneck] - hbm_delta > problem.hbm_cap[bottleneck]
                or loads.ddr[bottleneck] - ddr_delta > problem.ddr_cap[bottleneck]
            ):
                continue
            perf, hbm, ddr = loads.perf.copy(), loads.hbm.copy(), loads.ddr.copy()
            perf[bottleneck], perf[other] = new_here, new_other
            hbm[bottleneck] -= hbm_delta
            hbm[other] += hbm_delta
            ddr[bottleneck] -= ddr_delta
            ddr[other] += ddr_delta
            new = Loads(perf, hbm, ddr)
            at_peak = int((loads.perf >= peak * (1 - 1e-12)).sum())
            if new.objective < peak * (1 - 1e-12) or (
                int((new.perf >= peak * (1 - 1e-12)).sum()) < at_peak
            ):
                trial = list(choices)
                trial[a] = Choice(choices[a].option, (other,))
                trial[b] = Choice(choices[b].option, (bottleneck,))
                return trial, new
    return None


MAX_REPARTITION_ITEMS = 12  # 2^12 splits of two bins' tables, checked at once


def _movable_singles(problem: Problem, groups: _GroupIndex, choices: list[Choice]) -> list[int]:
    """Single-shard tables that may go to any rank (not pinned, not in a link group)."""
    return [t for t, _ in _movable(problem, groups, choices, _rank_grid(problem))]


def _rank_grid(problem: Problem) -> np.ndarray:
    """Each rank a bin of its own (``problem.host_grid``: each host a bin)."""
    return np.arange(problem.world_size).reshape(-1, 1)


def _movable(
    problem: Problem, groups: _GroupIndex, choices: list[Choice], grid: np.ndarray
) -> list[tuple[int, int]]:
    """(table, bin) for each table whose shards sit exactly on the ranks of one row (bin) of
    ``grid``, in order, and that may move whole to any other (not pinned, not in a link
    group, not fixed on every rank): a single-shard table on a rank, a table-row-wise table
    on a host."""
    everywhere = tuple(range(problem.world_size))
    index = {tuple(ranks): b for b, ranks in enumerate(grid.tolist())}
    found = []
    for t, choice in enumerate(choices):
        b = index.get(choice.ranks)
        if (
            b is not None
            and t not in groups.linked
            and problem.allowed[t] == everywhere
            and problem.tables[t].options[choice.option].placement is not Placement.FIXED
        ):
            found.append((t, b))
    return found


def _repartition_ranks(
    problem: Problem, groups: _GroupIndex, choices: list[Choice], loads: Loads
) -> tuple[list[Choice], Loads] | None:
    return _repartition_once(problem, groups, choices, loads, _rank_grid(problem))


def _repartition_hosts(
    problem: Problem, groups: _GroupIndex, choices: list[Choice], loads: Loads
) -> tuple[list[Choice], Loads] | None:
    if problem.num_hosts < 2 or problem.local_world_size < 2:
        return None  # one host, or hosts of one rank: nothing the rank move does not do
    return _repartition_once(problem, groups, choices, loads, problem.host_grid)


def _repartition_once(
    problem: Problem,
    groups: _GroupIndex,
    choices: list[Choice],
    loads: Loads,
    grid: np.ndarray,
) -> tuple[list[Choice], Loads] | None:
    """Re-split the tables of the bin holding the most loaded rank and of one other bin
    between the two, trying every split (when they hold at most ``MAX_REPARTITION_ITEMS``):
    the best split that leaves every rank of both below the current max and within memory
    is kept. A bin is a rank (whole tables) or a host (table-row-wise tables, each shard
    on the same local rank wherever it goes). Subsumes swaps of several tables at once,
    which single swaps cannot chain."""
    peak = loads.objective
    bottleneck = int(np.argmax(loads.perf))
    width = grid.shape[1]
    home = bottleneck // width  # rows of the grid are consecutive ranks
    movable = _movable(problem, groups, choices, grid)
    by_bin: dict[int, list[int]] = {}
    for i, (_, b) in enumerate(movable):
        by_bin.setdefault(b, []).append(i)
    here = by_bin.get(home, [])
    if not here:
        return None
    # Per movable table, once: shard by shard its cost on each device class, HBM and DDR.
    costs = [problem.costs(problem.tables[t].options[choices[t].option]) for t, _ in movable]
    cost = np.array([c.cost for c in costs]).reshape(len(movable), width, -1)
    hbm = np.array([c.hbm for c in costs], dtype=np.int64).reshape(len(movable), width)
    ddr = np.array([c.ddr for c in costs], dtype=np.int64).reshape(len(movable), width)
    bin_load = loads.perf[grid].max(axis=1)
    others = sorted((b for b in range(len(grid)) if b != home), key=lambda b: (bin_load[b], b))
    for other in others:
        items = here + by_bin.get(other, [])
        if len(items) > MAX_REPARTITION_ITEMS:
            continue
        sides = (grid[home], grid[other])
        masks = (np.arange(1 << len(items))[:, None] >> np.arange(len(items))) & 1
        on = (masks, 1 - masks)  # split by split: the items in the home bin, in the other
        current = (np.arange(len(items)) < len(here)).astype(np.int64)  # ``here`` come first
        now = (current, 1 - current)
        new_perf, new_hbm, new_ddr = [], [], []
        fits = np.ones(len(masks), dtype=bool)
        for side, idx in enumerate(sides):
            # What each item puts on each rank of this bin: (items, ranks of the bin).
            c = cost[items][:, np.arange(width), problem.class_of_rank[idx]]
            h, d = hbm[items], ddr[items]
            new_perf.append(loads.perf[idx] - now[side] @ c + on[side] @ c)
            new_hbm.append(loads.hbm[idx] - now[side] @ h + on[side] @ h)
            new_ddr.append(loads.ddr[idx] - now[side] @ d + on[side] @ d)
            fits &= (new_hbm[side] <= problem.hbm_cap[idx]).all(axis=1)
            fits &= (new_ddr[side] <= problem.ddr_cap[idx]).all(axis=1)
        worst = np.where(fits, np.maximum(new_perf[0].max(axis=1), new_perf[1].max(axis=1)), np.inf)
        best = int(np.argmin(worst))
        if not worst[best] < peak * (1 - 1e-12):
            continue
        trial = list(choices)
        perf, hbm_after, ddr_after = loads.perf.copy(), loads.hbm.copy(), loads.ddr.copy()
        for side, idx in enumerate(sides):
            perf[idx] = new_perf[side][best]
            hbm_after[idx] = new_hbm[side][best]
            ddr_after[idx] = new_ddr[side][best]
        for i, item in enumerate(items):
            t = movable[item][0]
            ranks = sides[0] if masks[best, i] else sides[1]
            trial[t] = Choice(choices[t].option, tuple(int(r) for r in ranks))
        return trial, Loads(perf, hbm_after, ddr_after)
    return None


def _single_cost(problem: Problem, t: int, choice: Choice, rank: int) -> float:
    costs = problem.costs(problem.tables[t].options[choice.option])
    return float(costs.cost[0, problem.class_of_rank[rank]])


def _improve_once(
    problem: Problem, groups: _GroupIndex, choices: list[Choice], loads: Loads
) -> tuple[list[Choice], Loads] | None:
    peak = loads.objective
    at_peak = int((loads.perf >= peak * (1 - 1e-12)).sum())
    bottleneck = int(np.argmax(loads.perf))
    placed = {t: frozenset(choices[t].ranks) for t in groups.linked}  # all _GroupIndex reads
    on_bottleneck = [t for t, c in enumerate(choices) if bottleneck in c.ranks]
    contributions = {t: _contribution(problem, t, choices[t]) for t in on_bottleneck}
    on_bottleneck.sort(key=lambda t: (-float(contributions[t][0][bottleneck]), t))
    for t in on_bottleneck:
        old = contributions[t]
        state = _state_without(problem, loads, placed, t, old)
        best: _Candidate | None = None
        where = groups.where(problem, state, t)
        for index, option in enumerate(problem.tables[t].options):
            candidate = _try_option(problem, state, where, index, option, peak)
            if candidate is not None and (best is None or candidate.key < best.key):
                best = candidate
        if best is None or best.choice == choices[t]:
            continue
        new = _contribution(problem, t, best.choice)
        trial = Loads(state.perf + new[0], state.hbm + new[1], state.ddr + new[2])
        new_at_peak = int((trial.perf >= peak * (1 - 1e-12)).sum())
        if trial.objective < peak * (1 - 1e-12) or (
            trial.objective <= peak and new_at_peak < at_peak
        ):
            moved = list(choices)
            moved[t] = best.choice
            return moved, trial
    return None


def _contribution(
    problem: Problem, t: int, choice: Choice
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What one table's choice adds to each rank: (perf, hbm, ddr)."""
    costs = problem.costs(problem.tables[t].options[choice.option])
    idx = np.asarray(choice.ranks, dtype=np.int64)
    world = problem.world_size
    perf, hbm, ddr = np.zeros(world), np.zeros(world, np.int64), np.zeros(world, np.int64)
    np.add.at(perf, idx, costs.cost[np.arange(costs.num_shards), problem.class_of_rank[idx]])
    np.add.at(hbm, idx, costs.hbm)
    np.add.at(ddr, idx, costs.ddr)
    return perf, hbm, ddr


def _state_without(
    problem: Problem,
    loads: Loads,
    placed: dict[int, frozenset[int]],
    skip: int,
    contribution: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> _State:
    perf, hbm, ddr = contribution
    state = _State(loads.perf - perf, loads.hbm - hbm, loads.ddr - ddr)
    state.max_perf = float(state.perf.max())
    state.placed = {t: ranks for t, ranks in placed.items() if t != skip}
    state.free_hbm = problem.hbm_total - int(state.hbm.sum())
    state.free_bytes = state.free_hbm + problem.ddr_total - int(state.ddr.sum())
    return state
