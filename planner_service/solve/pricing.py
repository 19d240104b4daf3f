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

from planner_service.plan.types import BoundSource
from planner_service.solve.bounds.simple import LowerBound
from planner_service.solve.problem import Group, Problem

PRICE_BISECTIONS = 60  # halvings of the price interval: far below any option's step
PRICED_BOUND_SAFETY = 1e-9  # relative slack for the floating-point sums of the priced bound


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
