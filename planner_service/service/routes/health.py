"""Liveness, readiness and metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from planner_service.service.deps import State
from planner_service.service.http import metrics
from planner_service.service.http.problems import ProblemError
from planner_service.service.store import StoreUnavailableError

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up and serving."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(state: State) -> dict[str, str]:
    """Ready to serve: the plan store answers a query."""
    try:
        await run_in_threadpool(lambda: state.store().ping())
    except StoreUnavailableError as error:
        raise ProblemError(
            503, f"the plan store is unreachable: {error}", headers={"Retry-After": "5"}
        ) from None
    return {"status": "ready", "store": type(state.store()).__name__}


@router.get("/metrics", response_class=Response)
def prometheus_metrics() -> Response:
    """Prometheus text format: requests by route and status, latency histograms, solve
    durations, plan cache results, solve queue depth."""
    body, content_type = metrics.render()
    return Response(body, media_type=content_type)
