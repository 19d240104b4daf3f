"""One check: from a request and its plan (or why it has none) to its ``CheckReport``;
planned through a ``PlanSource`` with the margin fix (``check``); and as POST /v1/check
answers it (``check_result``, with what the service's store knows).

Headroom is measured in the tier tables live in (HBM on cuda, DDR on cpu) against each
rank's usable capacity: what is left after the reservation (``plan/capacity.py``).
"""

from __future__ import annotations

from planner_service.check.baseline import Baseline
from planner_service.check.binding import no_plan_binding, plan_binding
from planner_service.check.gates import apply_gates, check_gates, utilization_gate
from planner_service.check.headroom import over_limit, rank_headroom, spread, tier_of, tier_use
from planner_service.check.margin import margin_request, with_margin_fix
from planner_service.check.placement import placement
from planner_service.check.source import PlanSource
from planner_service.plan.api import (
    CheckGates,
    CheckReport,
    CheckResult,
    GateResult,
    MemoryTier,
    TierUse,
    Verdict,
)
from planner_service.plan.types import ComputeDevice, Infeasibility, PlanRequest, ShardingPlan


def check(
    request: PlanRequest,
    source: PlanSource,
    gates: CheckGates | None = None,
    baseline: Baseline | None = None,
) -> CheckReport:
    """Plan ``request`` and report, with ``gates`` applied and the plan compared with
    ``baseline``. Over the utilization limit, plan again with the reservation that keeps
    the margin: that plan, or the planner's fixes when there is none, is the smallest
    fix."""
    gates = gates or CheckGates()
    check_gates(gates, baseline)  # before the solve: a bad combination fails at once
    answer = source(request)
    report = check_report(
        request,
        answer.plan,
        answer.infeasibility,
        max_hbm_utilization=gates.max_hbm_utilization,
    )
    tightened = margin_request(request, report)
    if tightened is not None:
        fix_answer = source(tightened)
        report = with_margin_fix(report, tightened, fix_answer.plan, fix_answer.infeasibility)
    return apply_gates(report, request, answer.plan, gates, baseline)


def check_report(
    request: PlanRequest,
    plan: ShardingPlan | None,
    infeasibility: Infeasibility | None,
    *,
    max_hbm_utilization: float | None = None,
) -> CheckReport:
    """The report on ``request``'s plan (or on why it has none). ``max_hbm_utilization``:
    the most of its usable memory any rank may use before the check fails."""
    if plan is None:
        assert infeasibility is not None
        return _no_plan_report(request, infeasibility, max_hbm_utilization)
    ranks = rank_headroom(request, plan)
    tier = tier_of(request)
    uses = [tier_use(rank, tier) for rank in ranks]
    over = over_limit(uses, max_hbm_utilization)
    solver = plan.solver
    cuda = request.topology.compute_device is ComputeDevice.CUDA
    profile = request.options.device_profile
    return CheckReport(
        fits=not over,
        passed=not over,
        verdict=Verdict.OVER_LIMIT if over else Verdict.FITS,
        status=solver.status,
        world_size=plan.world_size,
        tables=len(plan.tables),
        plan_id=plan.plan_id,
        objective=solver.objective,
        lower_bound=solver.lower_bound,
        gap=solver.gap,
        max_hbm_utilization=max_hbm_utilization,
        headroom=spread(uses, tier),
        binding=plan_binding(request, plan, ranks, over),
        over_limit=over,
        ranks=ranks,
        step_ms=solver.objective,
        cost_model=request.options.cost_model,
        device_profile=profile.name if profile is not None else None,
        placement=placement(request, plan),
        ddr_headroom=(
            spread([tier_use(rank, MemoryTier.DDR) for rank in ranks], MemoryTier.DDR)
            if cuda
            else None
        ),
        gates=_utilization(max_hbm_utilization, uses),
    )


def check_result(report: CheckReport, *, stored: bool) -> CheckResult:
    """POST /v1/check's answer: ``report``, whether the service has its plan stored, and
    the tightest rank's free HBM (the field its gates read, kept from before the report)."""
    free = [rank.hbm_free_bytes for rank in report.ranks]
    return CheckResult(
        **dict(report),
        stored=stored,
        min_hbm_free_bytes=min(free) if free else None,
    )


def _utilization(limit: float | None, uses: list[TierUse]) -> list[GateResult]:
    if limit is None:
        return []
    return [utilization_gate(limit, max((u.utilization for u in uses), default=0.0))]


def _no_plan_report(
    request: PlanRequest, infeasibility: Infeasibility, limit: float | None
) -> CheckReport:
    return CheckReport(
        fits=False,
        verdict=Verdict.NO_PLAN,
        status=infeasibility.status,
        world_size=request.topology.world_size,
        tables=len(request.tables),
        plan_id=None,
        max_hbm_utilization=limit,
        binding=no_plan_binding(infeasibility),
        infeasibility=infeasibility,
        passed=False,
        cost_model=request.options.cost_model,
        gates=[] if limit is None else [utilization_gate(limit, None)],
    )
