"""A plan against a baseline, the plan running today: what a change to the request costs
in predicted step time, memory, tiers and bytes to move.

The two step times are compared under one cost model where that is possible: when the
baseline is for the same world size and every one of its tables is in the request with the
same shape, it is priced again under the request (``validate.usage``), so a request that
only changes the model, the batch or the hardware's numbers is compared like for like.
Otherwise (tables reshaped, another world size) the baseline's own figures are used, and
the comparison says so (``repriced``). ``still_valid`` says whether the baseline is still a
plan of this request: every table placed, every layout and constraint kept, every rank
within its memory (the request's hash and the baseline's own figures may differ: they are
not counted).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner_service.check.placement import outside_hbm
from planner_service.plan.api import BaselineComparison, KernelMove
from planner_service.plan.diff import TableStatus, diff_plans
from planner_service.plan.types import PlanRequest, ShardingPlan, ViolationCode
from planner_service.validate.usage import rank_usage
from planner_service.validate.validator import validate_plan

# Violations that say the baseline was made for another request, not that it breaks this
# one: its hash, its own figures and its solver report under the other request.
_OTHER_REQUEST = frozenset(
    {ViolationCode.REQUEST_HASH_MISMATCH, ViolationCode.RANK_STATS, ViolationCode.SOLVER_REPORT}
)


@dataclass(frozen=True)
class Baseline:
    """The plan to compare with, and where it came from (a file, a plan id, alias:NAME);
    ``imported``: a service's plan stored by PUT, whose solver report it did not verify."""

    plan: ShardingPlan
    source: str
    imported: bool = False


def compare(request: PlanRequest, plan: ShardingPlan, chosen: Baseline) -> BaselineComparison:
    """``plan`` (the request's) against the ``chosen`` baseline."""
    baseline = chosen.plan
    repriced = _comparable(request, baseline)
    if repriced:
        usage = rank_usage(request, baseline.tables)
        loads = [usage.of(rank) for rank in range(baseline.world_size)]
        step_ms = usage.objective
        max_hbm = max(load.hbm_bytes for load in loads)
        max_ddr = max(load.ddr_bytes for load in loads)
    else:
        step_ms = baseline.solver.objective
        max_hbm = max(stats.hbm_bytes for stats in baseline.rank_stats)
        max_ddr = max(stats.ddr_bytes for stats in baseline.rank_stats)
    plan_step_ms = plan.solver.objective
    diff = diff_plans(baseline, plan, request)
    violations = validate_plan(request, baseline)
    return BaselineComparison(
        plan_id=baseline.plan_id,
        source=chosen.source,
        repriced=repriced,
        still_valid=all(v.code in _OTHER_REQUEST for v in violations),
        step_ms=step_ms,
        plan_step_ms=plan_step_ms,
        change=plan_step_ms / step_ms - 1 if step_ms > 0 else 0.0,
        max_hbm_bytes=max_hbm,
        plan_max_hbm_bytes=max(stats.hbm_bytes for stats in plan.rank_stats),
        max_ddr_bytes=max_ddr,
        plan_max_ddr_bytes=max(stats.ddr_bytes for stats in plan.rank_stats),
        outside_hbm=_outside(request, baseline),
        plan_outside_hbm=_outside(request, plan),
        kernel_moves=[
            KernelMove(name=t.name, baseline=t.old.compute_kernel, plan=t.new.compute_kernel)
            for t in diff.tables
            if t.old is not None
            and t.new is not None
            and t.old.compute_kernel is not t.new.compute_kernel
        ],
        tables_added=sum(t.status is TableStatus.ADDED for t in diff.tables),
        tables_removed=sum(t.status is TableStatus.REMOVED for t in diff.tables),
        moved_bytes=diff.moved_bytes,
        imported=chosen.imported or None,
    )


def _comparable(request: PlanRequest, baseline: ShardingPlan) -> bool:
    """The baseline can be priced under ``request``: the same world size, and each of its
    tables in the request with the same rows and columns."""
    if baseline.world_size != request.topology.world_size:
        return False
    shapes = {t.name: (t.num_embeddings, t.embedding_dim) for t in request.tables}
    for name, sharding in baseline.tables.items():
        shape = shapes.get(name)
        if shape is None:
            return False
        extent = (
            max(s.offsets[0] + s.sizes[0] for s in sharding.shards),
            max(s.offsets[1] + s.sizes[1] for s in sharding.shards),
        )
        if extent != shape:
            return False
    return True


def _outside(request: PlanRequest, plan: ShardingPlan) -> int:
    return sum(outside_hbm(request, s.compute_kernel) for s in plan.tables.values())
