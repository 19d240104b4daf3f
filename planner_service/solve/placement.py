"""Placing one table on the loads of the tables placed so far: the move that construction
(``construct.py``) and local search (``improve.py``) both make.

Every option of the table is placed tentatively: each free shard on the least-loaded rank
that can hold it, a host-local option on the best host (ties go to the least-loaded host),
an option fixed on every rank on every rank. Each placement gets a ``Score`` against a
target makespan; the lowest wins. Colocate groups follow the ranks of their first placed
member; separate groups avoid the ranks of theirs. Deterministic: every tie is broken by
index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from planner_service.costs.options import Placement, ShardingOption
from planner_service.plan.types import ShardingType
from planner_service.solve.problem import Choice, OptionCosts, Problem

# Up to this many candidate ranks, ``_place_free`` works in Python numbers: numpy's cost
# per call is most of the time on a few ranks (measured: 3.6 against 6.5 us on two ranks,
# 4.6 against 10.8 on eight, 9.7 against 6.4 on sixteen).
FEW_RANKS = 8


@dataclass
class State:
    """What the tables placed so far put on each rank, and where they are."""

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
class Where:
    """Where one table may go, given the tables placed so far: ``allowed`` ranks (sorted in
    ``ranks``) and, once a colocated table is placed, the rank set it must use exactly."""

    allowed: set[int]
    ranks: np.ndarray
    colocated: frozenset[int] | None


class Score(NamedTuple):
    """How good a tentative placement is; lower is better, compared field by field."""

    makespan: float  # the max load after it, or the target if that is higher
    work: float  # what it adds over all ranks
    peak_hbm: int  # the most HBM on a rank it touches, after it
    option: int  # the option's index: the earlier option wins a tie
    load_after: float  # the most loaded rank it touches, after it


@dataclass(frozen=True)
class Candidate:
    """An option of a table placed tentatively, and how good that is."""

    score: Score
    choice: Choice


class GroupIndex:
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
        self._unlinked: dict[tuple[int, ...], Where] = {}  # by allowed ranks

    def where(self, problem: Problem, state: State, t: int) -> Where:
        if t not in self.linked:  # where it may go never changes: built once per rank set
            found = self._unlinked.get(problem.allowed[t])
            if found is None:
                ranks = problem.allowed[t]
                found = Where(set(ranks), np.array(ranks, dtype=np.int64), None)
                self._unlinked[ranks] = found
            return found
        allowed = set(problem.allowed[t])
        for other in self.separate.get(t, ()):
            allowed -= state.placed.get(other, frozenset())
        colocated = next(
            (state.placed[other] for other in self.colocate.get(t, ()) if other in state.placed),
            None,
        )
        if colocated is not None:
            allowed &= colocated
        return Where(allowed, np.array(sorted(allowed), dtype=np.int64), colocated)


class FewRanks:
    """``try_option`` on a few ranks for the options it places most often there (one
    shard, placed freely), in Python numbers read once per table: the recreate move
    (``recreate.py``) tries every option of every table on two to four ranks, some 25,000
    times a second, and numpy's cost per call was most of its time. The same comparisons
    and sums in the same order as ``_place_free`` and ``_score_one``, so the same
    candidates."""

    def __init__(self, problem: Problem, state: State, ranks: np.ndarray) -> None:
        self.ranks = ranks.tolist()
        self.perf = state.perf[ranks].tolist()
        self.hbm = state.hbm[ranks].tolist()
        self.ddr = state.ddr[ranks].tolist()
        self.hbm_cap = problem.hbm_cap[ranks].tolist()
        self.ddr_cap = problem.ddr_cap[ranks].tolist()
        self.classes = problem.class_of_rank[ranks].tolist()

    @staticmethod
    def handles(option: ShardingOption, costs: OptionCosts) -> bool:
        """Whether ``try_option`` places this option as ``try_one`` does."""
        return (
            option.placement is Placement.PER_SHARD
            and option.sharding_type is not ShardingType.TABLE_ROW_WISE
            and option.sharding_type is not ShardingType.TABLE_COLUMN_WISE
            and costs.num_shards == 1
        )

    def try_one(
        self, state: State, costs: OptionCosts, index: int, makespan_target: float
    ) -> Candidate | None:
        """``try_option`` for an option that ``handles``, on these ranks with no colocate
        target (``state`` as when this was built)."""
        if _eats_reserve(state, costs):
            return None
        need_hbm, need_ddr, cost = costs.first_shard
        hbm, ddr, perf = self.hbm, self.ddr, self.perf
        hbm_cap, ddr_cap, classes = self.hbm_cap, self.ddr_cap, self.classes
        pick, least = -1, math.inf
        for j in range(len(perf)):
            if hbm[j] + need_hbm <= hbm_cap[j] and ddr[j] + need_ddr <= ddr_cap[j]:
                load = perf[j] + cost[classes[j]]
                if load < least:
                    pick, least = j, load
        if pick < 0:
            return None
        work = cost[classes[pick]]
        score = Score(
            max(state.max_perf, least, makespan_target),
            work,
            hbm[pick] + need_hbm,
            index,
            least,
        )
        return Candidate(score, Choice(index, (self.ranks[pick],)))


def try_option(
    problem: Problem,
    state: State,
    where: Where,
    index: int,
    option: ShardingOption,
    makespan_target: float,
) -> Candidate | None:
    """Option ``index`` of a table placed where it scores best, or None where it fits
    nowhere (without eating into what the tables still to place need)."""
    costs = problem.costs(option)
    allowed, colocated = where.allowed, where.colocated
    if option.placement is Placement.FIXED:
        everywhere = len(allowed) == problem.world_size
        if not everywhere or (colocated is not None and len(colocated) != problem.world_size):
            return None
        return _on_every_rank(problem, state, costs, index, makespan_target)
    if option.sharding_type is ShardingType.TABLE_ROW_WISE:
        return _best_host(problem, state, costs, index, makespan_target, allowed, colocated)
    if option.sharding_type is ShardingType.TABLE_COLUMN_WISE:
        if colocated is None and len(allowed) == problem.world_size:
            return _best_host_columns(problem, state, costs, index, makespan_target)
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
        score = _score(problem, state, costs, ranks, index, makespan_target)
        if score is not None and (
            best is None or _between_hosts(score) < _between_hosts(best.score)
        ):
            best = Candidate(score, Choice(index, ranks))
    return best


def _on_every_rank(
    problem: Problem, state: State, costs: OptionCosts, index: int, target: float
) -> Candidate | None:
    """An option fixed on every rank (shard ``r`` on rank ``r``): ``_score`` without
    gathering ranks."""
    if _eats_reserve(state, costs):
        return None
    assert costs.fixed_cost is not None
    new_hbm = state.hbm + costs.hbm
    if (new_hbm > problem.hbm_cap).any() or (state.ddr + costs.ddr > problem.ddr_cap).any():
        return None
    load_after = float((state.perf + costs.fixed_cost).max())
    score = Score(
        max(state.max_perf, load_after, target),
        float(costs.fixed_cost.sum()),
        int(new_hbm.max()),
        index,
        load_after,
    )
    return Candidate(score, Choice(index, problem.every_rank))


def _best_host(
    problem: Problem,
    state: State,
    costs: OptionCosts,
    index: int,
    target: float,
    allowed: set[int],
    colocated: frozenset[int] | None,
) -> Candidate | None:
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
    shard_cost = costs.local_on_hosts(problem)
    shape = grid.shape  # per-rank arrays seen as host x local rank (views, no copies)
    hbm = state.hbm.reshape(shape) + costs.hbm
    usable &= (hbm <= problem.hbm_cap.reshape(shape)).all(axis=1)
    usable &= (state.ddr.reshape(shape) + costs.ddr <= problem.ddr_cap.reshape(shape)).all(axis=1)
    if not usable.any():
        return None
    load_after = (state.perf.reshape(shape) + shard_cost).max(axis=1)
    floor = np.maximum(np.maximum(load_after, state.max_perf), target)
    work = costs.local_work_on_hosts(problem)
    peak_hbm = hbm.max(axis=1)
    h = _first_least((floor, work, load_after, peak_hbm), np.flatnonzero(usable))
    score = Score(float(floor[h]), float(work[h]), int(peak_hbm[h]), index, float(load_after[h]))
    return Candidate(score, Choice(index, tuple(int(r) for r in grid[h])))


def _best_host_columns(
    problem: Problem, state: State, costs: OptionCosts, index: int, target: float
) -> Candidate | None:
    """A table-column-wise option on its best host, every host at once: on each host, each
    shard in turn goes to the rank with the lowest resulting load that can hold it (as
    ``_place_free`` does on one host), then hosts compare by ``_between_hosts``, ties to
    the lower host."""
    if _eats_reserve(state, costs):
        return None
    grid = problem.host_grid
    hosts = np.arange(len(grid))
    perf, hbm, ddr = (a.reshape(grid.shape).copy() for a in (state.perf, state.hbm, state.ddr))
    hbm_cap, ddr_cap = problem.hbm_cap.reshape(grid.shape), problem.ddr_cap.reshape(grid.shape)
    shard_costs = costs.on_hosts(problem)
    usable = np.ones(len(grid), dtype=bool)
    touched = np.zeros(grid.shape, dtype=bool)
    picks = np.empty((len(grid), costs.num_shards), dtype=np.int64)
    work = np.zeros(len(grid))
    for s in range(costs.num_shards):
        fits = (hbm + costs.hbm[s] <= hbm_cap) & (ddr + costs.ddr[s] <= ddr_cap)
        usable &= fits.any(axis=1)
        new_load = np.where(fits, perf + shard_costs[s], np.inf)
        pick = new_load.argmin(axis=1)
        picks[:, s] = pick
        work += shard_costs[s][hosts, pick]
        perf[hosts, pick] = new_load[hosts, pick]
        hbm[hosts, pick] += costs.hbm[s]
        ddr[hosts, pick] += costs.ddr[s]
        touched[hosts, pick] = True
    if not usable.any():
        return None
    load_after = np.where(touched, perf, -np.inf).max(axis=1)
    peak_hbm = np.where(touched, hbm, np.iinfo(np.int64).min).max(axis=1)
    makespan = np.maximum(np.maximum(load_after, state.max_perf), target)
    h = _first_least((makespan, work, load_after, peak_hbm), np.flatnonzero(usable))
    score = Score(float(makespan[h]), float(work[h]), int(peak_hbm[h]), index, float(load_after[h]))
    return Candidate(score, Choice(index, tuple(int(r) for r in grid[h, picks[h]])))


def _first_least(keys: tuple[np.ndarray, ...], candidates: np.ndarray) -> int:
    """The candidate (an index into each key, ascending) with the least keys compared in
    order, the first one on a tie: lexicographic, narrowed key by key."""
    for key in keys:
        values = key[candidates]
        candidates = candidates[values == values.min()]
        if len(candidates) == 1:
            break
    return int(candidates[0])


def _between_hosts(score: Score) -> tuple[float, float, float, int]:
    """How one option's placements on different hosts compare: as between ranks in
    ``_place_free``, the least loaded after the move wins once the target and the work tie
    (not the least HBM, which would stack tables on one host while all are under the
    target)."""
    return score.makespan, score.work, score.load_after, score.peak_hbm


def _place_free(
    problem: Problem,
    state: State,
    costs: OptionCosts,
    candidates: np.ndarray,
    target: frozenset[int] | None,
) -> tuple[int, ...] | None:
    """Each shard to the allowed rank (of ``candidates``, sorted) with the lowest resulting
    load that can hold it; with a colocate target, every target rank must receive a shard."""
    if not len(candidates):
        return None
    if len(candidates) <= FEW_RANKS:
        return _place_few(problem, state, costs, candidates, target)
    if len(candidates) == problem.world_size and target is None:
        # Every rank, in rank order: per-rank arrays as they are (copied only when a
        # later shard must see an earlier one), the option's per-rank costs kept.
        copy = costs.num_shards > 1
        perf, hbm, ddr = (a.copy() if copy else a for a in (state.perf, state.hbm, state.ddr))
        hbm_cap, ddr_cap = problem.hbm_cap, problem.ddr_cap
        shard_costs = costs.on_ranks(problem)
    else:
        perf = state.perf[candidates]
        hbm = state.hbm[candidates]
        ddr = state.ddr[candidates]
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
        pick = int(new_load.argmin())
        ranks.append(int(candidates[pick]))
        if s + 1 < costs.num_shards:  # the next shard sees this one
            perf[pick] = new_load[pick]
            hbm[pick] += costs.hbm[s]
            ddr[pick] += costs.ddr[s]
            if uncovered is not None:
                uncovered[pick] = False
    return tuple(ranks)


def _place_few(
    problem: Problem,
    state: State,
    costs: OptionCosts,
    candidates: np.ndarray,
    target: frozenset[int] | None,
) -> tuple[int, ...] | None:
    """``_place_free`` on a few ranks, in Python numbers: numpy's cost per call is most of
    the time on two to four ranks (the local search's recreate move, ``recreate.py``).
    The same sums in the same order, and ties to the first rank, so the same picks."""
    ranks = candidates.tolist()
    perf = state.perf[candidates].tolist()
    hbm = state.hbm[candidates].tolist()
    ddr = state.ddr[candidates].tolist()
    hbm_cap = problem.hbm_cap[candidates].tolist()
    ddr_cap = problem.ddr_cap[candidates].tolist()
    shard_costs = costs.cost[:, problem.class_of_rank[candidates]].tolist()
    shard_hbm, shard_ddr = costs.hbm.tolist(), costs.ddr.tolist()
    uncovered = [True] * len(ranks) if target is not None else None
    shards = costs.num_shards
    picked = []
    for s in range(shards):
        need_hbm, need_ddr, cost = shard_hbm[s], shard_ddr[s], shard_costs[s]
        cover = uncovered is not None and sum(uncovered) >= shards - s
        pick, least = -1, math.inf
        for j in range(len(ranks)):
            if (
                hbm[j] + need_hbm <= hbm_cap[j]
                and ddr[j] + need_ddr <= ddr_cap[j]
                and not (cover and uncovered is not None and not uncovered[j])
            ):
                load = perf[j] + cost[j]
                if load < least:
                    pick, least = j, load
        if pick < 0:
            return None
        picked.append(ranks[pick])
        perf[pick] = least
        hbm[pick] += need_hbm
        ddr[pick] += need_ddr
        if uncovered is not None:
            uncovered[pick] = False
    return tuple(picked)


def _score(
    problem: Problem,
    state: State,
    costs: OptionCosts,
    ranks: tuple[int, ...],
    index: int,
    target: float,
) -> Score | None:
    """The placement's ``Score``, or None if it overflows a rank or eats into what the
    tables still to place need."""
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
    return Score(
        max(new_max, target), float(shard_cost.sum()), int(new_hbm.max()), index, load_after
    )


def _eats_reserve(state: State, costs: OptionCosts) -> bool:
    """Whether the option would leave less memory than the tables still to place need."""
    return state.free_hbm - costs.hbm_total < state.reserve_hbm or (
        state.free_bytes - costs.hbm_total - costs.ddr_total < state.reserve_bytes
    )


def _score_one(
    problem: Problem, state: State, costs: OptionCosts, rank: int, index: int, target: float
) -> Score | None:
    """``_score`` for a single shard, without arrays."""
    new_hbm = int(state.hbm[rank]) + int(costs.hbm[0])
    if (
        new_hbm > problem.hbm_cap[rank]
        or int(state.ddr[rank]) + int(costs.ddr[0]) > (problem.ddr_cap[rank])
    ):
        return None
    cost = float(costs.cost[0, problem.class_of_rank[rank]])
    load_after = float(state.perf[rank]) + cost
    return Score(max(state.max_perf, load_after, target), cost, new_hbm, index, load_after)
