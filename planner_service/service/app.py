"""Assembles the FastAPI application; routes live in ``routes/``.

``create_app`` is also uvicorn's factory (``planner_service.service.app:create_app``), so
every worker process builds its own app, store connections and solve pool from the same
environment (see ``settings.py``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from planner_service import __version__
from planner_service.plan.errors import InputError, json_path
from planner_service.service.limits import BodyLimitMiddleware
from planner_service.service.metrics import QUEUE_DEPTH, SOLVE_SECONDS, MetricsMiddleware
from planner_service.service.problems import (
    COMMON_PROBLEMS,
    TITLES,
    ProblemError,
    input_problem,
    problem,
)
from planner_service.service.routes import aliases, check, health, plans, validate
from planner_service.service.schemas import add_components
from planner_service.service.settings import SUPERVISOR_PID_VARIABLE, Settings
from planner_service.service.solving import SolvePool, die_with_parent
from planner_service.service.state import PlanCache, ServiceState, store_unavailable
from planner_service.service.store import StoreUnavailableError

log = logging.getLogger("shardplan.api")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()
    pool = SolvePool(
        settings.solve_workers,
        settings.solve_queue,
        grace_s=settings.solve_grace_s,
        on_depth=QUEUE_DEPTH.set,
        on_failure=lambda outcome, seconds: SOLVE_SECONDS.labels(outcome).observe(seconds),
    )
    state = ServiceState(settings=settings, pool=pool, cache=PlanCache(settings.cache_bytes))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        _die_with_supervisor()
        try:
            state.store()
        except StoreUnavailableError as error:  # serve anyway; /readyz says why
            log.warning("plan store not reachable at start: %s", error)
        state.pool.start()
        state.cpu.start()
        yield
        state.close()

    app = FastAPI(
        title="shardplan planner",
        version=__version__,
        description="Plans embedding-table sharding for DLRM-style models and serves the plans.",
        lifespan=lifespan,
        responses=COMMON_PROBLEMS,
    )
    app.state.service = state
    for router in (health.router, plans.router, aliases.router, check.router, validate.router):
        app.include_router(router)
    _install_error_handlers(app)
    _document_raw_bodies(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(MetricsMiddleware)
    return app


def _die_with_supervisor() -> None:
    """Under ``shardplan serve --workers N`` this process is one of uvicorn's workers. If
    the supervisor is SIGKILLed (no cleanup runs), this worker must go too, and with it
    its solver processes (which die with it the same way)."""
    supervisor_pid = os.environ.get(SUPERVISOR_PID_VARIABLE)
    if supervisor_pid:
        die_with_parent(int(supervisor_pid))


def _document_raw_bodies(app: FastAPI) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = add_components(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ProblemError)
    async def _problem(_: Request, error: ProblemError) -> JSONResponse:
        return error.response()

    @app.exception_handler(InputError)
    async def _input(_: Request, error: InputError) -> JSONResponse:
        return input_problem(error)

    @app.exception_handler(StoreUnavailableError)
    async def _store(_: Request, error: StoreUnavailableError) -> JSONResponse:
        log.error("plan store unavailable: %s", error)
        return store_unavailable(error).response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, error: RequestValidationError) -> JSONResponse:
        errors = []
        for item in error.errors():
            loc = tuple(item.get("loc", ()))
            # ("path", "plan_id") -> "plan_id"; the first element says where it came from
            where, rest = (loc[0], loc[1:]) if loc else ("", ())
            entry = {"path": json_path(rest), "in": str(where), "message": str(item.get("msg"))}
            if "input" in item and not isinstance(item["input"], dict | list):
                entry["value"] = repr(item["input"])[:80]
            errors.append(entry)
        detail = "; ".join(
            f"{e['in']} {e['path']}"
            + (f" = {e['value']}" if "value" in e else "")
            + f": {e['message']}"
            for e in errors
        )
        return problem(422, "Invalid input", detail, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return problem(
            error.status_code,
            TITLES.get(error.status_code, "Error"),
            str(error.detail),
            headers=dict(error.headers or {}),
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return problem(500, "Internal error", f"{type(error).__name__}: see the server log")
