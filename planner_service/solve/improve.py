"""Local search: moves on the most loaded rank of a plan, from the constructed warm start
(``construct.py``) until no move helps.

Re-insertion takes each table with a shard on that rank out and puts it back with its best
option and placement (``placement.try_option``, against the current max as target); swaps
and repartitions exchange whole tables between that rank (or its host) and another; where
memory binds, recreating takes every table off that rank and a few partners and places
them all again (``recreate.py``). A move is kept if the max drops, or stays and fewer ranks
sit at it. Deterministic.
"""

from __future__ import annotations

import numpy as np

from planner_service.costs.options import Placement
from planner_service.solve.deadline import Deadline
from planner_service.solve.placement import Candidate, GroupIndex, State, try_option
from planner_service.solve.problem import Choice, Loads, Problem, add_choice, loads_of
from planner_service.solve.recreate import RankIndex, recreate_once

MAX_IMPROVEMENT_ROUNDS = 200  # and MOVES_PER_RANK per rank: a move fixes one rank of many
# at the peak, and where memory binds a rank takes several. On 5,384 memory-tight tables of
# distinct shapes on 1,024 ranks with a 120 s limit, one move per rank stopped the search
# at 84 s, 11.1% over the bound; with four it ends at 9.7% at 110 s.
MOVES_PER_RANK = 4
# Plans using this share of all HBM (of all DDR on cpu, where tables live) try recreating a
# few ranks (``recreate.py``) before the one-table moves: where memory binds, those rarely
# find room, and on 5,384 tables over 1,024 ranks each of their rounds costs a tenth of a
# second to the recreate's few ms.
TIGHT_HBM_SHARE = 0.8
WIDE_CHOICE_RANKS = 64  # choices on this many ranks keep their contributions
MAX_REPARTITION_ITEMS = 12  # 2^12 splits of two bins' tables, checked at once
# Loads within this relative distance of the peak count as at the peak: sums of the same
# costs in another order differ in their last bits.
PEAK_TOLERANCE = 1e-12


def improve(
    problem: Problem, choices: list[Choice], deadline: Deadline | None = None
) -> list[Choice]:
    """Local search on the most loaded rank. Re-insertion: take each table with a shard
    there, remove it, and put it back with its best option and placement (as the greedy
    would, against the current max as target). Swap: exchange a whole single-shard table
    there with a cheaper one elsewhere. Repartition: re-split the whole single-shard tables
    of that rank and another between the two; then the table-row-wise tables of its host
    and another host. On plans using ``TIGHT_HBM_SHARE`` of all HBM, recreating that rank
    and a few partners comes first (``recreate.recreate_once``). Last, re-insertion that
    keeps its ranks below the peak at the least work, not the least work within it; once
    it has moved a table, it comes first until it fails. A move is kept if the max
    drops, or stays and fewer ranks sit at it. Deterministic; stops at a local optimum,
    after ``MAX_IMPROVEMENT_ROUNDS`` moves plus ``MOVES_PER_RANK`` per rank, or at the
    deadline."""
    deadline = deadline or Deadline.never()
    current = list(choices)
    loads = loads_of(problem, current)
    groups = GroupIndex(problem)
    index = RankIndex(problem, groups)
    wide = _WideContributions(problem)
    tables_on = _TablesOnRanks(problem)
    below_first = False  # the last move kept its rank below the peak at more work

    def below() -> tuple[list[Choice], Loads] | None:
        return _improve_once(problem, groups, current, loads, wide, tables_on, below_only=True)

    for _ in range(MAX_IMPROVEMENT_ROUNDS + MOVES_PER_RANK * problem.world_size):
        if deadline.expired():
            break
        moved = below() if below_first else None
        if moved is None:
            moved = (
                (
                    recreate_once(problem, index, current, loads)
                    if _memory_binds(problem, loads)
                    else None
                )
                or _improve_once(problem, groups, current, loads, wide, tables_on)
                or _swap_once(problem, groups, current, loads)
                or _repartition_ranks(problem, groups, current, loads)
                or _repartition_hosts(problem, groups, current, loads)
            )
            # The move of last resort: taken, it is tried first while it goes on working
            # (hundreds of ranks at one peak, each needing it: the other moves' fruitless
            # scans took a second a round on 4,096 ranks).
            if moved is None and not below_first:
                moved = below()
                below_first = moved is not None
            else:
                below_first = False
        if moved is None:
            break
        current, loads = moved
    return current


def _memory_binds(problem: Problem, loads: Loads) -> bool:
    """Whether the plan uses ``TIGHT_HBM_SHARE`` of the memory tables live in: all HBM,
    or all DDR where ranks have no HBM (cpu)."""
    if problem.hbm_total > 0:
        return int(loads.hbm.sum()) >= TIGHT_HBM_SHARE * problem.hbm_total
    return problem.ddr_total > 0 and int(loads.ddr.sum()) >= TIGHT_HBM_SHARE * problem.ddr_total


def _improve_once(
    problem: Problem,
    groups: GroupIndex,
    choices: list[Choice],
    loads: Loads,
    wide: _WideContributions | None = None,
    tables_on: _TablesOnRanks | None = None,
    *,
    below_only: bool = False,
) -> tuple[list[Choice], Loads] | None:
    """Re-insertion: the first table on the most loaded rank (dearest there first) that,
    taken out and put back with its best option and placement, lowers the max, or the
    number of ranks at it. Best is least work among placements within the peak; with
    ``below_only`` (the last move tried), least work among placements that keep their
    ranks below the peak: a move that costs more work but takes its rank off the peak
    (205 ranks sat at a 45M-row table-wise table plus seven row-wise shares, 10,000 tables
    on 4,096 ranks at 27.7% over the bound, while a table-row-wise split of it fitted below
    the peak on 329 hosts)."""
    peak = loads.objective
    at_peak = _at_peak(loads.perf, peak)
    bottleneck = int(np.argmax(loads.perf))
    placed = {t: frozenset(choices[t].ranks) for t in groups.linked}  # all GroupIndex reads
    tables_on = tables_on or _TablesOnRanks(problem)
    tables_on.sync(choices)
    on_bottleneck = tables_on.on(bottleneck)
    wide = wide or _WideContributions(problem)
    contributions = {t: wide.of(t, choices[t]) for t in on_bottleneck}
    on_bottleneck.sort(key=lambda t: (-float(contributions[t].perf[bottleneck]), t))
    for t in on_bottleneck:
        old = contributions[t]
        state = _state_without(problem, loads, placed, t, old)
        best: Candidate | None = None
        where = groups.where(problem, state, t)
        for index, option in enumerate(problem.tables[t].options):
            candidate = try_option(problem, state, where, index, option, peak)
            if candidate is None or (
                below_only and not _below_peak(candidate.score.load_after, peak)
            ):
                continue
            if best is None or candidate.score < best.score:
                best = candidate
        if best is None or best.choice == choices[t]:
            continue
        new = _contribution(problem, t, best.choice)
        trial = Loads(state.perf + new.perf, state.hbm + new.hbm, state.ddr + new.ddr)
        if _below_peak(trial.objective, peak) or (
            trial.objective <= peak and _at_peak(trial.perf, peak) < at_peak
        ):
            moved = list(choices)
            moved[t] = best.choice
            return moved, trial
    return None


class _WideContributions:
    """``_contribution`` of the choices with shards on many ranks (row-wise, data-parallel),
    kept while their choice stays: each lies on every bottleneck, and building their
    per-rank arrays again every round took 8.3 of 10 s (10,000 tables on 4,096 ranks:
    about 500 such tables, 0.1 MB each kept)."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.kept: dict[int, tuple[Choice, Loads]] = {}

    def of(self, t: int, choice: Choice) -> Loads:
        if len(choice.ranks) < WIDE_CHOICE_RANKS:
            return _contribution(self.problem, t, choice)
        kept = self.kept.get(t)
        if kept is None or kept[0] is not choice:
            kept = self.kept[t] = (choice, _contribution(self.problem, t, choice))
        return kept[1]


class _TablesOnRanks:
    """The tables with a shard on each rank, kept in step with the plan by ``sync`` (which
    looks only at choices that changed, as ``recreate.RankIndex``); choices on many ranks
    as a mask each. Scanning every choice's ranks for the bottleneck took 12 ms a round on
    10,000 tables over 4,096 ranks, 70% of the local search's time."""

    def __init__(self, problem: Problem) -> None:
        self.world_size = problem.world_size
        self.choices: list[Choice | None] = [None] * len(problem.tables)
        self.narrow: dict[int, set[int]] = {}
        self.wide: dict[int, np.ndarray] = {}

    def sync(self, choices: list[Choice]) -> None:
        for t, choice in enumerate(choices):
            old = self.choices[t]
            if old is choice:
                continue
            if old is not None and len(old.ranks) < WIDE_CHOICE_RANKS:
                for r in old.ranks:
                    self.narrow[r].discard(t)
            self.wide.pop(t, None)
            if len(choice.ranks) < WIDE_CHOICE_RANKS:
                for r in choice.ranks:
                    self.narrow.setdefault(r, set()).add(t)
            else:
                mask = np.zeros(self.world_size, dtype=bool)
                mask[list(choice.ranks)] = True
                self.wide[t] = mask
            self.choices[t] = choice

    def on(self, rank: int) -> list[int]:
        """The tables with a shard on ``rank``, in table order."""
        found = set(self.narrow.get(rank, ()))
        found.update(t for t, mask in self.wide.items() if mask[rank])
        return sorted(found)


def _contribution(problem: Problem, t: int, choice: Choice) -> Loads:
    """What one table's choice adds to each rank."""
    added = Loads.zeros(problem.world_size)
    option = problem.tables[t].options[choice.option]
    add_choice(problem, option, choice.ranks, added.perf, added.hbm, added.ddr)
    return added


def _state_without(
    problem: Problem,
    loads: Loads,
    placed: dict[int, frozenset[int]],
    skip: int,
    contribution: Loads,
) -> State:
    """The state of ``loads`` without table ``skip`` (which adds ``contribution``)."""
    state = State(
        loads.perf - contribution.perf, loads.hbm - contribution.hbm, loads.ddr - contribution.ddr
    )
    state.max_perf = float(state.perf.max())
    state.placed = {t: ranks for t, ranks in placed.items() if t != skip}
    state.free_hbm = problem.hbm_total - int(state.hbm.sum())
    state.free_bytes = state.free_hbm + problem.ddr_total - int(state.ddr.sum())
    return state


def _swap_once(
    problem: Problem, groups: GroupIndex, choices: list[Choice], loads: Loads
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
            if not _below_peak(max(new_here, new_other), peak):
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
            if _below_peak(new.objective, peak) or (
                _at_peak(new.perf, peak) < _at_peak(loads.perf, peak)
            ):
                trial = list(choices)
                trial[a] = Choice(choices[a].option, (other,))
                trial[b] = Choice(choices[b].option, (bottleneck,))
                return trial, new
    return None


def _single_cost(problem: Problem, t: int, choice: Choice, rank: int) -> float:
    costs = problem.costs(problem.tables[t].options[choice.option])
    return float(costs.cost[0, problem.class_of_rank[rank]])


def _movable_singles(problem: Problem, groups: GroupIndex, choices: list[Choice]) -> list[int]:
    """Single-shard tables that may go to any rank (not pinned, not in a link group)."""
    return [t for t, _ in _movable(problem, groups, choices, _rank_grid(problem))]


def _rank_grid(problem: Problem) -> np.ndarray:
    """Each rank a bin of its own (``problem.host_grid``: each host a bin)."""
    return np.arange(problem.world_size).reshape(-1, 1)


def _movable(
    problem: Problem, groups: GroupIndex, choices: list[Choice], grid: np.ndarray
) -> list[tuple[int, int]]:
    """(table, bin) for each table whose shards sit exactly on the ranks of one row (bin) of
    ``grid``, in order, and that may move whole to any other (not pinned, not in a link
    group, not fixed on every rank): a single-shard table on a rank, a table-row-wise table
    on a host."""
    everywhere = problem.every_rank
    index = {tuple(ranks): b for b, ranks in enumerate(grid.tolist())}
    found = []
    for t, choice in enumerate(choices):
        b = index.get(choice.ranks)
        allowed = problem.allowed[t]
        if (
            b is not None
            and t not in groups.linked
            and (allowed is everywhere or allowed == everywhere)  # (a 4,096-rank compare)
            and problem.tables[t].options[choice.option].placement is not Placement.FIXED
        ):
            found.append((t, b))
    return found


def _repartition_ranks(
    problem: Problem, groups: GroupIndex, choices: list[Choice], loads: Loads
) -> tuple[list[Choice], Loads] | None:
    return _repartition_once(problem, groups, choices, loads, _rank_grid(problem))


def _repartition_hosts(
    problem: Problem, groups: GroupIndex, choices: list[Choice], loads: Loads
) -> tuple[list[Choice], Loads] | None:
    if problem.num_hosts < 2 or problem.local_world_size < 2:
        return None  # one host, or hosts of one rank: nothing the rank move does not do
    return _repartition_once(problem, groups, choices, loads, problem.host_grid)


def _repartition_once(
    problem: Problem,
    groups: GroupIndex,
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
        if not _below_peak(worst[best], peak):
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


def _below_peak(load: float, peak: float) -> bool:
    """Whether ``load`` is below ``peak`` by more than rounding."""
    return bool(load < peak * (1 - PEAK_TOLERANCE))


def _at_peak(perf: np.ndarray, peak: float) -> int:
    """How many ranks are at ``peak``, up to rounding."""
    return int((perf >= peak * (1 - PEAK_TOLERANCE)).sum())
