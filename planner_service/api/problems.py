"""RFC 9457 problem+json responses: every error the API returns has this shape."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from planner_service.errors import InputError

PROBLEM_MEDIA_TYPE = "application/problem+json"


def problem(status: int, title: str, detail: str, **extensions: Any) -> JSONResponse:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    body.update(extensions)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE)


def input_problem(error: InputError) -> JSONResponse:
    """422 naming every bad field by JSON path, with the value and what is accepted."""
    errors = [field_problem.as_dict() for field_problem in error.problems]
    return problem(422, "Invalid input", error.render(), errors=errors)
