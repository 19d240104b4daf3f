"""Ruin and recreate on a few ranks: the local search move for plans whose memory binds
(``improve.py`` tries it first on plans using ``TIGHT_HBM_SHARE`` of all HBM).

When memory is tight, the slowest rank is slow because it holds time-heavy tables (a
whole table read by many ids, half of a column split) and small ones besides, while the
ranks with time to spare are full of memory-heavy tables. Moving one table cannot fix
that: the small tables need room on the light ranks, and making room means giving a
memory-heavy table there another option (a column split, a cache) and putting part of it
where the small tables were. This move does it all at once on a small neighbourhood: the
slowest rank, the other ranks of its split tables, and partners (``_partners``: the least
loaded ranks, the roomiest, a pair of hosts). Every table lying wholly on those ranks is
taken out and placed again on them from scratch, each with its best option and
placement as the construction would (``placement.try_option``, against the ranks'
average load as target, keeping the least memory the tables after it need), in several
orders and two ways of choosing (least work, or least HBM within the target). The best
placement is kept when the ranks' slowest ends below the plan's peak, or it leaves fewer
ranks at the peak. Options fixed on every rank, pinned and linked tables stay where they
are. Deterministic (the shuffled orders are seeded by the ranks).

On 5,384 distinct memory-tight tables over 1,024 ranks (``docs/benchmarks.md``) the
local search now reaches a 12% gap in 60 s where it stopped at 24%: its one-table moves
found no room, and each of their rounds took a tenth of a second.
"""

from __future__ import annotations

import random

import numpy as np

from planner_service.costs.options import Placement
from planner_service.plan.types import ShardingType
from planner_service.solve.placement import (
    Candidate,
    FewRanks,
    GroupIndex,
    State,
    Where,
    try_option,
)
from planner_service.solve.problem import Choice, Loads, Problem, add_choice

SHUFFLED_ORDERS = 6  # random orders tried after the three fixed ones
MAX_SHUFFLED_RANKS = 4  # on more ranks (a pair of hosts), the fixed orders only
MAX_SHUFFLED_TABLES = 24  # and on more tables
MAX_LINKED_RANKS = 6  # the slowest rank's split tables' other ranks, brought along
PARTNER_RANKS = 3  # the least loaded ranks tried, each alone, as the slowest rank's partner
# Loads within this relative distance of the peak count as at the peak (as in improve.py).
PEAK_TOLERANCE = 1e-12


class RankIndex:
    """Which tables may be taken out and placed again on a few ranks (not fixed on every
    rank, not pinned, in no colocate or separate group), by the ranks their shards lie on.
    Kept in step with the plan by ``sync``, which looks only at the choices that changed
    (every move builds a new list, keeping the ``Choice`` objects of tables it left
    alone): rebuilding it per move took a fifth of the move's time at 5,384 tables."""

    def __init__(self, problem: Problem, groups: GroupIndex) -> None:
        self.problem = problem
        everywhere = problem.every_rank
        self.candidates = [
            t
            for t in range(len(problem.tables))
            if t not in groups.linked and problem.allowed[t] == everywhere
        ]
        self.choices: list[Choice | None] = [None] * len(problem.tables)
        self.on_rank: dict[int, set[int]] = {}

    def sync(self, choices: list[Choice]) -> None:
        mine = self.choices
        for t in [t for t in self.candidates if choices[t] is not mine[t]]:
            choice, old = choices[t], mine[t]
            if old is not None and self._movable(t, old):
                for r in old.ranks:
                    self.on_rank[r].discard(t)
            if self._movable(t, choice):
                for r in choice.ranks:
                    self.on_rank.setdefault(r, set()).add(t)
            self.choices[t] = choice

    def _movable(self, t: int, choice: Choice) -> bool:
        option = self.problem.tables[t].options[choice.option]
        return option.placement is not Placement.FIXED

    def within(self, ranks: frozenset[int]) -> list[int]:
        """The movable tables whose every shard is on ``ranks``, in table order."""
        found: set[int] = set()
        for r in ranks:
            found |= self.on_rank.get(r, set())
        return sorted(t for t in found if ranks.issuperset(self._ranks(t)))

    def linked(self, rank: int) -> set[int]:
        """The other ranks of the movable tables with a shard on ``rank``."""
        found: set[int] = set()
        for t in self.on_rank.get(rank, set()):
            found.update(self._ranks(t))
        found.discard(rank)
        return found

    def _ranks(self, t: int) -> tuple[int, ...]:
        choice = self.choices[t]
        return choice.ranks if choice is not None else ()


def recreate_once(
    problem: Problem, index: RankIndex, choices: list[Choice], loads: Loads
) -> tuple[list[Choice], Loads] | None:
    """The move on the slowest rank with each of its partners in turn (``_partners``):
    the first that lowers the peak, or the number of ranks at it."""
    if problem.world_size < 2:
        return None
    index.sync(choices)
    peak = loads.objective
    at_peak = _at_peak(loads.perf, peak)
    bottleneck = int(np.argmax(loads.perf))
    # The ranks holding the other shards of the slowest rank's split tables come along,
    # so that those tables can move too (a column-wise pair, a rank's half of it).
    linked = index.linked(bottleneck)
    if len(linked) > MAX_LINKED_RANKS:
        linked = set()
    sets = [
        {bottleneck, *extra, *partners}
        for partners in _partners(problem, loads, bottleneck)
        for extra in ([set(), linked] if linked else [set()])
    ]
    for i, rank_set in enumerate(sets):
        if rank_set in sets[:i]:
            continue
        ranks = np.array(sorted(rank_set), dtype=np.int64)
        tables = index.within(frozenset(rank_set))
        found = _recreate(problem, choices, loads, tables, ranks, first_found=at_peak > 1)
        if found is None:
            continue
        placed, after = found
        if _below_peak(after.objective, peak) or (
            after.objective <= peak and _at_peak(after.perf, peak) < at_peak
        ):
            moved = list(choices)
            for t, choice in placed.items():
                moved[t] = choice
            return moved, after
    return None


def _partners(problem: Problem, loads: Loads, bottleneck: int) -> list[list[int]]:
    """The rank sets tried with the slowest rank: each of the ``PARTNER_RANKS`` least
    loaded ranks alone, the rank with the most free HBM alone, the two least loaded
    together, the least loaded with the roomiest; then the slowest rank's host with the
    least loaded other host."""
    order = np.lexsort((np.arange(problem.world_size), loads.perf))
    light = [int(r) for r in order[: PARTNER_RANKS + 1] if r != bottleneck][:PARTNER_RANKS]
    free = problem.hbm_cap - loads.hbm
    roomy = next(int(r) for r in np.lexsort((np.arange(problem.world_size), -free)))
    # The most free HBM among the ranks below the mean load: room that time also allows.
    below = np.flatnonzero(loads.perf <= loads.perf.mean())
    spare = int(below[np.lexsort((below, -free[below]))[0]]) if len(below) else roomy
    sets = [[r] for r in light]
    for extra in (roomy, spare):
        if extra != bottleneck and [extra] not in sets:
            sets.append([extra])
    if len(light) > 1:
        sets.append(light[:2])
    for extra in (roomy, spare):
        if light and extra not in (bottleneck, light[0]):
            sets.append([light[0], extra])
    if problem.num_hosts > 1:
        grid = problem.host_grid
        home = bottleneck // problem.local_world_size
        host_peak = loads.perf[grid].max(axis=1)
        other = min((h for h in range(len(grid)) if h != home), key=lambda h: (host_peak[h], h))
        sets.append([int(r) for r in grid[[home, other]].ravel()])
    return [s for i, s in enumerate(sets) if s not in sets[:i]]


def _recreate(
    problem: Problem,
    choices: list[Choice],
    loads: Loads,
    tables: list[int],
    ranks: np.ndarray,
    first_found: bool = False,
) -> tuple[dict[int, Choice], Loads] | None:
    """``tables`` (all on ``ranks``) taken out and placed again on ``ranks`` in each of
    the ``_orders``: the placement whose slowest rank of ``ranks`` is the least, or None
    when none places them all. With ``first_found`` (other ranks are at the peak too, so
    the move cannot lower it, only the count at it), the first placement that lowers the
    slowest of ``ranks``: on 5,384 memory-tight tables of repeated shapes, 242 ranks sat
    at the peak, and taking the first such placement got through them within the default
    10 s (a 17.5% gap instead of 30.9%); on distinct shapes at 60 s it ended at 12.0% and
    13.3% in two runs, where the best placement ended at 11.9%."""
    if not tables:
        return None
    perf, hbm, ddr = loads.perf.copy(), loads.hbm.copy(), loads.ddr.copy()
    for t in tables:
        option = problem.tables[t].options[choices[t].option]
        costs = problem.costs(option)
        idx = np.asarray(choices[t].ranks, dtype=np.int64)
        np.subtract.at(
            perf, idx, costs.cost[np.arange(costs.num_shards), problem.class_of_rank[idx]]
        )
        np.subtract.at(hbm, idx, costs.hbm)
        np.subtract.at(ddr, idx, costs.ddr)
    empty = Loads(perf, hbm, ddr)
    least = {t: _least(problem, t) for t in tables}
    best: tuple[float, dict[int, Choice], Loads] | None = None
    cutoff = float(loads.perf[ranks].max())  # a placement above it is no move
    for order in _orders(problem, empty, tables, ranks, least):
        for memory_first in (False, True):
            found = _place_all(problem, empty, order, ranks, least, cutoff, memory_first)
            if found is None:
                continue
            local = float(found[1].perf[ranks].max())
            if best is None or local < best[0]:
                best = (local, *found)
                cutoff = local
            if first_found and _below_peak(local, float(loads.perf[ranks].max())):
                return best[1], best[2]
    return None if best is None else (best[1], best[2])


def _orders(
    problem: Problem,
    empty: Loads,
    tables: list[int],
    ranks: np.ndarray,
    least: dict[int, tuple[int, int, float]],
) -> list[list[int]]:
    """The orders tables are placed in: biggest first (the larger of a table's share of a
    rank's time at the target and of a rank's HBM, as the construction orders them); the
    most work first; the least HBM first. Memory decides which fits: biggest first packs
    the tables that need most room while it is there, but can take a heavy table's
    fastest option on the rank that small, time-heavy tables needed; least HBM first
    places those where time is free and leaves the rest of the room to the heavy one."""
    target = _target(empty, ranks, least)
    hbm_cap = float(problem.hbm_cap[ranks].max()) or 1.0

    def name(t: int) -> str:
        return problem.tables[t].table.name

    def share(t: int) -> float:
        return max(least[t][2] / target if target > 0 else 0.0, least[t][0] / hbm_cap)

    orders = [
        sorted(tables, key=lambda t: (-share(t), name(t))),
        sorted(tables, key=lambda t: (-least[t][2], name(t))),
        sorted(tables, key=lambda t: (least[t][0], -least[t][2], name(t))),
    ]
    # Then shuffles of the last, seeded by the ranks (deterministic): which of two tables
    # alike goes first can decide whether the second still finds room.
    rng = random.Random(int(ranks.sum()) * 7919 + len(tables))
    few = len(ranks) <= MAX_SHUFFLED_RANKS and len(tables) <= MAX_SHUFFLED_TABLES
    for _ in range(SHUFFLED_ORDERS if few else 0):
        shuffled = list(orders[2])
        rng.shuffle(shuffled)
        orders.append(shuffled)
    return [order for i, order in enumerate(orders) if order not in orders[:i]]


def _target(empty: Loads, ranks: np.ndarray, least: dict[int, tuple[int, int, float]]) -> float:
    """The ranks' average load once every table is back with its least work."""
    return (float(empty.perf[ranks].sum()) + sum(w for _, _, w in least.values())) / len(ranks)


def _place_all(
    problem: Problem,
    empty: Loads,
    order: list[int],
    ranks: np.ndarray,
    least: dict[int, tuple[int, int, float]],
    cutoff: float,
    memory_first: bool = False,
) -> tuple[dict[int, Choice], Loads] | None:
    """The tables of ``order`` placed one by one on ``ranks`` (each with its best option
    and placement against the ranks' average as target, keeping the least memory the
    tables after it need); None when one fits nowhere, or once a rank's load passes
    ``cutoff`` (the best found so far: what follows can only add to it). Best is
    ``Score``'s (the least work among placements within the target), or with
    ``memory_first`` the least HBM
    among those: room kept for the tables after it, where time allows."""
    state = State(empty.perf.copy(), empty.hbm.copy(), empty.ddr.copy())
    state.max_perf = float(state.perf[ranks].max())
    state.free_hbm = int((problem.hbm_cap[ranks] - state.hbm[ranks]).sum())
    state.free_bytes = state.free_hbm + int((problem.ddr_cap[ranks] - state.ddr[ranks]).sum())
    state.reserve_hbm = sum(h for h, _, _ in least.values())
    state.reserve_bytes = sum(b for _, b, _ in least.values())
    target = _target(empty, ranks, least)
    where = Where(set(ranks.tolist()), ranks, None)
    # A table-row-wise option needs a whole host: none unless ``ranks`` hold one.
    whole_host = len(ranks) >= problem.local_world_size and bool(
        np.isin(problem.host_grid, ranks).all(axis=1).any()
    )
    placed: dict[int, Choice] = {}
    for t in order:
        state.reserve_hbm -= least[t][0]
        state.reserve_bytes -= least[t][1]
        best: Candidate | None = None
        best_key: tuple[float, ...] | None = None
        few = FewRanks(problem, state, ranks)
        for i, option in enumerate(problem.tables[t].options):
            if option.placement is Placement.FIXED or (
                option.sharding_type is ShardingType.TABLE_ROW_WISE and not whole_host
            ):
                continue
            costs = problem.costs(option)
            candidate = (
                few.try_one(state, costs, i, target)
                if FewRanks.handles(option, costs)
                else try_option(problem, state, where, i, option, target)
            )
            if candidate is None:
                continue
            key: tuple[float, ...] = candidate.score
            if memory_first:
                within = candidate.score.makespan <= target
                hbm = float(problem.costs(option).hbm_total) if within else 0.0
                key = (0.0 if within else 1.0, hbm, *candidate.score)
            if best_key is None or key < best_key:
                best, best_key = candidate, key
        if best is None:
            return None
        option = problem.tables[t].options[best.choice.option]
        add_choice(problem, option, best.choice.ranks, state.perf, state.hbm, state.ddr)
        costs = problem.costs(option)
        state.max_perf = max(state.max_perf, float(state.perf[list(best.choice.ranks)].max()))
        if state.max_perf > cutoff:
            return None
        state.free_hbm -= costs.hbm_total
        state.free_bytes -= costs.hbm_total + costs.ddr_total
        placed[t] = best.choice
    return placed, Loads(state.perf, state.hbm, state.ddr)


def _least(problem: Problem, t: int) -> tuple[int, int, float]:
    """Of a table's options that can be placed within a few hosts: the least HBM, the
    least HBM + DDR and the least work."""
    costs = [
        problem.costs(option)
        for option in problem.tables[t].options
        if option.placement is not Placement.FIXED
    ]
    return (
        min(c.hbm_total for c in costs),
        min(c.hbm_total + c.ddr_total for c in costs),
        min(c.work for c in costs),
    )


def _below_peak(load: float, peak: float) -> bool:
    return bool(load < peak * (1 - PEAK_TOLERANCE))


def _at_peak(perf: np.ndarray, peak: float) -> int:
    return int((perf >= peak * (1 - PEAK_TOLERANCE)).sum())
