"""Solving one request in the solve pool (``pool.py``) for a route: for POST /v1/plans and
its jobs (``solve_and_store``: the plan is stored) and for POST /v1/check (``solve_only``),
with the stored plan and profile a request names by id inlined first (``references.py``);
and the problems a solve answers with (503 ``unavailable``, 422 ``no_plan``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace

from planner_service import PLANNER_VERSION
from planner_service.plan.api import PlanSummary
from planner_service.plan.types import (
    Infeasibility,
    InfeasibilityCode,
    InfeasibilityReason,
    SolverStatus,
)
from planner_service.service.http import metrics
from planner_service.service.http.metrics import CacheLookup
from planner_service.service.http.problems import ProblemError
from planner_service.service.solver.decoded import DecodedRequest
from planner_service.service.solver.pool import (
    PoolFullError,
    ShuttingDownError,
    SolveOutcome,
    SolveResult,
    SolveUnavailableError,
    T,
    WaitedOutError,
)
from planner_service.service.solver.references import with_stored_references
from planner_service.service.state import ServiceState
from planner_service.service.store import NewPlan, PlanBodies, PlanStore


async def solve_and_store(state: ServiceState, request: DecodedRequest) -> tuple[SolveResult, bool]:
    """The solve's result, and whether this call stored a new plan (not when an identical
    request in flight shared the solve, nor when the plan was already stored). The plan is
    stored by the solve itself, so it is kept even when this caller has gone away. When
    the request's key holds a planner plan already (stored by another replica, or a sync
    POST while a job's process was gone), the result is that plan: one key, one answer."""
    store = state.store()
    request = await with_stored_references(state, request)
    key = request.request_hash

    def finish(result: SolveResult) -> tuple[SolveResult, bool]:
        if result.plan is None or result.plan_id is None or result.summary is None:
            return result, False
        bodies = PlanBodies.of(result.plan)
        planned = store.plans.put_planned(
            NewPlan(
                result.plan_id,
                key,
                PLANNER_VERSION,
                request.document,
                result.plan,
                result.summary,
                bodies,
            )
        )
        if planned.plan_id != result.plan_id:
            return _stored_instead(store, result, planned.plan_id), False
        state.cache.put(result.plan_id, bodies)
        return result, planned.inserted

    (result, inserted), shared = await _solve(state, "plan:" + key, request, finish)
    metrics.cache_counter(CacheLookup.SHARED if shared else CacheLookup.MISS).inc()
    return result, inserted and not shared


def _stored_instead(store: PlanStore, result: SolveResult, plan_id: str) -> SolveResult:
    """The result, holding the plan its key held already instead of the one just solved
    (which is not stored)."""
    bodies = store.plans.bodies(plan_id)
    assert bodies is not None  # stored plans are never deleted
    summary = PlanSummary.of_stored(bodies.identity)
    return replace(result, plan_id=plan_id, plan=bodies.identity, summary=summary)


async def solve_only(state: ServiceState, request: DecodedRequest) -> SolveResult:
    request = await with_stored_references(state, request)
    result, _ = await _solve(state, "check:" + request.request_hash, request, _same)
    return result


def _same(result: SolveResult) -> SolveResult:
    return result


async def _solve(
    state: ServiceState,
    key: str,
    request: DecodedRequest,
    finish: Callable[[SolveResult], T],
) -> tuple[T, bool]:
    """Solve in the pool (timing every solve once), or 503 when the pool is full, the
    solve overran its time limit, its solver process died or the service is stopping.
    What the request has spent of its time limit so far is taken off the solver's."""

    def timed(result: SolveResult) -> T:
        outcome = SolveOutcome.PLAN if result.plan is not None else SolveOutcome.NO_PLAN
        metrics.SOLVE_SECONDS.labels(outcome.value).observe(result.wall_time_s)
        return finish(result)

    try:
        return await state.pool.solve(
            key,
            request.document,
            request.time_limit_s,
            timed,
            spent_s=request.spent_s,
            wait_counts=request.wait_counts,
        )
    except WaitedOutError as error:
        return finish(waited_out(error)), False
    except SolveUnavailableError as error:
        if isinstance(error, PoolFullError):
            metrics.REJECTED.inc()
        raise unavailable(error) from None
    except asyncio.CancelledError:
        # uvicorn cancels the requests still running when its graceful shutdown period
        # ends, and the pool kills their solves next: say so, rather than uvicorn's bare 500.
        raise unavailable(ShuttingDownError()) from None


def waited_out(error: WaitedOutError) -> SolveResult:
    """The answer to a request that waited its whole time limit for a solver process: no
    plan was searched for, and it says why and what to change (``no_plan`` makes it 422)."""
    reason = InfeasibilityReason(
        code=InfeasibilityCode.TIMED_OUT,
        message=(
            f"this request waited {error.waited_s:.2f} s for a free solver process (all "
            f"{error.workers} were busy), its whole options.time_limit_s = "
            f"{error.time_limit_s:g} s, which counts from the request's arrival, so no plan "
            "was searched for; ask again when the service is less busy, give a longer "
            "time_limit_s, or submit it as an async job (Prefer: respond-async), whose "
            "time limit counts from when it starts solving"
        ),
    )
    infeasibility = Infeasibility(status=SolverStatus.NO_SOLUTION_IN_TIME, reasons=[reason])
    return SolveResult(None, None, infeasibility.model_dump_json().encode(), 0.0)


def unavailable(error: SolveUnavailableError) -> ProblemError:
    return ProblemError(
        503,
        f"{error}; retry in {error.retry_after_s} s",
        title=error.title,
        headers={"Retry-After": str(error.retry_after_s)},
        **error.extensions,
    )


def no_plan(result: SolveResult) -> ProblemError:
    """422 with the reasons and the smallest fixes, for a solve that found no plan."""
    assert result.infeasibility is not None
    infeasibility = Infeasibility.model_validate_json(result.infeasibility)
    infeasible = infeasibility.status is SolverStatus.INFEASIBLE
    return ProblemError(
        422,
        infeasibility.render(),
        title="No plan exists" if infeasible else "No plan found",
        infeasibility=json.loads(result.infeasibility),
    )
