"""The prepare stage: fit a request's options (``costs/``), build the problem
(``problem.py``) and bound it (``bounds/simple.py``, ``bounds/lp.py``); then the warm start:
the constructed plan (``construct.py``, guided by the LP's option mixes) improved by local
search (``improve.py``). Shared by the pipeline (``pipeline.py``) and by the infeasibility
fixes (``explain.py``), which re-run it on relaxed requests."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

from planner_service.costs.enumerate import FitResult, enumerate_options, fit_options
from planner_service.costs.options import DeviceClasses, TableOptions
from planner_service.plan.types import PlanRequest, ShardingType, TableProblem
from planner_service.solve.bounds.lp import LinearRelaxation, Relaxation, RelaxationInfeasible
from planner_service.solve.bounds.simple import LowerBound, best_bound, simple_bounds
from planner_service.solve.collector import paused_collector
from planner_service.solve.construct import greedy_plans
from planner_service.solve.deadline import Deadline, OutOfTime
from planner_service.solve.improve import improve
from planner_service.solve.pricing import priced_guides, priced_work_bound, shard_excluded_bound
from planner_service.solve.problem import (
    Choice,
    Group,
    Problem,
    group_tables,
    loads_of,
    without_equivalents,
)

GUIDE_MEMORY_FRACTIONS = (0.98, 0.95, 0.9)  # LP mixes that leave room to pack whole shards
# A re-solve at less memory is started only with this many times the solve at full memory
# left of the LP's share: cut short, it gives no guide. Measured on 5,384 memory-tight
# tables of distinct shapes on 1,024 ranks (53,079 variables), the memory rows then binding:
# the first re-solve took 4 to 16 times the solve at full memory (1.0 to 1.4 s); at a 60 s
# limit it ran out of the share after 9.4 s, time the local search then lacked.
RESOLVE_FACTOR = 20.0
# Without the LP: priced guides whose HBM fits these shares of all HBM (the last is the
# least-work guide whenever that fits). The tightest comes first: when time is short only
# the first pass may finish, and on memory-tight requests the guides that leave HBM free
# place the best plans (issue 37, 5,384 distinct shapes on 1,024 ranks: 7,372 ms from the
# 0.9 guide, 35,599 ms from the least-work one).
PRICED_FRACTIONS = (*sorted(GUIDE_MEMORY_FRACTIONS), 1.0)
LP_SHARE = 0.3  # of the time left when the LP is built: its build, solve and guides
# The LP's build and first solve per option variable: a build expected to outlast its
# share is not started (cut short, it left the guided passes without the time for a first
# plan). Beyond LP_SUPERLINEAR_FROM variables the time per variable grows with their number
# (more groups, longer rows, more simplex iterations each). Measured on the 2-core EPYC,
# build and first solve: 5.6 s for 53,083 variables (5,384 distinct memory-tight shapes on
# 1,024 ranks), 13.9 s for 95,641 (10,000 memory-tight on 4,096) and more than 12.2 s for
# 97,562 (10,000 synthetic on 4,096, its solve cut short by the share); the estimate gives
# 5.6, 18.2 and 18.9 s. At 10,000 x 4,096 and 60 s the LP no longer starts: it had taken
# 12 to 14 s of the local search's time and given no better plan (issue 37).
LP_S_PER_VARIABLE = 60e-6
LP_SUPERLINEAR_FROM = 30_200


@dataclass
class Prepared:
    """A request ready to solve. ``table_problems`` lists tables that fit nowhere (then
    there is no problem to solve); ``relaxation_infeasible`` means GLOP found no solution
    to the LP, which in floating point is no proof that there is no plan."""

    table_problems: list[TableProblem]
    problem: Problem | None = None
    groups: list[Group] | None = None
    bounds: list[LowerBound] | None = None
    relaxation: Relaxation | None = None
    relaxation_infeasible: bool = False
    linear: LinearRelaxation | None = None  # the LP, to re-solve with less memory
    fitted: FitResult | None = None  # the fitted options, for explaining infeasibility

    @property
    def lower_bound(self) -> LowerBound:
        assert self.bounds is not None
        return best_bound(self.bounds)


def prepare(
    request: PlanRequest,
    deadline: Deadline | None = None,
    exclude: frozenset[ShardingType] = frozenset(),
) -> Prepared:
    """``_prepare`` with the cyclic garbage collector paused (``collector.py``)."""
    with paused_collector():
        return _prepare(request, deadline, exclude)


def raise_bound(prepared: Prepared, deadline: Deadline | None = None) -> None:
    """Add ``pricing.shard_excluded_bound`` to the bounds of a problem to search, where it
    proves more than they do (the search's targets and its gap start from the best)."""
    if prepared.problem is None or not prepared.groups or not prepared.bounds:
        return
    with paused_collector():
        excluded = shard_excluded_bound(
            prepared.problem, prepared.groups, prepared.lower_bound.value, deadline
        )
    if excluded is not None:
        prepared.bounds.append(excluded)


def _prepare(
    request: PlanRequest,
    deadline: Deadline | None,
    exclude: frozenset[ShardingType],
) -> Prepared:
    """Enumerate and fit the options, build the problem and bound it. Without time left
    for the LP, the problem comes with the simple bounds only. ``exclude``: sharding types
    no table may take (the calibrated model's plans without a type's fixed cost); when
    that leaves a table without options, there is no problem (and no table problem).
    Raises ``OutOfTime`` when the deadline is passed by more than its finishing slack
    before the problem and its simple bounds are built (``Deadline.preparation_check``):
    without them there is nothing to search, and on 100,000 distinct tables they alone
    take minutes."""
    deadline = deadline or Deadline.never()
    check = deadline.preparation_check()
    enumerated = enumerate_options(request, on_table=check)
    fitted = fit_options(request, enumerated, on_table=check)
    if fitted.problems:
        return Prepared(fitted.problems, fitted=fitted)
    tables = without_equivalents(fitted.tables, request, deadline)
    if exclude:  # after dropping equivalents: an excluded type's equal stays out with it
        tables = [
            TableOptions(t.table, tuple(o for o in t.options if o.sharding_type not in exclude))
            for t in tables
        ]
        if not all(t.options for t in tables):
            return Prepared([], fitted=fitted)
    problem = Problem(request, tables, fitted.capacities, DeviceClasses.of(request.topology))
    groups = group_tables(problem)
    bounds = simple_bounds(problem, deadline)
    if deadline.expired():
        return _without_lp(problem, groups, bounds, fitted)
    # The LP and its guides get at most this share of what is left: on thousands of
    # distinct shapes it can take seconds, and the greedy must still have time for a plan.
    lp_deadline = deadline.share(LP_SHARE)
    if not lp_deadline.allows(_lp_estimate_s(groups)):  # skipped: its time goes to the plan
        deadline.reached = True
        return _without_lp(problem, groups, bounds, fitted)
    try:
        linear = LinearRelaxation(problem, groups, lp_deadline)
    except OutOfTime:
        deadline.reached = True
        return _without_lp(problem, groups, bounds, fitted)
    try:
        relaxation = linear.solve()
        deadline.reached |= lp_deadline.reached
    except RelaxationInfeasible:
        return Prepared(
            [], problem, groups, bounds, None, relaxation_infeasible=True, fitted=fitted
        )
    if relaxation is not None:
        bounds.append(relaxation.bound)
    return Prepared([], problem, groups, bounds, relaxation, linear=linear, fitted=fitted)


def _without_lp(
    problem: Problem, groups: list[Group], bounds: list[LowerBound], fitted: FitResult
) -> Prepared:
    """The problem with the simple bounds and, in the LP's stead, the memory-priced work
    bound (``pricing.priced_work_bound``)."""
    priced = priced_work_bound(problem, groups)
    return Prepared([], problem, groups, bounds + ([priced] if priced else []), fitted=fitted)


def _lp_estimate_s(groups: list[Group]) -> float:
    """What building and solving the LP of ``groups`` takes, about (see
    ``LP_SUPERLINEAR_FROM``)."""
    variables = sum(len(group.options) for group in groups)
    return LP_S_PER_VARIABLE * variables * max(1.0, variables / LP_SUPERLINEAR_FROM)


def warm_start(
    prepared: Prepared,
    deadline: Deadline | None = None,
    reserve: Callable[[list[Choice]], float] | None = None,
    bounds_s: float = 0.0,
) -> list[Choice] | None:
    """The constructed plan, improved by local search; None if it places no plan
    (before the deadline). ``reserve``: see ``greedy_plans``. ``bounds_s``: kept from the
    local search for the bounds after it (on memory-tight requests at scale it would
    otherwise run to the deadline, and the option-mix bound, which it leaves no time,
    proves 5,627 ms where the LP proves 5,561)."""
    assert prepared.problem is not None and prepared.groups is not None
    deadline = deadline or Deadline.never()
    problem, groups = prepared.problem, prepared.groups
    guides = _guides(problem, prepared.relaxation, prepared.linear, groups, deadline)
    plans = greedy_plans(problem, prepared.lower_bound.value, guides, deadline, reserve)
    searching = copy.copy(deadline)
    searching.reserve(bounds_s)
    improved = [improve(problem, choices, searching) for choices in plans]
    deadline.reached |= searching.reached
    scored = [(loads_of(problem, c).objective, i) for i, c in enumerate(improved)]
    return improved[min(scored)[1]] if improved else None


def _guides(
    problem: Problem,
    relaxation: Relaxation | None,
    linear: LinearRelaxation | None,
    groups: list[Group],
    deadline: Deadline,
) -> list[list[list[int]]]:
    """Per-table preferred options from the LP's option mix at reduced and full memory, the
    least memory first; without the LP (its build ran out of time), each table's least-work
    option with its HBM priced so that it fits (``pricing.py``), so that the first pass
    still places about one option per table, again the least memory first. The guides run
    in this order, and at scale only the first pass may finish before the local search
    needs the time: the guides that leave HBM free place the better plans there (5,384
    distinct shapes on 1,024 ranks, not memory-tight, 10 s: 1,215.92 ms, 5.59% over the
    bound, against 1,245.39 ms and 7.82% with the full-memory guide first)."""
    if relaxation is None or linear is None:
        priced = priced_guides(problem, groups, PRICED_FRACTIONS)
        return [guide for i, guide in enumerate(priced) if guide not in priced[:i]]
    mixes = [relaxation]
    first_s = linear.solve_s
    for fraction in GUIDE_MEMORY_FRACTIONS:
        # The LP's share of the time, and enough of it for a re-solve (``RESOLVE_FACTOR``).
        if deadline.expired() or not linear.deadline.allows(RESOLVE_FACTOR * first_s):
            deadline.reached |= linear.deadline.reached
            break
        try:
            mix = linear.solve(memory_fraction=fraction)
        except RelaxationInfeasible:
            break
        deadline.reached |= linear.deadline.reached
        if mix is not None:
            mixes.append(mix)
    guides: list[list[list[int]]] = []
    for mix in reversed(mixes):
        guide = _table_quotas(groups, mix.quotas(), len(problem.tables))
        if guide not in guides:
            guides.append(guide)
    return guides


def _table_quotas(groups: list[Group], quotas: list[list[int]], num_tables: int) -> list[list[int]]:
    """Hand each table of a group its share of the group's option quotas: the group's
    members take the options in order, so the counts match exactly."""
    per_table: list[list[int]] = [[] for _ in range(num_tables)]
    for group, counts in zip(groups, quotas, strict=True):
        sequence = [o for o, count in enumerate(counts) for _ in range(count)]
        for member, option in zip(group.members, sequence, strict=False):
            per_table[member] = [option]
    return per_table
