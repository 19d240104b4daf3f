"""Lower bounds on the best achievable max-rank cost, each valid for the full problem.

- ``work/world_size``: total least work over world size (no rank can be below the average).
- ``largest_shard``: the table whose cheapest option still has the most expensive shard.

The relaxations add their own proven bounds: the LP (``lp.py``), the option mix
(``option_mix.py``), the packing relaxation (``packing.py``), and the CP-SAT search
(``cpsat/search.py``) when it solved the complete model. ``best_bound`` picks the
strongest; ``proven_within`` says whether it proves a plan good enough to stop.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner_service.plan.types import BoundSource, gap
from planner_service.solve.deadline import Deadline
from planner_service.solve.problem import Problem

OPTIMAL_GAP = 1e-4  # within the cost resolution of its proven bound: reported optimal


@dataclass(frozen=True, order=True)
class LowerBound:
    value: float
    source: BoundSource


def simple_bounds(problem: Problem, deadline: Deadline | None = None) -> list[LowerBound]:
    """Both bounds; pricing every option takes seconds on 100,000 distinct tables, so this
    raises ``OutOfTime`` once ``deadline`` is passed by its slack
    (``Deadline.preparation_check``)."""
    deadline = deadline or Deadline.never()
    least_work, largest = [], []
    check = deadline.preparation_check()
    for t in problem.tables:
        check()
        least_work.append(min(problem.costs(o).work for o in t.options))
        largest.append(min(problem.costs(o).largest_shard for o in t.options))
    return [
        LowerBound(sum(least_work) / problem.world_size, BoundSource.WORK),
        LowerBound(max(largest, default=0.0), BoundSource.LARGEST_SHARD),
    ]


def proven_within(objective: float, bound: float, gap_limit: float) -> bool:
    """Whether ``bound`` proves ``objective`` within the request's ``gap_limit``, or
    optimal (within the cost resolution) when the limit is tighter than that."""
    return gap(objective, bound) <= max(OPTIMAL_GAP, gap_limit)


def best_bound(bounds: list[LowerBound]) -> LowerBound:
    """The highest bound; of equal ones, the source last in alphabetical order."""
    return max(bounds, key=lambda bound: (bound.value, bound.source))
