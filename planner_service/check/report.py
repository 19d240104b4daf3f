"""One check: from a request and its plan (or why it has none) to its ``CheckReport``;
planned through a ``PlanSource`` with the margin fix (``check``); and as POST /v1/check
answers it (``check_result``, with what the service's store knows).

Headroom is measured in the tier tables live in (HBM on cuda, DDR on cpu) against each
rank's usable capacity: what is left after the reservation (``plan/capacity.py``).
"""

from __future__ import annotations

from planner_service.check.binding import no_plan_binding, plan_binding
from planner_service.check.headroom import over_limit, rank_headroom, spread, tier_of, tier_use
from planner_service.check.margin import margin_request, with_margin_fix
from planner_service.check.source import PlanSource
from planner_service.plan.api import CheckReport, CheckResult, Verdict
from planner_service.plan.types import Infeasibility, PlanRequest, ShardingPlan


def check(
    request: PlanRequest, source: PlanSource, *, max_hbm_utilization: float | None = None
) -> CheckReport:
    """Plan ``request`` and report. Over the limit, plan again with the reservation that
    keeps the margin: that plan, or the planner's fixes when there is none, is the
    smallest fix."""
    answer = source(request)
    report = check_report(
        request, answer.plan, answer.infeasibility, max_hbm_utilization=max_hbm_utilization
    )
    tightened = margin_request(request, report)
    if tightened is None:
        return report
    answer = source(tightened)
    return with_margin_fix(report, tightened, answer.plan, answer.infeasibility)


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
    return CheckReport(
        fits=not over,
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
    )
