"""The check's gates: limits a team sets beside "a plan exists", each failing the check
with its numbers when the plan goes past it.

- ``max_hbm_utilization``: no rank uses more than this fraction of its usable memory in
  the tier tables live in (the report's ``over_limit``; a failure is ``over_limit``).
- ``require_kernels``: every table on one of these kernels (``fused``: nothing leaves HBM).
- ``max_step_ms``: the predicted step time (the slowest rank) at most this.
- ``max_regression``: the predicted step time at most this fraction above the baseline's.

Every gate is evaluated and listed, passed or not, so a report names each failure; a
request without a plan fails them all unevaluated (``value`` null). One implementation for
``shardplan check`` and POST /v1/check.
"""

from __future__ import annotations

from planner_service.check.baseline import Baseline, compare
from planner_service.plan.api import (
    BaselineComparison,
    CheckGates,
    CheckReport,
    GateName,
    GateResult,
    Verdict,
)
from planner_service.plan.types import ComputeKernel, PlanRequest, ShardingPlan

_SHOWN = 5  # tables named in a failed require_kernels


class GateError(ValueError):
    """Gates that cannot be evaluated as given: ``field`` names the option."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def kernels_of(text: str) -> list[ComputeKernel]:
    """``"fused,dense"`` -> the compute kernels named, each once; a GateError naming
    ``require_kernels`` and the kernels there are, for a name that is none."""
    kernels: list[ComputeKernel] = []
    for item in text.split(","):
        try:
            kernel = ComputeKernel(item.strip())
        except ValueError:
            accepted = ", ".join(k.value for k in ComputeKernel)
            raise GateError(
                "require_kernels", f"{item.strip()!r} is not a compute kernel ({accepted})"
            ) from None
        if kernel not in kernels:
            kernels.append(kernel)
    return kernels


def check_gates(gates: CheckGates, baseline: Baseline | None) -> None:
    """Refuse gates that need what was not given: ``max_regression`` needs a baseline."""
    if gates.max_regression is not None and baseline is None:
        raise GateError(
            "max_regression",
            "max_regression compares the plan with a baseline; give the baseline (a plan "
            "file, a plan id or alias:NAME) too",
        )


def apply_gates(
    report: CheckReport,
    request: PlanRequest,
    plan: ShardingPlan | None,
    gates: CheckGates,
    baseline: Baseline | None = None,
) -> CheckReport:
    """``report`` with ``gates`` evaluated, the comparison with ``baseline`` (when there
    is a plan to compare), ``passed`` and the verdict."""
    check_gates(gates, baseline)
    comparison = (
        compare(request, plan, baseline) if plan is not None and baseline is not None else None
    )
    results = list(report.gates)  # max_hbm_utilization's, from the report
    if gates.require_kernels is not None:
        results.append(_kernels(plan, gates.require_kernels))
    if gates.max_step_ms is not None:
        results.append(_step(report, gates.max_step_ms))
    if gates.max_regression is not None:
        results.append(_regression(comparison, gates.max_regression))
    passed = report.fits and all(result.passed for result in results)
    verdict = report.verdict
    if verdict is Verdict.FITS and not passed:
        verdict = Verdict.GATE_FAILED
    return report.model_copy(
        update={"gates": results, "passed": passed, "verdict": verdict, "baseline": comparison}
    )


def utilization_gate(limit: float, fullest: float | None) -> GateResult:
    """``max_hbm_utilization``'s result: ``fullest`` is the fullest rank's utilization."""
    passed = fullest is not None and fullest <= limit
    value = "no plan" if fullest is None else f"the fullest rank uses {fullest:.1%}"
    return GateResult(
        gate=GateName.MAX_HBM_UTILIZATION,
        passed=passed,
        limit=limit,
        value=fullest,
        message=f"{value} of its usable memory; the limit is {limit:.1%}",
    )


def _kernels(plan: ShardingPlan | None, allowed: list[ComputeKernel]) -> GateResult:
    names = ", ".join(str(k) for k in allowed)
    if plan is None:
        return GateResult(
            gate=GateName.REQUIRE_KERNELS,
            passed=False,
            limit=allowed,
            value=None,
            message=f"no plan to hold to the kernels {names}",
        )
    others = sorted(
        (name, s.compute_kernel.value)
        for name, s in plan.tables.items()
        if s.compute_kernel not in allowed
    )
    shown = ", ".join(f"{name} ({kernel})" for name, kernel in others[:_SHOWN])
    more = f" and {len(others) - _SHOWN} more" if len(others) > _SHOWN else ""
    message = (
        f"every table is on {names}"
        if not others
        else f"{len(others)} table(s) on other kernels than {names}: {shown}{more}"
    )
    return GateResult(
        gate=GateName.REQUIRE_KERNELS,
        passed=not others,
        limit=list(allowed),  # type: ignore[arg-type]
        value=float(len(others)),
        message=message,
    )


def _step(report: CheckReport, limit_ms: float) -> GateResult:
    step = report.step_ms
    if step is None:
        message = f"no plan, so no step time to hold to {limit_ms:.4g} ms"
    else:
        message = f"predicted step time {step:.4g} ms; the limit is {limit_ms:.4g} ms"
    return GateResult(
        gate=GateName.MAX_STEP_MS,
        passed=step is not None and step <= limit_ms,
        limit=limit_ms,
        value=step,
        message=message,
    )


def _regression(comparison: BaselineComparison | None, limit: float) -> GateResult:
    if comparison is None:
        return GateResult(
            gate=GateName.MAX_REGRESSION,
            passed=False,
            limit=limit,
            value=None,
            message="no plan to compare with the baseline",
        )
    change = comparison.change
    return GateResult(
        gate=GateName.MAX_REGRESSION,
        passed=change <= limit,
        limit=limit,
        value=change,
        message=(
            f"predicted step time {comparison.plan_step_ms:.4g} ms against the baseline's "
            f"{comparison.step_ms:.4g} ms: {change_words(change)}; the limit is "
            f"{limit:.1%} slower"
        ),
    )


def change_words(change: float) -> str:
    """A relative change of step time in words: "3.2% slower", "2.5% faster", "133x
    slower" (past doubling, a ratio reads better than thousands of percent)."""
    if change >= 1:
        return f"{change + 1:.3g}x slower"
    return f"{abs(change):.1%} {'slower' if change >= 0 else 'faster'}"
