"""The calibrated model's fixed costs in the search, and the bound that stays a proof.

Under ``calibrated``, a plan costs every rank the fixed costs of the sharding types it
uses at all (``costs.calibrated.fixed_perf``: a row-wise table brings a reduce-scatter and
an all-gather per step, whichever rank holds it). The stages search shard costs only, which
add up per rank; so the pipeline searches the whole problem and, in shares of the time,
the problem without each costly type (and each combination of the costliest), and keeps
the plan whose shard costs plus fixed costs are least.

The bound: a plan using exactly the types ``U`` is a plan of every variant that excludes
none of ``U``, so its shard costs are at least the strongest such variant's bound, and its
cost at least that plus ``fixed(U)``. The minimum of that over every ``U`` is a lower bound
on every plan (``bound_with_fixed_costs``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import combinations

from planner_service.costs.calibrated import fixed_perf
from planner_service.plan.types import PlanRequest, ShardingType
from planner_service.solve.bounds.simple import LowerBound
from planner_service.solve.problem import Choice, Problem, loads_of

# The costliest types whose exclusions are searched, in every combination: 2**3 variants
# at most, each with its share of the time.
MAX_EXCLUDED_TYPES = 3


@dataclass
class Variant:
    """A search without the sharding types ``excluded``: its problem (``None`` when some
    table has only excluded types), its proven bound on shard costs and its best plan."""

    excluded: frozenset[ShardingType]
    problem: Problem | None
    bound: LowerBound | None
    choices: list[Choice] | None = None

    def total(self, request: PlanRequest) -> float:
        """The plan's cost with its fixed costs: what the variants are compared on."""
        assert self.problem is not None and self.choices is not None
        objective = loads_of(self.problem, self.choices).objective
        return objective + fixed_perf(request, types_of(self.problem, self.choices)).total


def types_of(problem: Problem, choices: list[Choice]) -> set[ShardingType]:
    """The sharding types a plan uses."""
    return {
        entry.options[choice.option].sharding_type
        for entry, choice in zip(problem.tables, choices, strict=True)
    }


def present_types(problem: Problem) -> list[ShardingType]:
    """The sharding types some table of the problem may take, in a fixed order."""
    return sorted({option.sharding_type for t in problem.tables for option in t.options})


def fixed_cost_exclusions(problem: Problem) -> list[frozenset[ShardingType]]:
    """The variants to search: nothing excluded first, then every non-empty combination
    of the (at most ``MAX_EXCLUDED_TYPES``) types with the largest fixed costs; only the
    first without a device profile or when no type costs more than the step itself."""
    request = problem.request
    if request.options.device_profile is None:
        return [frozenset()]
    base = fixed_perf(request, ()).total
    extra = {kind: fixed_perf(request, (kind,)).total - base for kind in present_types(problem)}
    costly = sorted((k for k, ms in extra.items() if ms > 0), key=lambda k: (-extra[k], k))
    costly = costly[:MAX_EXCLUDED_TYPES]
    return [frozenset()] + [
        frozenset(combo)
        for size in range(1, len(costly) + 1)
        for combo in combinations(costly, size)
    ]


def bound_with_fixed_costs(request: PlanRequest, variants: list[Variant]) -> LowerBound:
    """A lower bound on every plan's cost, fixed costs included (module docstring);
    ``variants[0]`` is the search that excluded nothing."""
    full = variants[0]
    assert full.problem is not None and full.bound is not None
    if request.options.device_profile is None:
        return full.bound
    best: LowerBound | None = None
    for used in _subsets(present_types(full.problem)):
        valid = [v for v in variants if not v.excluded & used]
        if any(v.problem is None for v in valid):
            continue  # no plan avoids what that variant excluded: none uses exactly these
        strongest = max((v.bound for v in valid if v.bound is not None), key=lambda b: b.value)
        value = strongest.value + fixed_perf(request, used).total
        if best is None or value < best.value:
            best = LowerBound(value, strongest.source)
    assert best is not None  # the full variant covers every set of types
    return best


def _subsets(kinds: Iterable[ShardingType]) -> Iterable[frozenset[ShardingType]]:
    items = list(kinds)
    for size in range(1, len(items) + 1):
        for combo in combinations(items, size):
            yield frozenset(combo)
