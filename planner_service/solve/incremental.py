"""Incremental re-planning: a plan that stays close to a previous plan
(``options.previous_plan``), within ``options.max_moved_bytes`` and priced by
``options.move_cost_ms_per_gib``.

Moved bytes are ``plan.transfers.table_moves`` of each table, the definition ``shardplan diff``
uses. The stage builds one candidate beside the usual ones (``pipeline.py``):

- keep: every table whose previous sharding is still one of its options (same shard
  geometry, kernel and cache load factor) on ranks that are still valid for it (in range,
  allowed, on one host where the type needs it; tables in colocate or separate groups are
  re-placed) keeps it; where kept tables overfill a rank, the largest on it are released;
- place: the other tables (new, changed, released), largest first, each with the option
  and placement that scores best: the greedy's placement (``placement.try_option``) or its
  previous ranks, by the most loaded rank after it plus the move cost of its moved bytes,
  never beyond what is left of the cap while a placement within it exists;
- improve: re-insertion on the most loaded rank, as ``improve.py`` does, where a move is
  kept only if the max-rank cost plus the move cost drops and the cap still holds.

``best_within`` then picks among all candidates (this one, the warm start, the packing
plan, CP-SAT's) the one with the least max-rank cost plus move cost within the cap. The
bounds the pipeline reports are bounds of the problem without the cap and the move cost:
they are bounds of the capped problem's max-rank cost as well (the cap only removes
plans), so a gap is never understated, only possibly overstated.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from planner_service.costs.options import Placement, ShardingOption
from planner_service.plan.transfers import (
    Box,
    Element,
    PlanMoves,
    TableMoves,
    boxes,
    elements_of,
    plan_moves,
    table_moves,
)
from planner_service.plan.types import (
    Infeasibility,
    InfeasibilityCode,
    InfeasibilityReason,
    ParameterSharding,
    PlanOptions,
    Shard,
    ShardingPlan,
    ShardingType,
    SolverStatus,
)
from planner_service.plan.units import GiB, size
from planner_service.solve.deadline import Deadline
from planner_service.solve.placement import GroupIndex, State, try_option
from planner_service.solve.problem import Choice, Loads, Problem, add_choice, loads_of

MAX_ROUNDS = 200
TOLERANCE = 1e-12  # relative: sums of the same costs in another order differ in their last bits


class Moves:
    """Moved bytes of tables' choices from the previous plan, memoised per choice."""

    def __init__(self, problem: Problem, previous: ShardingPlan, options: PlanOptions) -> None:
        self.problem = problem
        self.previous = previous
        self.cap = options.max_moved_bytes
        self.per_byte = (options.move_cost_ms_per_gib or 0.0) / GiB
        elements = elements_of(problem.request)
        self.old: list[tuple[list[Box], bool] | None] = []
        self.element: list[Element] = []
        for entry in problem.tables:
            name = entry.table.name
            before = previous.tables.get(name)
            replicated = before is not None and before.sharding_type is ShardingType.DATA_PARALLEL
            self.old.append((boxes(before), replicated) if before is not None else None)
            self.element.append(elements.get(name, Element()))
        self._cache: dict[tuple[int, Choice], int] = {}

    def of(self, t: int, choice: Choice) -> int:
        """Bytes table ``t`` moves with ``choice``."""
        key = (t, choice)
        found = self._cache.get(key)
        if found is None:
            found = self._moves(t, choice).moved_bytes
            self._cache[key] = found
        return found

    def _moves(self, t: int, choice: Choice) -> TableMoves:
        old = self.old[t]
        if old is None:
            return TableMoves()
        option = self.problem.tables[t].options[choice.option]
        return table_moves(
            old[0], new_boxes(option, choice.ranks), old_replicated=old[1], element=self.element[t]
        )

    def total(self, choices: list[Choice]) -> int:
        return sum(self.of(t, choice) for t, choice in enumerate(choices))

    def within_cap(self, moved: int) -> bool:
        return self.cap is None or moved <= self.cap

    def score(self, objective: float, moved: int) -> float:
        """What the search minimises: the max-rank cost plus the move cost (ms)."""
        return objective + self.per_byte * moved


def new_boxes(option: ShardingOption, ranks: tuple[int, ...]) -> list[Box]:
    return [
        (row, col, shard.sizes[0], shard.sizes[1], int(rank))
        for (row, col), shard, rank in zip(option.offsets(), option.shards, ranks, strict=True)
    ]


def sharding_of(option: ShardingOption, ranks: tuple[int, ...]) -> ParameterSharding:
    """The plan's form of an option on ``ranks`` (built without re-validating)."""
    shards = [
        Shard.model_construct(offsets=(row, col), sizes=(rows, cols), rank=rank)
        for row, col, rows, cols, rank in new_boxes(option, ranks)
    ]
    return ParameterSharding.model_construct(
        sharding_type=option.sharding_type,
        compute_kernel=option.compute_kernel,
        ranks=[int(r) for r in ranks],
        shards=shards,
        cache_load_factor=option.cache_load_factor,
    )


def moves_of_plan(problem: Problem, previous: ShardingPlan, choices: list[Choice]) -> PlanMoves:
    """The moves of a whole solution, computed from its tables as the plan will hold them
    (``plan.transfers.plan_moves``, the function ``shardplan diff`` uses)."""
    tables = {
        entry.table.name: sharding_of(entry.options[choice.option], choice.ranks)
        for entry, choice in zip(problem.tables, choices, strict=True)
    }
    return plan_moves(previous, tables, problem.request)


# --------------------------------------------------------------------------- candidate


def incremental_plan(
    problem: Problem, moves: Moves, deadline: Deadline | None = None
) -> list[Choice] | None:
    """The keep, place, improve candidate (module docstring), or None where a table fits
    nowhere."""
    deadline = deadline or Deadline.never()
    groups = GroupIndex(problem)
    choices = kept_choices(problem, moves)
    loads = Loads.zeros(problem.world_size)
    for t, choice in enumerate(choices):
        if choice is not None:
            _add(problem, loads, t, choice, 1)
    _release_overfull(problem, choices, loads)
    state = _state(problem, loads, choices, groups)
    order = sorted(
        (t for t, c in enumerate(choices) if c is None),
        key=lambda t: (-min(problem.costs(o).work for o in problem.tables[t].options), t),
    )
    moved = sum(moves.of(t, c) for t, c in enumerate(choices) if c is not None)
    for t in order:
        best = _best_placement(problem, moves, groups, state, t, moved, state.max_perf)
        if best is None:
            return None
        choices[t] = best
        moved += moves.of(t, best)
        _add(problem, loads, t, best, 1)
        state = _state(problem, loads, choices, groups)
    placed = [c for c in choices if c is not None]
    assert len(placed) == len(choices)
    return _improve(problem, moves, groups, placed, deadline)


def _kept(problem: Problem, moves: Moves, t: int) -> Choice | None:
    """Table ``t``'s previous sharding as a choice, where it is still valid."""
    old = moves.old[t]
    if old is None:
        return None
    before = moves.previous.tables[problem.tables[t].table.name]
    ranks = tuple(shard.rank for shard in before.shards)
    target = sorted(old[0])
    matches = [
        index
        for index, option in enumerate(problem.tables[t].options)
        if option.compute_kernel is before.compute_kernel
        and option.cache_load_factor == before.cache_load_factor
        and len(option.shards) == len(ranks)
        and sorted(new_boxes(option, ranks)) == target
        and _valid_ranks(problem, t, option, ranks)
    ]
    if not matches:
        return None
    same_type = [
        i for i in matches if problem.tables[t].options[i].sharding_type is before.sharding_type
    ]
    return Choice((same_type or matches)[0], ranks)


def _valid_ranks(problem: Problem, t: int, option: ShardingOption, ranks: tuple[int, ...]) -> bool:
    if any(rank >= problem.world_size for rank in ranks) or not set(ranks) <= set(
        problem.allowed[t]
    ):
        return False
    if option.placement is Placement.FIXED:
        return ranks == tuple(range(problem.world_size))
    if option.sharding_type is ShardingType.TABLE_ROW_WISE:
        return any(ranks == tuple(row) for row in problem.host_grid.tolist())
    if option.sharding_type is ShardingType.TABLE_COLUMN_WISE:
        return len({problem.topology.host_of(rank) for rank in ranks}) == 1
    return True


def _add(problem: Problem, loads: Loads, t: int, choice: Choice, sign: int) -> None:
    option = problem.tables[t].options[choice.option]
    if sign > 0:
        add_choice(problem, option, choice.ranks, loads.perf, loads.hbm, loads.ddr)
        return
    added = Loads.zeros(problem.world_size)
    add_choice(problem, option, choice.ranks, added.perf, added.hbm, added.ddr)
    loads.perf[:] -= added.perf
    loads.hbm[:] -= added.hbm
    loads.ddr[:] -= added.ddr


def _release_overfull(problem: Problem, choices: list[Choice | None], loads: Loads) -> None:
    """Release kept tables from ranks over their memory, the largest there first."""
    while True:
        over = np.flatnonzero((loads.hbm > problem.hbm_cap) | (loads.ddr > problem.ddr_cap))
        if not len(over):
            return
        rank = int(over[0])
        on_rank = [t for t, c in enumerate(choices) if c is not None and rank in c.ranks]
        largest = max(on_rank, key=lambda t: (_bytes_on(problem, t, choices[t], rank), -t))
        choice = choices[largest]
        assert choice is not None
        _add(problem, loads, largest, choice, -1)
        choices[largest] = None


def _bytes_on(problem: Problem, t: int, choice: Choice | None, rank: int) -> int:
    assert choice is not None
    costs = problem.costs(problem.tables[t].options[choice.option])
    on = [s for s, r in enumerate(choice.ranks) if r == rank]
    return int(costs.hbm[on].sum() + costs.ddr[on].sum())


def _state(
    problem: Problem, loads: Loads, choices: list[Choice | None], groups: GroupIndex
) -> State:
    state = State(loads.perf.copy(), loads.hbm.copy(), loads.ddr.copy())
    state.max_perf = float(state.perf.max()) if len(state.perf) else 0.0
    state.placed = {
        t: frozenset(c.ranks) for t, c in enumerate(choices) if c is not None and t in groups.linked
    }
    state.free_hbm = problem.hbm_total - int(state.hbm.sum())
    state.free_bytes = state.free_hbm + problem.ddr_total - int(state.ddr.sum())
    return state


def _best_placement(
    problem: Problem,
    moves: Moves,
    groups: GroupIndex,
    state: State,
    t: int,
    moved_elsewhere: int,
    target: float,
) -> Choice | None:
    """Table ``t``'s best choice on ``state``: each option as the greedy places it, and on
    the table's previous ranks where valid; ordered by staying within the cap, then the
    most loaded rank after it plus the move cost, then bytes moved, then the option."""
    where = groups.where(problem, state, t)
    candidates: list[Choice] = []
    old = moves.old[t]
    old_ranks = None
    if old is not None:
        old_ranks = tuple(b[4] for b in old[0])
    for index, option in enumerate(problem.tables[t].options):
        found = try_option(problem, state, where, index, option, target)
        if found is not None:
            candidates.append(found.choice)
        if (
            old_ranks is not None
            and len(option.shards) == len(old_ranks)
            and t not in groups.linked
            and _valid_ranks(problem, t, option, old_ranks)
        ):
            candidates.append(Choice(index, old_ranks))
    best: tuple[tuple[bool, float, int, int], Choice] | None = None
    for choice in candidates:
        after = _peak_after(problem, state, t, choice)
        if after is None:
            continue
        moved = moves.of(t, choice)
        key = (
            not moves.within_cap(moved_elsewhere + moved),
            moves.score(max(after, target), moved),
            moved,
            choice.option,
        )
        if best is None or key < best[0]:
            best = (key, choice)
    return best[1] if best is not None else None


def _peak_after(problem: Problem, state: State, t: int, choice: Choice) -> float | None:
    """The most loaded rank after adding ``choice`` to ``state``, or None if it overflows."""
    option = problem.tables[t].options[choice.option]
    perf, hbm, ddr = state.perf.copy(), state.hbm.copy(), state.ddr.copy()
    add_choice(problem, option, choice.ranks, perf, hbm, ddr)
    touched = np.asarray(choice.ranks, dtype=np.int64)
    if (hbm[touched] > problem.hbm_cap[touched]).any():
        return None
    if (ddr[touched] > problem.ddr_cap[touched]).any():
        return None
    return float(perf.max())


def _improve(
    problem: Problem,
    moves: Moves,
    groups: GroupIndex,
    choices: list[Choice],
    deadline: Deadline,
) -> list[Choice]:
    """Re-insertion on the most loaded rank while max-rank cost plus move cost drops
    within the cap, or stays and fewer ranks sit at the max (module docstring)."""
    loads = loads_of(problem, choices)
    moved = moves.total(choices)
    for _ in range(MAX_ROUNDS):
        if deadline.expired():
            break
        score = moves.score(loads.objective, moved)
        bottleneck = int(np.argmax(loads.perf))
        on = [t for t, c in enumerate(choices) if bottleneck in c.ranks]
        on.sort(key=lambda t: (-_cost_on(problem, t, choices[t], bottleneck), t))
        for t in on:
            without = Loads(loads.perf.copy(), loads.hbm.copy(), loads.ddr.copy())
            _add(problem, without, t, choices[t], -1)
            trial_choices: list[Choice | None] = list(choices)
            trial_choices[t] = None
            state = _state(problem, without, trial_choices, groups)
            elsewhere = moved - moves.of(t, choices[t])
            best = _best_placement(problem, moves, groups, state, t, elsewhere, loads.objective)
            if best is None or best == choices[t]:
                continue
            new_moved = elsewhere + moves.of(t, best)
            if not moves.within_cap(new_moved):
                continue
            _add(problem, without, t, best, 1)
            new_score = moves.score(without.objective, new_moved)
            if new_score < score * (1 - TOLERANCE) or (
                new_score <= score and _at_peak(without) < _at_peak(loads)
            ):
                choices = list(choices)
                choices[t] = best
                loads, moved = without, new_moved
                break
        else:
            break
    return choices


def _at_peak(loads: Loads) -> int:
    """How many ranks are at the most loaded rank's load, up to rounding."""
    return int((loads.perf >= loads.objective * (1 - TOLERANCE)).sum())


def _cost_on(problem: Problem, t: int, choice: Choice, rank: int) -> float:
    costs = problem.costs(problem.tables[t].options[choice.option])
    return float(
        sum(
            costs.cost[s, problem.class_of_rank[rank]]
            for s, r in enumerate(choice.ranks)
            if r == rank
        )
    )


# --------------------------------------------------------------------------- revert


def kept_choices(problem: Problem, moves: Moves) -> list[Choice | None]:
    """Each table's previous sharding as a choice where still valid (None elsewhere, and
    for tables in colocate or separate groups)."""
    linked = GroupIndex(problem).linked
    return [None if t in linked else _kept(problem, moves, t) for t in range(len(problem.tables))]


def revert_towards_previous(
    problem: Problem,
    moves: Moves,
    start: list[Choice],
    kept: list[Choice | None],
    deadline: Deadline | None = None,
) -> list[Choice]:
    """``start`` (a plan made without regard to moves) with tables put back where the
    previous plan had them: first every revert that does not raise max-rank cost plus move
    cost, the tables that move most first, pass after pass; then, while the plan moves
    more than the cap, the revert that raises that sum least per byte it saves, down to
    the cap, half and a quarter of it, each improved by re-insertion on the most loaded
    rank within the cap (``_improve``), the best kept."""
    deadline = deadline or Deadline.never()
    choices = list(start)
    loads = loads_of(problem, choices)
    moved = moves.total(choices)
    changed = True
    while changed and not deadline.expired():
        changed = False
        candidates = _revertible(problem, moves, choices, kept)
        for t in candidates:
            trial = _reverted(problem, moves, choices, loads, moved, t, kept)
            if trial is None:
                continue
            new_loads, new_moved = trial
            if moves.score(new_loads.objective, new_moved) <= moves.score(loads.objective, moved):
                choices[t] = _back(kept, t)
                loads, moved, changed = new_loads, new_moved, True
    if moves.cap is None or moves.within_cap(moved):
        return _improve(problem, moves, GroupIndex(problem), choices, deadline)
    # Over the cap: revert down to the cap and to fractions of it (a plan that moves less
    # can be faster: fewer tables crowd back onto their old ranks), improve each, and keep
    # the best.
    found: list[tuple[float, int, int, list[Choice]]] = []
    for target in (moves.cap, moves.cap // 2, moves.cap // 4):
        reverted = _revert_to(problem, moves, list(choices), loads, moved, kept, target, deadline)
        improved = _improve(problem, moves, GroupIndex(problem), reverted, deadline)
        total = moves.total(improved)
        if moves.within_cap(total):
            objective = loads_of(problem, improved).objective
            found.append((moves.score(objective, total), total, len(found), improved))
    return min(found)[3] if found else choices


def _revert_to(
    problem: Problem,
    moves: Moves,
    choices: list[Choice],
    loads: Loads,
    moved: int,
    kept: list[Choice | None],
    target: int,
    deadline: Deadline,
) -> list[Choice]:
    """``choices`` reverted until they move at most ``target`` bytes: a lazy greedy on the
    rise of max-rank cost plus move cost per byte saved (a rise, once computed, only grows
    as the other ranks fill, so only the top of the heap is checked again)."""
    heap = [(-math.inf, t) for t in _revertible(problem, moves, choices, kept)]
    while heap and moved > target and not deadline.expired():
        _, t = heapq.heappop(heap)
        trial = _reverted(problem, moves, choices, loads, moved, t, kept)
        if trial is None or trial[1] >= moved:
            continue
        score = moves.score(loads.objective, moved)
        rise = (moves.score(trial[0].objective, trial[1]) - score) / (moved - trial[1])
        if heap and rise > heap[0][0]:
            heapq.heappush(heap, (rise, t))
            continue
        loads, moved = trial
        choices[t] = _back(kept, t)
    return choices


def _back(kept: list[Choice | None], t: int) -> Choice:
    back = kept[t]
    assert back is not None
    return back


def _revertible(
    problem: Problem, moves: Moves, choices: list[Choice], kept: list[Choice | None]
) -> list[int]:
    """Tables not where the previous plan had them, that could go back, most bytes first."""
    found = [
        t
        for t, choice in enumerate(choices)
        if kept[t] is not None and choice != kept[t] and moves.of(t, choice) > 0
    ]
    found.sort(key=lambda t: (-moves.of(t, choices[t]), t))
    return found


def _reverted(
    problem: Problem,
    moves: Moves,
    choices: list[Choice],
    loads: Loads,
    moved: int,
    t: int,
    kept: list[Choice | None],
) -> tuple[Loads, int] | None:
    """Loads and moved bytes with table ``t`` back on its previous choice, or None where
    that overfills a rank."""
    back = _back(kept, t)
    trial = Loads(loads.perf.copy(), loads.hbm.copy(), loads.ddr.copy())
    _add(problem, trial, t, choices[t], -1)
    _add(problem, trial, t, back, 1)
    touched = np.asarray(back.ranks, dtype=np.int64)
    if (trial.hbm[touched] > problem.hbm_cap[touched]).any():
        return None
    if (trial.ddr[touched] > problem.ddr_cap[touched]).any():
        return None
    return trial, moved - moves.of(t, choices[t]) + moves.of(t, back)


# --------------------------------------------------------------------------- choosing


@dataclass(frozen=True)
class Picked:
    """The candidate chosen, with its loads and moved bytes; ``least_moved`` over all
    candidates when none is within the cap (``choices`` is then None)."""

    choices: list[Choice] | None
    loads: Loads | None
    least_moved: int


def best_within(problem: Problem, moves: Moves, candidates: list[list[Choice]]) -> Picked:
    """The candidate with the least max-rank cost plus move cost within the cap; ties to
    fewer moved bytes, then the lower peak HBM, then the earlier candidate."""
    best = None
    least = None
    for i, choices in enumerate(candidates):
        loads = loads_of(problem, choices)
        moved = moves.total(choices)
        least = moved if least is None else min(least, moved)
        if not moves.within_cap(moved):
            continue
        key = (moves.score(loads.objective, moved), moved, loads.peak_hbm, i)
        if best is None or key < best[0]:
            best = (key, choices, loads)
    if best is None:
        return Picked(None, None, least or 0)
    return Picked(best[1], best[2], least or 0)


def over_cap(cap: int, least_moved: int) -> Infeasibility:
    """No candidate moves at most ``cap`` bytes."""
    message = (
        f"no plan found that moves at most {cap:,} bytes (options.max_moved_bytes); the "
        f"least any plan found moves is {least_moved:,} bytes ({size(least_moved)}). "
        "Not proven impossible: raise max_moved_bytes to at least that, or re-plan without "
        "it"
    )
    reason = InfeasibilityReason(
        code=InfeasibilityCode.MOVE_BUDGET,
        message=message,
        needed_bytes=least_moved,
        available_bytes=cap,
    )
    return Infeasibility(status=SolverStatus.NO_SOLUTION_IN_TIME, reasons=[reason])
