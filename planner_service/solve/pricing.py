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

import numpy as np

from planner_service.solve.problem import Group, Problem

PRICE_BISECTIONS = 60  # halvings of the price interval: far below any option's step


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
