"""Construction: a fast plan, the warm start for CP-SAT and the answer when time is short.

Longest-processing-time first with option choice against a target makespan: tables are
taken in decreasing order of the least work they need; for each, every option is placed
tentatively (``placement.try_option``). Options that keep every rank under the target
compete on total work added (spreading a table row-wise costs more work than keeping it
whole, so it is only worth it when the whole table would overshoot); otherwise the option
with the lightest most-loaded rank wins. Ties go to less HBM, then the earlier option.
``greedy_plan`` tries a few targets from the lower bound upwards and keeps the best plan;
``improve.py`` then searches locally from it. Deterministic: every tie is broken by index.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from planner_service.costs.options import Placement, ShardingOption
from planner_service.plan.types import ShardingType
from planner_service.solve.deadline import Deadline
from planner_service.solve.placement import Candidate, GroupIndex, Score, State, try_option
from planner_service.solve.problem import Choice, Problem, add_choice, loads_of


class MemoryScore(NamedTuple):
    """How a guided pass's fallback compares options when none of the guide's fits: memory
    ran out, so the least HBM added wins, then the least bytes; lower is better."""

    hbm_bytes: float
    total_bytes: float
    option: int
    load_after: float


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
    reserve: Callable[[list[Choice]], float] | None = None,
) -> list[Choice] | None:
    """The best plan over several targets, unguided and with each guide (per table, the
    options to try first: the LP relaxation's rounded option mix, which knows which tables
    memory should push into slower tiers), or None when no pass places every table. Passes
    stop at the deadline, keeping the best plan of the passes that finished; once the first
    plan exists, ``reserve(plan)`` seconds are kept before the deadline (to seal it)."""
    deadline = deadline or Deadline.never()
    best: tuple[tuple[float, int, int], list[Choice]] | None = None
    least = _least_memory(problem)
    passes = [
        (rank, guide, factor)
        for rank, (guide, factor) in enumerate(
            [(None, f) for f in UNGUIDED_TARGET_FACTORS]
            + [(g, f) for g in guides or [] for f in GUIDED_TARGET_FACTORS]
        )
    ]
    # Guided passes run first: a table tries its guide's option before the others, so a
    # guided pass costs about one placement per table instead of one per option, and on
    # thousands of tables and ranks the first plan must come quickly. Ties still go to the
    # pass listed first above, so the plan is the same whenever every pass finishes.
    passes.sort(key=lambda p: p[1] is None)
    met: set[int] = set()  # guides (0: unguided) whose pass met its target
    for rank, guide, factor in passes:
        if id(guide) in met:
            continue
        if best is not None and deadline.expired():
            return best[1]
        # The first plan may use the deadline's grace; better plans only its time.
        stop = deadline.expired if best is not None else deadline.past_grace
        choices = _greedy(problem, lower_bound * factor, guide, least, stop)
        if choices is None:
            continue
        if best is None and reserve is not None:
            deadline.reserve(reserve(choices))
        loads = loads_of(problem, choices)
        key = (loads.objective, loads.peak_hbm, rank)
        if best is None or key < best[0]:
            best = (key, choices)
        if lower_bound > 0 and loads.objective <= lower_bound * factor:
            met.add(id(guide))  # met its target: larger targets cannot do better
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
    groups = GroupIndex(problem)
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
        best: Candidate | None = None
        best_key: Score | MemoryScore | None = None
        where = groups.where(problem, state, t)
        for round_number, indices in enumerate(rounds):
            # The guide's options compete on time; when none fits, memory is what ran out,
            # so the fallback takes the option that adds the least HBM, then the least bytes.
            fallback = preferred is not None and round_number > 0
            for index in indices:
                candidate = try_option(problem, state, where, index, options[index], target)
                if candidate is None:
                    continue
                key: Score | MemoryScore = candidate.score
                if fallback:
                    key = _by_memory(problem, options[index], candidate.score)
                if best_key is None or key < best_key:
                    best, best_key = candidate, key
            if best is not None:
                break
        if best is None:
            return None
        _commit(problem, state, t, best.choice)
        choices[t] = best.choice
    return [choice for choice in choices if choice is not None]


def _empty_state(problem: Problem) -> State:
    world = problem.world_size
    state = State(np.zeros(world), np.zeros(world, np.int64), np.zeros(world, np.int64))
    state.free_hbm = problem.hbm_total
    state.free_bytes = state.free_hbm + problem.ddr_total
    return state


def _by_memory(problem: Problem, option: ShardingOption, score: Score) -> MemoryScore:
    costs = problem.costs(option)
    hbm, ddr = costs.hbm_total, costs.ddr_total
    return MemoryScore(float(hbm), float(hbm + ddr), score.option, score.load_after)


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


def _commit(problem: Problem, state: State, t: int, choice: Choice) -> None:
    option = problem.tables[t].options[choice.option]
    add_choice(problem, option, choice.ranks, state.perf, state.hbm, state.ddr)
    costs = problem.costs(option)
    state.max_perf = float(state.perf.max())
    state.placed[t] = frozenset(choice.ranks)
    state.free_hbm -= costs.hbm_total
    state.free_bytes -= costs.hbm_total + costs.ddr_total
