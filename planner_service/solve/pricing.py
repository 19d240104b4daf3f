"""Memory-priced option choice: the construction's guide (``construct.py``) when the LP
relaxation (``bounds/lp.py``) has no mix to give, as on thousands of distinct shapes when
its build runs out of time.

Each table takes the option that minimises its work plus a price on its HBM; the price is
the least (found by bisection) at which the tables' HBM fits a share of all ranks' HBM. At
price 0 that is each table's least-work option, the guide used before, so requests whose
fastest options fit are guided as they were; when they do not, the tables whose slower
options save the most HBM per millisecond move first, which is the trade the LP makes
(issue 37: the least-work guide put every 40M-row table on ``fused`` and left the
last thousand tables nowhere to go but ``fused_uvm``, 113x the bound).
"""

from __future__ import annotations

import math

import numpy as np

from planner_service.costs.options import Placement, ShardEstimate
from planner_service.plan.types import BoundSource
from planner_service.solve.bounds.simple import LowerBound
from planner_service.solve.deadline import Deadline
from planner_service.solve.problem import Group, Problem

PRICE_BISECTIONS = 60  # halvings of the price interval: far below any option's step
PRICED_BOUND_SAFETY = 1e-9  # relative slack for the floating-point sums of the priced bound
EXCLUDED_BISECTIONS = 40  # halvings of the makespan interval of ``shard_excluded_bound``
# Reading the options' costs into arrays and the bisections over them, per option: 15 us
# measured on 53,079 memory-tight options (5.7 us on 97,562 that fit HBM at once), with
# room for a loaded machine.
EXCLUDED_S_PER_OPTION = 20e-6


def priced_guide(problem: Problem, groups: list[Group], memory_fraction: float) -> list[list[int]]:
    """Per table, the option of least ``work + price * hbm``, at the least price that
    fits the tables' HBM within ``memory_fraction`` of all ranks' HBM (or, if none does,
    each table's least-HBM option, ties to less work)."""
    return priced_guides(problem, groups, (memory_fraction,))[0]


def priced_guides(
    problem: Problem, groups: list[Group], memory_fractions: tuple[float, ...]
) -> list[list[list[int]]]:
    """``priced_guide`` at each of ``memory_fractions``, from one table of the options'
    work and HBM (reading them takes most of the time on thousands of groups)."""
    work, hbm, sizes = _option_arrays(problem, groups)
    return [
        _per_table(problem, groups, _fitting_picks(work, hbm, sizes, fraction * problem.hbm_total))
        for fraction in memory_fractions
    ]


def _fitting_picks(
    work: np.ndarray, hbm: np.ndarray, sizes: np.ndarray, budget: float
) -> np.ndarray:
    """Each group's option at the least price whose picks fit ``budget`` bytes of HBM."""
    picks = _picks(work, hbm, 0.0)
    if _total_hbm(hbm, sizes, picks) > budget:
        picks = _picks(work, hbm, _least_price(work, hbm, sizes, budget))
    return picks


def _per_table(problem: Problem, groups: list[Group], picks: np.ndarray) -> list[list[int]]:
    """A group's pick handed to each of its tables."""
    per_table: list[list[int]] = [[] for _ in problem.tables]
    for group, pick in zip(groups, picks.tolist(), strict=True):
        for member in group.members:
            per_table[member] = [int(pick)]
    return per_table


def priced_work_bound(problem: Problem, groups: list[Group]) -> LowerBound | None:
    """The least total work of options whose HBM fits all ranks' HBM together, over the
    world size, by Lagrangian relaxation: at any price p >= 0, the sum over tables of their
    least ``work + p * hbm``, less ``p`` times all HBM, is at most that work. Evaluated at
    the price ``priced_guide`` finds for the whole HBM (the picks' HBM just fits), where it
    is near its best. None when the least-work options fit (then it is the work bound).

    Without the LP (thousands of distinct shapes in a short limit) the work bound ignores
    memory: on 5,384 distinct shapes on 1,024 ranks filled to 80%, every rank's HBM full,
    it left the plan's gap at 33% (issue 37)."""
    work, hbm, sizes = _option_arrays(problem, groups)
    budget = float(problem.hbm_total)
    if _total_hbm(hbm, sizes, _picks(work, hbm, 0.0)) <= budget:
        return None
    price = _least_price(work, hbm, sizes, budget)
    if math.isinf(price):
        return None
    picks = _picks(work, hbm, price)
    rows = np.arange(len(picks))
    priced = float((sizes * (work[rows, picks] + price * hbm[rows, picks])).sum())
    value = (priced - price * budget) / problem.world_size * (1 - PRICED_BOUND_SAFETY)
    return LowerBound(max(0.0, value), BoundSource.WORK)


def shard_excluded_bound(
    problem: Problem, groups: list[Group], floor: float, deadline: Deadline | None = None
) -> LowerBound | None:
    """A work bound that knows a shard shares its rank with every table on every rank.

    Some tables lie on every rank whatever their option (every option row-wise or
    data-parallel over all ranks: a billion-row table that fits nowhere else): each rank
    carries at least their cheapest shards, ``F`` in all. A plan of makespan ``M`` can then
    use an option only if its dearest shard, plus ``F`` less the table's own share, is at
    most ``M``; so ``M`` is at least ``w(M)``, the memory-priced work bound
    (``priced_work_bound``) over those options alone. ``w`` falls as ``M`` grows, so the
    least ``M >= w(M)``, found by bisection from ``floor`` (the best bound so far), is a
    bound; the bisection's last ``M`` below it is returned. None when it proves no more
    than ``floor``.

    On 10,000 distinct tables on 4,096 ranks every rank holds 4,212 ms of row-wise
    shares; a 45M-row table whole on a rank (2,732 ms) or half of it (1,562 ms) then
    exceeds the work bound of 5,023 ms, and only its table-row-wise split (689 ms a shard,
    twice the work) fits below it (issue 37)."""
    deadline = deadline or Deadline.never()
    if not deadline.allows(EXCLUDED_S_PER_OPTION * sum(len(g.options) for g in groups)):
        return None
    work, hbm, sizes = _option_arrays(problem, groups)
    largest = np.full(work.shape, np.inf)
    shard_hbm = np.zeros(work.shape)  # the most HBM of one shard
    density = np.zeros(work.shape)  # the most HBM per ms of time of one shard
    own = np.zeros(len(groups))
    everywhere = np.zeros(len(groups), dtype=bool)
    for g, group in enumerate(groups):
        shares = []
        for o, option in enumerate(group.options):
            costs = problem.costs(option)
            largest[g, o] = costs.largest_shard
            shard_hbm[g, o] = costs.hbm_largest
            density[g, o] = _hbm_per_ms(costs.option.runs)
            if option.placement is Placement.FIXED and costs.num_shards == problem.world_size:
                shares.append(costs.smallest_shard)
        if len(shares) == len(group.options):  # on every rank whatever its option
            own[g], everywhere[g] = min(shares), True
    every_rank = float((own * sizes).sum())
    # An option is left out only when it exceeds M by more than rounding.
    need = largest + (every_rank - own)[:, None] * (1 - PRICED_BOUND_SAFETY)
    smallest_rank = float(problem.hbm_cap.min()) if problem.world_size else 0.0

    def locked_hbm(makespan: float, allowed: np.ndarray) -> np.ndarray:
        """Per option, the HBM it leaves no plan of makespan ``makespan`` able to use.

        An option with a shard dearer than half the makespan has that shard on a rank no
        other such shard shares. The rank has ``M - need`` of time left for the tables
        not on every rank (``need``: the shard and every rank's shares), so it holds at
        most the table's own bytes, the every-rank tables' most on one rank, and
        ``rate * (M - need)`` of the rest, ``rate`` being the most HBM per ms any of their
        shards has. What that leaves of the smallest rank's HBM unused counts as the
        option's own: a 48.8 ms table of 0.2 GiB with 6 ms to spare beside it cannot fill
        its 68 GiB with 32 GiB tables of 10 ms (``tight-95`` on 16 ranks, where the LP
        pools that memory and bounds the plan 13% below it)."""
        locked = np.zeros(work.shape)
        if smallest_rank <= 0:
            return locked
        rate = float(density[allowed & ~everywhere[:, None]].max(initial=0.0))
        if math.isinf(rate):
            return locked
        every = float((sizes * np.where(allowed, shard_hbm, 0.0).max(axis=1))[everywhere].sum())
        heavy = (
            allowed & ~everywhere[:, None] & (largest * (1 - PRICED_BOUND_SAFETY) > makespan / 2)
        )
        time_left = np.maximum(0.0, makespan - np.where(heavy, need, makespan))
        held = np.where(heavy, hbm, 0.0) + every + rate * time_left
        locked[heavy] = np.maximum(0.0, smallest_rank - held[heavy]) * (1 - PRICED_BOUND_SAFETY)
        return locked

    def bound_at(makespan: float) -> float:
        allowed = need <= makespan
        if not allowed.any(axis=1).all():
            return math.inf  # a table has no option within M: every plan is slower
        return _priced_total(
            np.where(allowed, work, np.inf),
            np.where(allowed, hbm + locked_hbm(makespan, allowed), np.inf),
            sizes,
            problem,
        )

    low = floor
    high = bound_at(low)
    if high <= low:
        return None
    if math.isinf(high):
        high = max(low, float(need[np.isfinite(need)].max(initial=low)))
        high = max(high, bound_at(high))
        if math.isinf(high) or bound_at(high) > high:
            return None
    for _ in range(EXCLUDED_BISECTIONS):
        if deadline.expired():
            break
        middle = (low + high) / 2
        if bound_at(middle) <= middle:
            high = middle
        else:
            low = middle
    return LowerBound(low, BoundSource.WORK) if low > floor else None


def _priced_total(work: np.ndarray, hbm: np.ndarray, sizes: np.ndarray, problem: Problem) -> float:
    """The memory-priced work bound of these options (``priced_work_bound``): the least
    work over the world size when it fits all HBM, else its Lagrangian bound at the least
    price that fits; infinite when not even the least-HBM options fit."""
    budget = float(problem.hbm_total)
    rows = np.arange(len(sizes))
    picks = _picks(work, hbm, 0.0)
    if _total_hbm(hbm, sizes, picks) <= budget:
        total = float((sizes * work[rows, picks]).sum())
    else:
        price = _least_price(work, hbm, sizes, budget)
        if math.isinf(price):
            return math.inf
        picks = _picks(work, hbm, price)
        total = float((sizes * (work[rows, picks] + price * hbm[rows, picks])).sum())
        total -= price * budget
    return total / problem.world_size * (1 - PRICED_BOUND_SAFETY)


def _hbm_per_ms(runs: tuple[tuple[ShardEstimate, int], ...]) -> float:
    """The most HBM per ms of its time of any shard of the runs (at its fastest device
    class); infinite for a shard that takes HBM and no time."""
    most = 0.0
    for estimate, count in runs:
        size = float(estimate.storage.hbm_bytes)
        if not count or size <= 0:
            continue
        time_ms = min(p.total for p in estimate.perf)
        most = max(most, size / time_ms if time_ms > 0 else math.inf)
    return most


def _option_arrays(
    problem: Problem, groups: list[Group]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Work and total HBM per group and option (groups x most options, missing options at
    infinity), and each group's size."""
    width = max(len(group.options) for group in groups)
    work = np.full((len(groups), width), np.inf)
    hbm = np.full((len(groups), width), np.inf)
    for g, group in enumerate(groups):
        for o, option in enumerate(group.options):
            costs = problem.costs(option)
            work[g, o], hbm[g, o] = costs.work, float(costs.hbm_total)
    return work, hbm, np.array([group.size for group in groups], dtype=float)


def _picks(work: np.ndarray, hbm: np.ndarray, price: float) -> np.ndarray:
    """Each group's option of least priced cost, the earlier on ties; at an infinite
    price, the least HBM, ties to the least work."""
    if np.isinf(price):
        least = hbm == hbm.min(axis=1, keepdims=True)
        return np.argmin(np.where(least, work, np.inf), axis=1)
    with np.errstate(invalid="ignore"):
        cost = np.where(np.isinf(work), np.inf, work + price * hbm)
    return np.argmin(cost, axis=1)


def _total_hbm(hbm: np.ndarray, sizes: np.ndarray, picks: np.ndarray) -> float:
    return float((hbm[np.arange(len(picks)), picks] * sizes).sum())


def _least_price(work: np.ndarray, hbm: np.ndarray, sizes: np.ndarray, budget: float) -> float:
    """The least price at which the picks' HBM fits ``budget``, by bisection (infinite
    when not even the least-HBM options fit)."""
    if _total_hbm(hbm, sizes, _picks(work, hbm, np.inf)) > budget:
        return float("inf")
    finite = np.isfinite(work)
    low, high = 0.0, 1.0
    spread = float(work[finite].max() - work[finite].min()) + 1.0
    smallest = float(np.diff(np.unique(hbm[finite])).min(initial=1.0))
    high = spread / max(smallest, 1.0)  # above this, HBM alone decides
    for _ in range(PRICE_BISECTIONS):
        middle = (low + high) / 2
        if _total_hbm(hbm, sizes, _picks(work, hbm, middle)) > budget:
            low = middle
        else:
            high = middle
    return high
