"""The explain stage: why no plan exists, with numbers, and the smallest fixes found by
re-solving relaxed requests: the least world size (same devices) that fits, and which
tables would fit if ``fused_uvm_caching`` were allowed.

The least world size is searched cheaply first with the LP relaxation (a world size whose
relaxation has no solution certainly has no plan), then confirmed by running the warm start
(``prepare.py``: enumeration, fit, LP-guided construction and local search) at that size
and a few larger ones; a world size reported as a fix is one where a plan was actually
found. Everything is deterministic. The same search, downwards, tells how few ranks a
request that does plan would need (``least_world_size``, for ``shardplan check``).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from planner_service.costs.enumerate import FitResult, enumerate_options, fit_options
from planner_service.costs.options import ShardingOption, TableOptions
from planner_service.plan.canonical import canonical_bytes
from planner_service.plan.codec import parse_request
from planner_service.plan.types import (
    ComputeDevice,
    ComputeKernel,
    ExplainCheck,
    Infeasibility,
    InfeasibilityCode,
    InfeasibilityReason,
    PlanRequest,
    SmallestFixes,
    SolverStatus,
    TableProblem,
    TableProblemCode,
)
from planner_service.plan.units import size
from planner_service.plan.variants import resized
from planner_service.solve.deadline import Deadline, OutOfTime
from planner_service.solve.prepare import prepare, warm_start

MAX_WORLD_SIZE_SEARCH = 65_536
MAX_WORLD_SIZE_FACTOR = 64  # search world sizes up to 64x the requested one
VERIFY_ATTEMPTS = 4  # confirmations of the LP's least size, each ~10% larger
VERIFY_GROWTH = 1.1


# The explanation's own time, kept from the search while it has no plan (``pipeline.py``),
# per table: the memory totals (each table's least bytes over its options, summed over all
# ranks and each pinned rank set), measured on the loaded 2-core machine at 21 us per table
# for 5,384 tables of distinct shapes and under 1 us for 10,000 of shared ones; about twice
# the first.
EXPLAIN_S_PER_TABLE = 40e-6


def explanation_time_s(tables: int) -> float:
    """What explaining a request of ``tables`` tables needs before its answer is due: its
    memory totals (the fix searches take what is left, if anything)."""
    return tables * EXPLAIN_S_PER_TABLE


def explain(
    request: PlanRequest,
    table_problems: list[TableProblem],
    status: SolverStatus,
    deadline: Deadline | None = None,
    fitted: FitResult | None = None,
) -> Infeasibility:
    """The reasons, then the smallest fixes found before the deadline. The memory totals
    stop once the deadline is passed by its finishing slack (``Deadline.overrun``: on
    100,000 distinct tables they take seconds); the fix searches are optional and stop at
    the deadline itself (``Deadline.strict``): a search cut short claims nothing beyond
    what it ruled out (``min_world_size_searched_up_to``). Whatever was cut is named in
    ``not_checked``, so that the answer comes on time and says what it did not check."""
    deadline = deadline or Deadline.never()
    not_checked: list[ExplainCheck] = []
    reasons = [_table_reason(p) for p in table_problems]
    try:
        reasons += memory_reasons(request, fitted, deadline)
    except OutOfTime:
        not_checked.append(ExplainCheck.MEMORY_TOTALS)
    if not reasons:
        reasons.append(_fallback_reason(request, status))
    fixes_deadline = deadline.strict()
    sizes = _world_size_fix(request, fixes_deadline)
    if not sizes.complete:
        not_checked.append(ExplainCheck.LARGER_WORLD_SIZES)
    try:
        caching = _caching_fix(request, fixes_deadline)
    except OutOfTime:
        caching = {}
        not_checked.append(ExplainCheck.UVM_CACHING)
    fixes = SmallestFixes(
        min_world_size=sizes.min_world_size,
        min_world_size_searched_up_to=sizes.searched_up_to,
        **caching,
    )
    return Infeasibility(
        status=status, reasons=reasons, fixes=fixes, not_checked=not_checked or None
    )


def _table_reason(problem: TableProblem) -> InfeasibilityReason:
    code = (
        InfeasibilityCode.TABLE_DOES_NOT_FIT
        if problem.code is TableProblemCode.DOES_NOT_FIT
        else InfeasibilityCode.NO_ALLOWED_OPTION
    )
    return InfeasibilityReason(
        code=code,
        message=problem.message,
        tables=[problem.table],
        needed_bytes=_sum_or_none(problem.needed_hbm_bytes, problem.needed_ddr_bytes),
        available_bytes=_sum_or_none(
            problem.largest_rank_hbm_bytes, problem.largest_rank_ddr_bytes
        ),
    )


def _sum_or_none(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _fallback_reason(request: PlanRequest, status: SolverStatus) -> InfeasibilityReason:
    if status is SolverStatus.NO_SOLUTION_IN_TIME:
        return InfeasibilityReason(
            code=InfeasibilityCode.TIMED_OUT,
            message=(
                f"no plan was found within time_limit_s {request.options.time_limit_s} and "
                "none was proven impossible; every table fits some rank on its own, so raise "
                "time_limit_s or relax constraints"
            ),
        )
    return InfeasibilityReason(
        code=InfeasibilityCode.NO_FEASIBLE_COMBINATION,
        message=(
            "every table fits some rank on its own, but no combination of options fits all "
            "of them together under the memory and constraints (proven by the solver)"
        ),
    )


# --------------------------------------------------------------------------- memory


def memory_reasons(
    request: PlanRequest, fitted: FitResult | None = None, deadline: Deadline | None = None
) -> list[InfeasibilityReason]:
    """Totals that cannot fit whatever the placement: all ranks, and each pinned rank set.
    Exact integer sums, so any reason here proves that no plan exists. ``fitted``: the
    request's fitted options, when the caller has them already. Raises ``OutOfTime`` once
    ``deadline`` is passed by its finishing slack (``Deadline.preparation_check``)."""
    check = (deadline or Deadline.never()).preparation_check()
    fitted = fitted or fit_options(
        request, enumerate_options(request, on_table=check), on_table=check
    )
    least = _LeastBytes(check)
    reasons = []
    everyone = list(range(request.topology.world_size))
    reason = _total_reason(fitted, fitted.tables, everyone, "all ranks", least)
    if reason is not None:
        reasons.append(reason)
    for ranks, entries in _pinned_sets(request, fitted.tables).items():
        where = f"pinned ranks {list(ranks)}"
        reason = _total_reason(fitted, entries, list(ranks), where, least)
        if reason is not None:
            reasons.append(
                reason.model_copy(
                    update={"code": InfeasibilityCode.PINNED_RANKS_OVERLOADED, "ranks": list(ranks)}
                )
            )
    return reasons


def _pinned_sets(
    request: PlanRequest, tables: list[TableOptions]
) -> dict[tuple[int, ...], list[TableOptions]]:
    """Each distinct pinned rank set with the tables pinned inside it."""
    pins = {tuple(sorted(set(c.ranks))) for c in request.constraints.tables.values() if c.ranks}
    result = {}
    for ranks in sorted(pins):
        inside = [
            entry
            for entry in tables
            if (pinned := request.constraints.for_table(entry.table.name).ranks)
            and set(pinned) <= set(ranks)
        ]
        if inside and len(ranks) < request.topology.world_size:
            result[ranks] = inside
    return result


def _total_reason(
    fitted: FitResult,
    entries: Iterable[TableOptions],
    ranks: list[int],
    where: str,
    least: _LeastBytes,
) -> InfeasibilityReason | None:
    entries = [entry for entry in entries if entry.options]
    if not entries:
        return None
    hbm_cap = sum(fitted.capacities[r].hbm_bytes for r in ranks)
    ddr_cap = sum(fitted.capacities[r].ddr_bytes for r in ranks)
    least_total = sum(least.total(entry) for entry in entries)
    least_hbm = sum(least.hbm(entry) for entry in entries)
    names = [entry.table.name for entry in entries]
    if least_total > hbm_cap + ddr_cap:
        return InfeasibilityReason(
            code=InfeasibilityCode.TOTAL_MEMORY,
            message=(
                f"the tables need at least {size(least_total)} of HBM+DDR together (each at "
                f"its smallest option) but {where} offer {size(hbm_cap + ddr_cap)} after the "
                "reservation"
            ),
            tables=names,
            needed_bytes=least_total,
            available_bytes=hbm_cap + ddr_cap,
        )
    if least_hbm > hbm_cap:
        return InfeasibilityReason(
            code=InfeasibilityCode.TOTAL_MEMORY,
            message=(
                f"the tables need at least {size(least_hbm)} of HBM together (each at its "
                f"least-HBM option) but {where} offer {size(hbm_cap)} of HBM after the "
                "reservation"
            ),
            tables=names,
            needed_bytes=least_hbm,
            available_bytes=hbm_cap,
        )
    return None


class _LeastBytes:
    """Each table's least bytes over its options, in total and in HBM. Tables of one shape
    share option objects, so each option's bytes are summed once. ``check`` is called
    once per table (the deadline's)."""

    def __init__(self, check: Callable[[], None]) -> None:
        self._check = check
        self._bytes: dict[int, tuple[int, int]] = {}
        self._least: dict[int, tuple[int, int]] = {}

    def total(self, entry: TableOptions) -> int:
        return self._least_of(entry)[1]

    def hbm(self, entry: TableOptions) -> int:
        return self._least_of(entry)[0]

    def _least_of(self, entry: TableOptions) -> tuple[int, int]:
        self._check()
        known = self._least.get(id(entry.options))
        if known is None:
            each = [self._of(option) for option in entry.options]
            known = min(h for h, _ in each), min(h + d for h, d in each)
            self._least[id(entry.options)] = known
        return known

    def _of(self, option: ShardingOption) -> tuple[int, int]:
        known = self._bytes.get(id(option))
        if known is None:
            hbm = sum(shard.storage.hbm_bytes * count for shard, count in option.runs)
            ddr = sum(shard.storage.ddr_bytes * count for shard, count in option.runs)
            known = self._bytes[id(option)] = (hbm, ddr)
        return known


# --------------------------------------------------------------------------- fixes


def plannable(request: PlanRequest, deadline: Deadline | None = None) -> bool:
    """Whether the warm start finds a plan for ``request``; ``OutOfTime`` when the
    deadline cut it before it could tell."""
    deadline = deadline or Deadline.never()
    prepared = prepare(request, deadline)
    if prepared.problem is None:
        return False
    if warm_start(prepared, deadline) is not None:
        return True
    deadline.check()
    return False


@dataclass(frozen=True)
class WorldSizeSearch:
    """The least world size at which the warm start found a plan; or none, and then the
    largest size ruled out when the search ended (at its limit, or at the deadline).
    ``complete``: the search was not cut short by the deadline."""

    min_world_size: int | None
    searched_up_to: int | None = None
    complete: bool = True


def least_world_size(
    request: PlanRequest, deadline: Deadline | None = None, *, fits: bool = False
) -> WorldSizeSearch:
    """The fewest ranks of the request's devices that plan. ``fits``: whether ``request``
    itself has a plan; then the sizes below its world size are searched (how few would
    do), else the sizes above it (the infeasibility fix). A world size below
    ``local_world_size`` is one host with that many ranks; above it, whole hosts."""
    deadline = deadline or Deadline.never()
    if not fits:
        return _world_size_fix(request, deadline)
    try:
        return _fewest_ranks(request, deadline)
    except OutOfTime:  # cut short: none smaller confirmed
        return WorldSizeSearch(request.topology.world_size, complete=False)


def _world_size_fix(request: PlanRequest, deadline: Deadline) -> WorldSizeSearch:
    """The least world size (whole hosts) above the request's at which the warm start
    finds a plan; with the largest size ruled out so far when the search ends (at its limit
    or the deadline)."""
    topology = request.topology
    local = topology.num_local_ranks
    limit = min(MAX_WORLD_SIZE_SEARCH, topology.world_size * MAX_WORLD_SIZE_FACTOR)
    limit -= limit % local

    probes = _Probes(deadline)
    feasible = _relaxation_probe(request, deadline, probes)
    try:
        necessary, ruled_out = _least_size(topology.world_size, limit, local, feasible, probes)
    except OutOfTime:
        return WorldSizeSearch(None, probes.ruled_out or topology.world_size, complete=False)
    if necessary is None:
        return WorldSizeSearch(None, ruled_out, complete=ruled_out >= limit)
    size = necessary
    for _ in range(VERIFY_ATTEMPTS):
        try:
            if not probes.affordable():
                return WorldSizeSearch(None, ruled_out, complete=False)
            with probes.timed():
                fits = plannable(resized(request, size), deadline)
        except OutOfTime:
            return WorldSizeSearch(None, ruled_out, complete=False)
        if fits:
            return WorldSizeSearch(size)
        ruled_out = size
        size = min(limit, _round_up(int(size * VERIFY_GROWTH) + 1, local))
    return WorldSizeSearch(None, size)


def _fewest_ranks(request: PlanRequest, deadline: Deadline) -> WorldSizeSearch:
    """The least size below the request's own (which plans) where the warm start finds a
    plan: bisection on the LP relaxation, then confirmation at that size or a few larger
    ones. Cut short by the deadline, the least size confirmed so far."""
    sizes = _smaller_sizes(request)
    probes = _Probes(deadline)
    feasible = _relaxation_probe(request, deadline, probes)
    low, high = -1, len(sizes) - 1  # indices: sizes[high] has a plan, sizes[low] has none
    while high - low > 1 and probes.affordable():
        middle = (low + high) // 2
        if feasible(sizes[middle]):
            high = middle
        else:
            low = middle
    for _ in range(VERIFY_ATTEMPTS):
        if high == len(sizes) - 1 or not probes.affordable():
            break
        with probes.timed():
            fits = plannable(resized(request, sizes[high]), deadline)
        if fits:
            return WorldSizeSearch(sizes[high])
        grown = bisect.bisect_left(sizes, int(sizes[high] * VERIFY_GROWTH) + 1)
        high = min(len(sizes) - 1, grown)
    return WorldSizeSearch(request.topology.world_size)


def _smaller_sizes(request: PlanRequest) -> list[int]:
    """The world sizes up to the request's, ascending: one host of 1, 2, ... ranks below
    ``local_world_size``, then whole hosts; none too small for a rank the request names
    (``rank_overrides``, pinned ``ranks``)."""
    topology = request.topology
    local = topology.num_local_ranks
    named = [override.rank for override in topology.rank_overrides]
    named += [rank for c in request.constraints.tables.values() for rank in c.ranks or []]
    least = max(named, default=-1) + 1
    sizes = [*range(1, local), *range(local, topology.world_size + 1, local)]
    return [size for size in sizes if size >= least]


def _relaxation_probe(
    request: PlanRequest, deadline: Deadline, probes: _Probes
) -> Callable[[int], bool]:
    """Whether the LP relaxation of ``request`` at a world size has a solution (when it has
    none, no plan exists there)."""

    def feasible(size: int) -> bool:
        with probes.timed():
            prepared = prepare(resized(request, size), deadline)
        if prepared.problem is not None and prepared.relaxation is None:
            deadline.check()  # the LP had no time: no answer, rather than a guess
        if prepared.problem is None or prepared.relaxation_infeasible:
            probes.ruled_out = max(probes.ruled_out or 0, size)
            return False
        return True

    return feasible


def _least_size(
    start: int,
    limit: int,
    local: int,
    feasible: Callable[[int], bool],
    probes: _Probes,
) -> tuple[int | None, int]:
    """Least multiple of ``local`` in (start, limit] where ``feasible`` holds, assuming it
    stays true once true: double, then bisect in whole hosts. With it, the largest size
    known infeasible (``limit`` when every size was, less when the deadline came first)."""
    low, high, size = start, None, start
    while size < limit:
        if not probes.affordable():
            return None, low
        size = min(limit, size * 2)
        if feasible(size):
            high = size
            break
        low = size
    if high is None:
        return None, low
    while high - low > local and probes.affordable():
        middle = _round_up((low + high) // 2, local)
        if middle >= high:
            break
        if feasible(middle):
            high = middle
        else:
            low = middle
    return high, low


class _Probes:
    """Times the fix search's probes, so that a probe that cannot finish before the
    deadline is not started: each probe is a whole prepare (and warm start) that does not
    stop midway, and the next, at a larger world size, takes up to twice the last."""

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
        self.last_s = 0.0
        self.ruled_out: int | None = None  # the largest size probed without a plan

    def affordable(self) -> bool:
        return self.deadline.allows(2 * self.last_s)

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        started = time.monotonic()
        yield
        self.last_s = time.monotonic() - started


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _caching_fix(request: PlanRequest, deadline: Deadline) -> dict[str, object]:
    """Tables whose kernel constraints exclude fused_uvm_caching and that would fit with it;
    ``OutOfTime`` when there are such tables and the deadline cut the search."""
    if request.topology.compute_device is ComputeDevice.CPU or not _excluding_caching(request):
        return {}
    deadline.check()
    data = json.loads(request.model_dump_json())
    relaxed_names = []
    for name, constraint in data["constraints"]["tables"].items():
        kernels = constraint.get("compute_kernels")
        if kernels and ComputeKernel.FUSED_UVM_CACHING.value not in kernels:
            constraint["compute_kernels"] = [*kernels, ComputeKernel.FUSED_UVM_CACHING.value]
            relaxed_names.append(name)
    if not relaxed_names:
        return {}
    deadline.check()
    relaxed = parse_request(canonical_bytes(data))
    enumerated = enumerate_options(request, on_table=deadline.check)
    before = {p.table for p in fit_options(request, enumerated, on_table=deadline.check).problems}
    prepared = prepare(relaxed, deadline)
    choices = None
    if prepared.problem is not None:
        choices = warm_start(prepared, deadline)
    if choices is None:
        deadline.check()  # cut short: neither a fix nor proof that it does not fit
    if choices is not None and prepared.problem is not None:
        problem = prepared.problem
        chosen = [
            problem.tables[t].table.name
            for t, choice in enumerate(choices)
            if problem.tables[t].table.name in relaxed_names
            and problem.tables[t].options[choice.option].compute_kernel
            is ComputeKernel.FUSED_UVM_CACHING
        ]
        return {"tables_fit_with_uvm_caching": sorted(chosen), "uvm_caching_makes_it_fit": True}
    enumerated = enumerate_options(relaxed, on_table=deadline.check)
    after = {p.table for p in fit_options(relaxed, enumerated, on_table=deadline.check).problems}
    helped = sorted((before - after) & set(relaxed_names))
    return {"tables_fit_with_uvm_caching": helped, "uvm_caching_makes_it_fit": False}


def _excluding_caching(request: PlanRequest) -> bool:
    """Whether some table's kernel constraints leave out fused_uvm_caching."""
    caching = ComputeKernel.FUSED_UVM_CACHING
    return any(
        c.compute_kernels and caching not in c.compute_kernels
        for c in request.constraints.tables.values()
    )
