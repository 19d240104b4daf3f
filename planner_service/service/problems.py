"""RFC 9457 problem+json responses: every error the API returns has this shape."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from planner_service.plan.errors import FieldProblem, InputError
from planner_service.service.schemas import schema_ref

PROBLEM_MEDIA_TYPE = "application/problem+json"

TITLES = {
    304: "Not Modified",
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    413: "Content too large",
    415: "Unsupported media type",
    422: "Invalid input",
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
    infeasibility: dict[str, Any] | None = Field(
        None, description="when no plan exists: the reasons and the smallest fixes"
    )
    time_limit_s: float | None = Field(
        None, description="when a solve overran: the request's options.time_limit_s"
    )
    grace_s: float | None = Field(
        None,
        description="when a solve overran: how long past its time limit the service let it "
        "run before killing its solver process (SHARDPLAN_SOLVE_GRACE_S)",
    )


PROBLEM_CONTENT: dict[str, Any] = {"content": {PROBLEM_MEDIA_TYPE: {"schema": schema_ref(Problem)}}}

# Errors any route can answer with, documented once for the whole API.
COMMON_PROBLEMS: dict[int | str, dict[str, Any]] = {
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


def problem(
    status: int,
    title: str,
    detail: str,
    *,
    headers: dict[str, str] | None = None,
    **extensions: Any,
) -> JSONResponse:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    body.update(extensions)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def input_problem(error: InputError) -> JSONResponse:
    """422 naming every bad field by JSON path, with the value and what is accepted."""
    return problem(422, "Invalid input", error.render(), errors=field_errors(error.problems))


def field_errors(problems: list[FieldProblem]) -> list[dict[str, str]]:
    return [field_problem.as_dict() for field_problem in problems]
