"""POST /v1/check: does this request fit, and does its plan pass the gates a team sets?
A capacity check for CI that stores nothing: the report ``shardplan check --format json``
prints, from the same analysis (``planner_service/check``), with the gates as query
parameters of the CLI options' names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool

from planner_service.check.baseline import Baseline
from planner_service.check.gates import GateError, apply_gates, check_gates, kernels_of
from planner_service.check.report import check_report, check_result
from planner_service.plan.api import CheckGates, CheckResult
from planner_service.plan.codec import parse_plan
from planner_service.plan.types import ComputeKernel, Infeasibility, PlanRequest
from planner_service.service.deps import State, reader
from planner_service.service.http.clock import received_at
from planner_service.service.http.openapi import REQUEST_EXAMPLE, json_body
from planner_service.service.http.problems import PROBLEM_CONTENT, SOLVE_UNAVAILABLE, ProblemError
from planner_service.service.plan_ids import Where, resolve_plan_id
from planner_service.service.solver.decoded import DecodedRequest, parse
from planner_service.service.solver.references import decode_request, with_stored_references
from planner_service.service.solver.run import solve_only

router = APIRouter(tags=["plans"])

_ALIAS = r"alias:[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
BASELINE_PATTERN = rf"^(?:[0-9a-f]{{8,64}}|{_ALIAS})$"
_KERNELS = ", ".join(kernel.value for kernel in ComputeKernel)


@router.post(
    "/v1/check",
    response_model=CheckResult,
    dependencies=[Depends(reader)],
    openapi_extra=json_body(PlanRequest, REQUEST_EXAMPLE),
    responses={
        404: {"description": "the baseline plan or alias is unknown", **PROBLEM_CONTENT},
        503: {"description": SOLVE_UNAVAILABLE, **PROBLEM_CONTENT},
    },
)
async def check(
    http_request: Request,
    state: State,
    max_hbm_utilization: Annotated[
        float | None,
        Query(gt=0, le=1, description="fail when a rank uses more of its usable memory"),
    ] = None,
    require_kernels: Annotated[
        str | None,
        Query(
            max_length=200,
            description=f"comma-separated compute kernels ({_KERNELS}); fail when a table is "
            "on another (fused: nothing may leave HBM)",
        ),
    ] = None,
    max_step_ms: Annotated[
        float | None,
        Query(gt=0, le=1e9, description="fail when the predicted step time is above this"),
    ] = None,
    baseline: Annotated[
        str | None,
        Query(
            pattern=BASELINE_PATTERN,
            description="compare with this stored plan: its id (or a unique prefix of 8 or "
            "more hex digits), or alias:NAME",
        ),
    ] = None,
    max_regression: Annotated[
        float | None,
        Query(
            ge=0,
            le=100,
            description="fail when the predicted step time is more than this fraction above "
            "the baseline's (0.05: 5%); needs baseline",
        ),
    ] = None,
) -> CheckResult:
    """Solve without storing and report whether it fits and passes the gates: where the
    bytes live, each rank's headroom, what binds the plan, the comparison with a baseline,
    every gate with its numbers; or, when no plan exists, why and the smallest fixes. 200
    whatever the verdict (``passed`` says it), and whether the plan is stored."""
    gates = CheckGates(
        max_hbm_utilization=max_hbm_utilization,
        require_kernels=_kernels(require_kernels) if require_kernels is not None else None,
        max_step_ms=max_step_ms,
        max_regression=max_regression,
    )
    if max_regression is not None and baseline is None:
        raise _bad_query("max_regression", str(max_regression), "needs baseline to compare with")
    # Decoding, inlining, the report and the baseline's plan take time in proportion to
    # the request and the plans: all in the CPU lane, never on the event loop.
    request = await decode_request(state, await http_request.body(), received_at(http_request))
    # The report prices the plan, so it needs the profile a request names by id.
    request = await with_stored_references(state, request)
    chosen = await _baseline(state, baseline) if baseline is not None else None
    existing = await state.plan_for_request(request.request_hash)
    if existing is not None:
        return await state.cpu.run(_check, request, _Solved(existing[1]), gates, chosen, True)
    result = await solve_only(state, request)
    solved = _Solved(result.plan, result.infeasibility)
    return await state.cpu.run(_check, request, solved, gates, chosen, False)


@dataclass(frozen=True)
class _Solved:
    """What the check reports on, as bytes: the plan, or why there is none."""

    plan: bytes | None
    infeasibility: bytes | None = None


@dataclass(frozen=True)
class _BaselineDocument:
    """A stored plan to compare with, as bytes, and how the query named it."""

    plan: bytes
    source: str
    imported: bool


def _check(
    decoded: DecodedRequest,
    solved: _Solved,
    gates: CheckGates,
    baseline: _BaselineDocument | None,
    stored: bool,
) -> CheckResult:
    """The check of a plan or of its absence, run in a CPU-lane worker: work in proportion
    to the request and world_size."""
    request = parse(decoded)
    chosen = (
        Baseline(
            parse_plan(baseline.plan, source="baseline"),
            baseline.source,
            imported=baseline.imported,
        )
        if baseline
        else None
    )
    check_gates(gates, chosen)
    plan = parse_plan(solved.plan) if solved.plan is not None else None
    infeasibility = None
    if plan is None:
        assert solved.infeasibility is not None
        infeasibility = Infeasibility.model_validate_json(solved.infeasibility)
    report = check_report(
        request, plan, infeasibility, max_hbm_utilization=gates.max_hbm_utilization
    )
    return check_result(apply_gates(report, request, plan, gates, chosen), stored=stored)


def _kernels(text: str) -> list[ComputeKernel]:
    try:
        return kernels_of(text)
    except GateError as error:
        raise _bad_query(error.field, text, str(error)) from None


async def _baseline(state: State, text: str) -> _BaselineDocument:
    """The stored plan ``text`` names (an id or a unique prefix of one, or alias:NAME: the
    plan it points at now)."""
    if text.startswith("alias:"):
        name = text.removeprefix("alias:")
        current = await run_in_threadpool(state.store().aliases.get, name)
        if current is None:
            raise ProblemError(404, f"query baseline = {text!r}: no alias named {name!r}")
        plan_id = current.plan_id
    else:
        plan_id = (await resolve_plan_id(state, text, where=Where.QUERY, field="baseline")).plan_id
    responses = await state.plan_responses(plan_id)
    if responses is None:
        raise ProblemError(404, f"query baseline = {text!r}: no plan with this id is stored")
    return _BaselineDocument(responses.bodies.identity, text, imported=responses.imported)


def _bad_query(name: str, value: str, message: str) -> ProblemError:
    return ProblemError(
        422,
        f"query {name} = {value[:80]!r}: {message}",
        errors=[{"path": name, "in": "query", "message": message, "value": value[:80]}],
    )
