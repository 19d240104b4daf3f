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

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

import numpy as np

from planner_service.costs.options import Placement, ShardingOption
from planner_service.plan.types import ShardingType
from planner_service.solve.deadline import Deadline
from planner_service.solve.placement import (
    Candidate,
    GroupIndex,
    Score,
    State,
    Where,
    try_option,
)
from planner_service.solve.problem import Choice, Problem, add_choice, loads_of
from planner_service.solve.room import Demotions


class ShareScore(NamedTuple):
    """How a guided pass's fallback compares options when none of the guide's fits: memory
    ran out where the guide expected room. An option that keeps the slowest rank at the
    target still wins (as in ``Score``); among those, the one taking the least share of
    what is left, time and memory together, beyond what the tables still to place need
    at least: the least HBM alone would take an option hundreds of times slower (issue
    37: 40M-row tables on ``fused_uvm``, 113x the bound), the least time alone the HBM
    that later tables need. Lower is better."""

    makespan: float
    share: float
    option: int
    load_after: float


class MemoryScore(NamedTuple):
    """The other fallback: the least HBM added wins, then the least bytes. Alone it can
    take options hundreds of times slower, but where the shares of ``ShareScore`` misjudge
    what later tables need (the colossal model on 128 ranks: 15% slower with shares only),
    its pass is the better one; both run and the better plan is kept."""

    hbm_bytes: float
    total_bytes: float
    option: int
    load_after: float


class Pass(NamedTuple):
    """A construction pass's plan, and whether some table took an option of the fallback
    round (none of the guide's fitted)."""

    choices: list[Choice]
    fell_back: bool


class Fallback(Enum):
    """How a guided pass compares options when none of the guide's fits."""

    SHARE = "share"
    MEMORY = "memory"


# Unguided passes are sensitive to the target; guided ones barely (measured on the public
# workloads), so they run at the bound only.
UNGUIDED_TARGET_FACTORS = (1.0, 1.03, 1.1)
GUIDED_TARGET_FACTORS = (1.0,)
DEADLINE_CHECK_EVERY = 16  # tables placed between looks at the clock
# Once the first plan exists, the share of the time then left that further passes leave to
# the local search after them (``improve.py``). On 5,384 memory-tight tables of distinct
# shapes on 1,024 ranks, at the default 10 s, the first plan came at 5.1 s and the other
# ten passes (0.4 to 1.1 s each) ran to the deadline: the local search, which takes that
# plan from 26.7% to 21.5% over the bound in 3.5 s, got none of it. With half of the time
# left (0.5) the passes after the first still found no better plan there, nor on the
# repeated-shape draw or the synthetic draws at batch 512 (both shapes); with 0.8 the
# search took the repeated draw from 11.49% to 10.05% at 10 s (two runs each, the same
# plans), the distinct one from 19.77% to 19.64%, and left the synthetic plans as they were.
SEARCH_SHARE = 0.8
MAX_DEMOTIONS = 4  # tables demoted to make room for one that fits nowhere
# A pass stops once its slowest rank is this far (relative) above its ceiling: the same
# loads summed in another order differ in their last bits.
CEILING_TOLERANCE = 1e-9


def greedy_plan(
    problem: Problem,
    lower_bound: float = 0.0,
    guides: list[list[list[int]]] | None = None,
    deadline: Deadline | None = None,
    reserve: Callable[[list[Choice]], float] | None = None,
) -> list[Choice] | None:
    """The best plan of ``greedy_plans``, or None."""
    plans = greedy_plans(problem, lower_bound, guides, deadline, reserve)
    return plans[0] if plans else None


def greedy_plans(
    problem: Problem,
    lower_bound: float = 0.0,
    guides: list[list[list[int]]] | None = None,
    deadline: Deadline | None = None,
    reserve: Callable[[list[Choice]], float] | None = None,
) -> list[list[Choice]]:
    """The best plan, then the best of the passes with the other fallback when it differs:
    local search (``improve.py``) from the second can end below where it ends from the first
    (the colossal model on 128 ranks: 454.9 against 526.6 ms from greedy plans of 595.0 and
    538.4 ms), so the warm start improves both. Each is the best over several targets,
    unguided and with each guide (per table, the options to try first: the LP relaxation's
    rounded option mix, which knows which tables memory should push into slower tiers), or
    none when no pass places every table. Passes stop at the deadline, keeping the best plan
    of the passes that finished; once the first plan exists, ``reserve(plan)`` seconds are
    kept before the deadline (to seal it), and further passes stop once ``1 -
    SEARCH_SHARE`` of the time left then has passed (a pass cut short is dropped). When no
    pass places every table, a last one takes each table's least-HBM option
    (``_least_memory_guide``), and its plan, if it places one, is the only one."""
    deadline = deadline or Deadline.never()
    passes_end: Deadline | None = None  # where further passes stop, once a plan exists
    best: dict[Fallback, tuple[tuple[float, int, int], list[Choice]]] = {}
    least = _least_memory(problem)
    passes = [
        (rank, guide, factor, fallback)
        for rank, (guide, factor, fallback) in enumerate(
            [(None, f, Fallback.SHARE) for f in UNGUIDED_TARGET_FACTORS]
            + [
                (g, f, fallback)
                for fallback in Fallback
                for g in guides or []
                for f in GUIDED_TARGET_FACTORS
            ]
        )
    ]
    # Guided passes run first: a table tries its guide's option before the others, so a
    # guided pass costs about one placement per table instead of one per option, and on
    # thousands of tables and ranks the first plan must come quickly. Ties still go to the
    # pass listed first above, so the plan is the same whenever every pass finishes.
    passes.sort(key=lambda p: p[1] is None)
    met: set[int] = set()  # guides (0: unguided) whose pass met its target
    # Guided SHARE passes that never used their fallback, by guide and target: the MEMORY
    # pass with the same guide and target is the same plan (the fallbacks differ only in
    # how they rank the options of the fallback round).
    same_either_way: dict[tuple[int, float], list[Choice]] = {}
    for rank, guide, factor, fallback in passes:
        if id(guide) in met:
            continue
        if passes_end is not None and passes_end.expired():
            deadline.reached = True  # the rest is the local search's
            break
        choices = same_either_way.get((id(guide), factor))
        if choices is None or fallback is not Fallback.MEMORY:
            # The first plan may use the deadline's grace; better plans only their share.
            stop = passes_end.expired if passes_end is not None else deadline.past_grace
            # A pass whose slowest rank passes both the best plan of its fallback and its
            # target can neither be kept nor meet its target: it stops there.
            ceiling = (
                max(best[fallback][0][0], lower_bound * factor) if fallback in best else math.inf
            )
            found = _greedy(
                problem, lower_bound * factor, guide, least, stop, fallback, ceiling=ceiling
            )
            if found is None:
                if passes_end is not None and passes_end.reached:
                    deadline.reached = True
                continue
            choices = found.choices
            if guide is not None and fallback is Fallback.SHARE and not found.fell_back:
                same_either_way[id(guide), factor] = choices
        if passes_end is None:
            if reserve is not None:
                deadline.reserve(reserve(choices))
            passes_end = deadline.share(1.0 - SEARCH_SHARE)
        loads = loads_of(problem, choices)
        key = (loads.objective, loads.peak_hbm, rank)
        if fallback not in best or key < best[fallback][0]:
            best[fallback] = (key, choices)
        if lower_bound > 0 and loads.objective <= lower_bound * factor:
            met.add(id(guide))  # met its target: larger targets cannot do better
    if not best and not deadline.past_grace():
        # No pass placed every table: the last resort packs memory alone.
        found = _greedy(
            problem,
            lower_bound,
            _least_memory_guide(problem),
            least,
            deadline.past_grace,
            Fallback.MEMORY,
        )
        if found is not None:
            return [found.choices]
    ranked = [choices for _, choices in sorted(best.values(), key=lambda item: item[0])]
    return ranked[:1] + [c for c in ranked[1:] if c != ranked[0]]


def _least_memory_guide(problem: Problem) -> list[list[int]]:
    """Per table, its option of the least HBM (then the least HBM and DDR, the least work):
    the guide of the last resort, when no other pass placed every table. Its plan can be
    very slow (tables in UVM), but it is a plan: at scale there is no search after the
    construction that would find one (issue 37, 10,000 memory-tight tables on 4,096 ranks
    at a batch of 4,096, where every table's buffers alone take 8 GiB of a rank's HBM: all
    eight passes ran out of room, at 80% to 95% of all HBM, and there was no plan)."""
    guide = []
    for entry in problem.tables:
        costs = [problem.costs(option) for option in entry.options]
        guide.append(
            [
                min(
                    range(len(costs)),
                    key=lambda i: (
                        costs[i].hbm_total,
                        costs[i].hbm_total + costs[i].ddr_total,
                        costs[i].work,
                        i,
                    ),
                )
            ]
        )
    return guide


def _greedy(
    problem: Problem,
    target: float,
    preferred: list[list[int]] | None,
    least: tuple[list[int], list[int], list[float]],
    out_of_time: Callable[[], bool],
    fallback_by: Fallback = Fallback.SHARE,
    *,
    ceiling: float = math.inf,
) -> Pass | None:
    """One pass at ``target``; None when this pass cannot place some table, when it runs
    out of time first, or once its slowest rank is above ``ceiling`` (before any demotion,
    loads only grow: the plan would end above it). With ``preferred``, a table tries only
    its preferred options first."""
    state = _empty_state(problem)
    groups = GroupIndex(problem)
    demotions = Demotions(problem, groups)
    choices: list[Choice | None] = [None] * len(problem.tables)
    least_hbm, least_bytes, least_work = least
    state.reserve_hbm, state.reserve_bytes = sum(least_hbm), sum(least_bytes)
    reserve_work = sum(least_work)
    fell_back = False
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
        reserve_work -= least_work[t]
        best: Candidate | None = None
        best_key: Score | ShareScore | MemoryScore | None = None
        where = groups.where(problem, state, t)
        for round_number, indices in enumerate(rounds):
            # The guide's options compete on time; when none fits, memory is what ran out,
            # so the fallback weighs the time and the memory each option takes.
            fallback = preferred is not None and round_number > 0
            room = _Room.of(problem, state, target, reserve_work) if fallback else None
            by_memory = fallback and fallback_by is Fallback.MEMORY
            for index in indices:
                candidate = try_option(problem, state, where, index, options[index], target)
                if candidate is None:
                    continue
                key: Score | ShareScore | MemoryScore = candidate.score
                if by_memory:
                    key = _by_memory(problem, options[index], candidate.score)
                elif room is not None:
                    key = room.score(problem, options[index], candidate.score)
                if best_key is None or key < best_key:
                    best, best_key = candidate, key
            if best is not None:
                fell_back |= round_number > 0
                break
        if best is None:
            best = _after_making_room(problem, state, choices, t, where, demotions)
            ceiling = math.inf  # a demotion may lower its rank's load
        if best is None:
            return None
        _commit(problem, state, t, best.choice)
        if state.max_perf > ceiling * (1 + CEILING_TOLERANCE):
            return None
        choices[t] = best.choice
        demotions.placed(t, best.choice)
    return Pass([choice for choice in choices if choice is not None], fell_back)


def _after_making_room(
    problem: Problem,
    state: State,
    choices: list[Choice | None],
    t: int,
    where: Where,
    demotions: Demotions,
) -> Candidate | None:
    """Table ``t``, which fits nowhere as the ranks are, placed after demoting placed tables
    to kernels that need less HBM (``room.py``) until its smallest shard fits on a rank:
    the option that then scores best, or None when no demotion makes room."""
    options = problem.tables[t].options
    # Room on one rank is what a shard placed freely needs; an option fixed on every
    # rank needs room on all of them, which demoting one table does not make.
    needs = [
        problem.costs(option).hbm_largest
        for option in options
        if option.placement is not Placement.FIXED
    ]
    if not needs:
        return None
    need = min(needs)
    for _ in range(MAX_DEMOTIONS):
        if not demotions.make_room(state, choices, need, where.allowed):
            return None
        found = [
            c
            for i, option in enumerate(options)
            if (c := try_option(problem, state, where, i, option, 0.0)) is not None
        ]
        if found:
            return min(found, key=lambda c: c.score)
    return None


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


@dataclass(frozen=True)
class _Room:
    """What is left for the table being placed, beyond what the tables after it need at
    least: rank time up to the target, HBM, and HBM + DDR (never below one unit, so that
    a full resource makes any use of it dear rather than dividing by zero)."""

    time_ms: float
    hbm_bytes: float
    total_bytes: float

    @classmethod
    def of(cls, problem: Problem, state: State, target: float, reserve_work: float) -> _Room:
        return cls(
            max(1.0, target * problem.world_size - float(state.perf.sum()) - reserve_work),
            max(1.0, float(state.free_hbm - state.reserve_hbm)),
            max(1.0, float(state.free_bytes - state.reserve_bytes)),
        )

    def score(self, problem: Problem, option: ShardingOption, score: Score) -> ShareScore:
        costs = problem.costs(option)
        share = (
            score.work / self.time_ms
            + costs.hbm_total / self.hbm_bytes
            + (costs.hbm_total + costs.ddr_total) / self.total_bytes
        )
        return ShareScore(score.makespan, share, score.option, score.load_after)


def _least_memory(problem: Problem) -> tuple[list[int], list[int], list[float]]:
    """Per table, the least total HBM, the least total HBM + DDR and the least work of
    any option."""
    hbm, total, work = [], [], []
    for entry in problem.tables:
        costs = [problem.costs(option) for option in entry.options]
        hbm.append(min(c.hbm_total for c in costs))
        total.append(min(c.hbm_total + c.ddr_total for c in costs))
        work.append(min(c.work for c in costs))
    return hbm, total, work


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
            max(float(c.hbm_largest) / hbm_cap, float(c.ddr_largest) / ddr_cap) for c in costs
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
