"""RFC 9457 problem+json responses: every error the API returns has this shape, from the
exception handlers installed here by ``add_exception_handlers``."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from planner_service.plan.errors import FieldProblem, InputError, json_path
from planner_service.service.http.metrics import CLIENT_CLOSED
from planner_service.service.http.openapi import JsonObject, schema_ref
from planner_service.service.store import StoreUnavailableError

log = logging.getLogger("shardplan.api")

PROBLEM_MEDIA_TYPE = "application/problem+json"

TITLES = {
    304: "Not Modified",
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Content too large",
    415: "Unsupported media type",
    422: "Invalid input",
    431: "Request header fields too large",
    499: "Client closed request",
    500: "Internal error",
    503: "Service unavailable",
}


class Problem(BaseModel):
    """RFC 9457 problem details, with shardplan's extensions."""

    model_config = ConfigDict(extra="allow")
    type: str = "about:blank"
    title: str
    status: int
    detail: str
    errors: list[dict[str, str]] | None = Field(
        None, description="for invalid input: one entry per bad field (path, message, value)"
    )
    infeasibility: JsonObject | None = Field(
        None, description="when no plan exists: the reasons and the smallest fixes"
    )
    violations: list[JsonObject] | None = Field(
        None, description="for a plan that breaks its request: every violation (code, message)"
    )
    time_limit_s: float | None = Field(
        None, description="when a solve overran: the request's options.time_limit_s"
    )
    grace_s: float | None = Field(
        None,
        description="when a solve overran: how long past its time limit the service let it "
        "run before killing its solver process (SHARDPLAN_SOLVE_GRACE_S)",
    )


PROBLEM_CONTENT: JsonObject = {"content": {PROBLEM_MEDIA_TYPE: {"schema": schema_ref(Problem)}}}

# Errors any route can answer with, documented once for the whole API.
COMMON_PROBLEMS: dict[int | str, JsonObject] = {
    401: {"description": "no bearer token (when SHARDPLAN_API_TOKENS is set)", **PROBLEM_CONTENT},
    403: {"description": "a bearer token this service does not accept", **PROBLEM_CONTENT},
    413: {"description": "request body over SHARDPLAN_MAX_BODY_BYTES", **PROBLEM_CONTENT},
    422: {"description": "invalid input: every bad field by JSON path", **PROBLEM_CONTENT},
    503: {
        "description": "overloaded, a solve overran its time limit or lost its process, or "
        "the store is down; see Retry-After",
        **PROBLEM_CONTENT,
    },
}


SOLVE_UNAVAILABLE = (
    "no answer for now, see Retry-After: the solver pool and its queue are full, the "
    "solve overran options.time_limit_s plus SHARDPLAN_SOLVE_GRACE_S (its process was "
    "killed), its solver process died, or the store is down"
)
UNAVAILABLE_RETRY_S = 5


class ProblemError(Exception):
    """Raised by routes and dependencies; rendered as problem+json by the app."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        title: str | None = None,
        headers: dict[str, str] | None = None,
        **extensions: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.title = title or TITLES.get(status, "Error")
        self.headers = headers or {}
        self.extensions = extensions

    def response(self) -> JSONResponse:
        return problem(
            self.status, self.title, self.detail, headers=self.headers, **self.extensions
        )

    def document(self) -> JsonObject:
        """The problem+json document, as ``response`` sends it."""
        return problem_document(self.status, self.title, self.detail, **self.extensions)


def problem_document(status: int, title: str, detail: str, **extensions: Any) -> JsonObject:
    return {"type": "about:blank", "title": title, "status": status, "detail": detail, **extensions}


def problem(
    status: int,
    title: str,
    detail: str,
    *,
    headers: dict[str, str] | None = None,
    **extensions: Any,
) -> JSONResponse:
    body = problem_document(status, title, detail, **extensions)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def input_problem(error: InputError) -> JSONResponse:
    """422 naming every bad field by JSON path, with the value and what is accepted."""
    return problem(422, "Invalid input", error.render(), errors=field_errors(error.problems))


def field_errors(problems: list[FieldProblem]) -> list[dict[str, str]]:
    return [field_problem.as_dict() for field_problem in problems]


def store_unavailable(error: StoreUnavailableError) -> ProblemError:
    return ProblemError(
        503,
        f"the plan store is unavailable: {error}",
        headers={"Retry-After": str(UNAVAILABLE_RETRY_S)},
    )


def add_exception_handlers(app: FastAPI) -> None:
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
        return _validation_problem(error)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return problem(
            error.status_code,
            TITLES.get(error.status_code, "Error"),
            str(error.detail),
            headers=dict(error.headers or {}),
        )

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, _: ClientDisconnect) -> JSONResponse:
        """The client went away before its body arrived: counted as 499, one line at info
        (a flaky network is not a server error, and no one is left to answer)."""
        log.info("client went away during %s %s", request.method, request.url.path)
        return problem(CLIENT_CLOSED, TITLES[CLIENT_CLOSED], "the client closed the connection")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return problem(500, "Internal error", f"{type(error).__name__}: see the server log")


def _validation_problem(error: RequestValidationError) -> JSONResponse:
    """FastAPI's own validation (path parameters) in the words of ``input_problem``."""
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
