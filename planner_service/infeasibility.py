"""Why no plan exists, with numbers, and the smallest fixes found by re-solving relaxed
requests: the least world size (same devices) that fits, and which tables would fit if
``fused_uvm_caching`` were allowed.

The least world size is searched cheaply first with the LP relaxation (a world size whose
relaxation has no solution certainly has no plan), then confirmed by running the warm start
(enumeration, fit, LP-guided heuristic) at that size and a few larger ones; a world size
reported as a fix is one where a plan was actually found. Everything is deterministic.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from planner_service.codec import canonical_bytes, parse_request
from planner_service.enumerator import (
    FitResult,
    TableOptions,
    enumerate_options,
    fit_options,
)
from planner_service.types import (
    ComputeDevice,
    ComputeKernel,
    Infeasibility,
    InfeasibilityCode,
    InfeasibilityReason,
    PlanRequest,
    SmallestFixes,
    SolverStatus,
    TableProblem,
    TableProblemCode,
)
from planner_service.warm_start import prepare, warm_start

MAX_WORLD_SIZE_SEARCH = 65_536
MAX_WORLD_SIZE_FACTOR = 64  # search world sizes up to 64x the requested one
VERIFY_ATTEMPTS = 4  # confirmations of the LP's least size, each ~10% larger
VERIFY_GROWTH = 1.1


def explain(
    request: PlanRequest, table_problems: list[TableProblem], status: SolverStatus
) -> Infeasibility:
    reasons = [_table_reason(p) for p in table_problems]
    reasons += memory_reasons(request)
    if not reasons:
        reasons.append(_fallback_reason(request, status))
    fixes = SmallestFixes(**_world_size_fix(request), **_caching_fix(request))
    return Infeasibility(status=status, reasons=reasons, fixes=fixes)


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


def memory_reasons(request: PlanRequest) -> list[InfeasibilityReason]:
    """Totals that cannot fit whatever the placement: all ranks, and each pinned rank set.
    Exact integer sums, so any reason here proves that no plan exists."""
    tables = enumerate_options(request)
    fitted = fit_options(request, tables)
    reasons = []
    everyone = list(range(request.topology.world_size))
    reason = _total_reason(fitted, fitted.tables, everyone, "all ranks")
    if reason is not None:
        reasons.append(reason)
    for ranks, entries in _pinned_sets(request, fitted.tables).items():
        reason = _total_reason(fitted, entries, list(ranks), f"pinned ranks {list(ranks)}")
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
    fitted: FitResult, entries: Iterable[TableOptions], ranks: list[int], where: str
) -> InfeasibilityReason | None:
    entries = [entry for entry in entries if entry.options]
    if not entries:
        return None
    hbm_cap = sum(fitted.capacities[r].hbm_bytes for r in ranks)
    ddr_cap = sum(fitted.capacities[r].ddr_bytes for r in ranks)
    least_total = sum(min(_bytes(o) for o in entry.options) for entry in entries)
    least_hbm = sum(min(_tier(o, "hbm_bytes") for o in entry.options) for entry in entries)
    names = [entry.table.name for entry in entries]
    if least_total > hbm_cap + ddr_cap:
        return InfeasibilityReason(
            code=InfeasibilityCode.TOTAL_MEMORY,
            message=(
                f"the tables need at least {_gib(least_total)} of HBM+DDR together (each at "
                f"its smallest option) but {where} offer {_gib(hbm_cap + ddr_cap)} after the "
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
                f"the tables need at least {_gib(least_hbm)} of HBM together (each at its "
                f"least-HBM option) but {where} offer {_gib(hbm_cap)} of HBM after the "
                "reservation"
            ),
            tables=names,
            needed_bytes=least_hbm,
            available_bytes=hbm_cap,
        )
    return None


def _bytes(option: object) -> int:
    return _tier(option, "hbm_bytes") + _tier(option, "ddr_bytes")


def _tier(option: object, field: str) -> int:
    return sum(getattr(shard.storage, field) for shard in option.shards)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- fixes


def plannable(request: PlanRequest) -> bool:
    """Whether the warm start finds a plan for ``request``."""
    prepared = prepare(request)
    if prepared.problem is None:
        return False
    return warm_start(prepared) is not None


def _relaxation_feasible(request: PlanRequest) -> bool:
    prepared = prepare(request)
    return prepared.problem is not None and not prepared.relaxation_infeasible


def _world_size_fix(request: PlanRequest) -> dict[str, int | None]:
    """The least world size (whole hosts) at which the warm start finds a plan."""
    topology = request.topology
    local = topology.num_local_ranks
    limit = min(MAX_WORLD_SIZE_SEARCH, topology.world_size * MAX_WORLD_SIZE_FACTOR)
    limit -= limit % local
    necessary = _least_size(request, topology.world_size, limit, local, _relaxation_feasible)
    if necessary is None:
        return {"min_world_size": None, "min_world_size_searched_up_to": limit}
    size = necessary
    for _ in range(VERIFY_ATTEMPTS):
        if plannable(_resized(request, size)):
            return {"min_world_size": size, "min_world_size_searched_up_to": None}
        size = min(limit, _round_up(int(size * VERIFY_GROWTH) + 1, local))
    return {"min_world_size": None, "min_world_size_searched_up_to": size}


def _least_size(
    request: PlanRequest,
    start: int,
    limit: int,
    local: int,
    feasible: Callable[[PlanRequest], bool],
) -> int | None:
    """Least multiple of ``local`` in (start, limit] where ``feasible`` holds, assuming it
    stays true once true: double, then bisect in whole hosts."""
    low, high, size = start, None, start
    while size < limit:
        size = min(limit, size * 2)
        if feasible(_resized(request, size)):
            high = size
            break
        low = size
    if high is None:
        return None
    while high - low > local:
        middle = _round_up((low + high) // 2, local)
        if middle >= high:
            break
        if feasible(_resized(request, middle)):
            high = middle
        else:
            low = middle
    return high


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _resized(request: PlanRequest, world_size: int) -> PlanRequest:
    data = json.loads(request.model_dump_json())
    data["topology"]["world_size"] = world_size
    return parse_request(canonical_bytes(data))


def _caching_fix(request: PlanRequest) -> dict[str, object]:
    """Tables whose kernel constraints exclude fused_uvm_caching and that would fit with it."""
    if request.topology.compute_device is ComputeDevice.CPU:
        return {}
    data = json.loads(request.model_dump_json())
    relaxed_names = []
    for name, constraint in data["constraints"]["tables"].items():
        kernels = constraint.get("compute_kernels")
        if kernels and ComputeKernel.FUSED_UVM_CACHING.value not in kernels:
            constraint["compute_kernels"] = [*kernels, ComputeKernel.FUSED_UVM_CACHING.value]
            relaxed_names.append(name)
    if not relaxed_names:
        return {}
    relaxed = parse_request(canonical_bytes(data))
    before = {p.table for p in fit_options(request, enumerate_options(request)).problems}
    prepared = prepare(relaxed)
    choices = None
    if prepared.problem is not None:
        choices = warm_start(prepared)
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
    after = {p.table for p in fit_options(relaxed, enumerate_options(relaxed)).problems}
    helped = sorted((before - after) & set(relaxed_names))
    return {"tables_fit_with_uvm_caching": helped, "uvm_caching_makes_it_fit": False}


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.3f} GiB"
