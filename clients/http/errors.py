"""The client's exceptions: one hierarchy, so that a caller can catch as broadly or as
narrowly as it needs::

    PlannerError                    anything this client raises about the service
    ├── PlannerHTTPError            the service answered with an error (problem+json)
    │   ├── BadRequest              400, 413, 422 and other 4xx about the input
    │   │   ├── NoPlanFound         422: no plan exists for the request (.infeasibility)
    │   │   └── InvalidPlan         422: a plan breaks its request (.violations)
    │   ├── Unauthorized            401: no token, or reads are protected
    │   ├── Forbidden               403: a token the service does not accept
    │   ├── NotFound                404: no such plan, alias or profile, or no plan id
    │   │                                starts with the prefix asked for
    │   ├── Conflict                409: a plan put at an address that is not its own, or
    │   │                                a plan id prefix that more than one plan starts with
    │   ├── Overloaded              429, 503: busy or down for now (see retry_after_s)
    │   └── ServerError             500, 502, 504 and other 5xx
    ├── IntegrityError              a plan or profile whose content is not what its id addresses
    ├── UnexpectedResponse          a success whose body is not the document expected
    └── PlannerUnavailable          no answer after every retry (.attempts, .last_error)

Invalid arguments (a request that is not a PlanRequest, a malformed plan id) raise
``planner_service.plan.errors.InputError`` (a ``ValueError`` naming the field) before
anything is sent.

``PlannerHTTPError`` carries the problem's RFC 9457 members as attributes (``type``,
``title``, ``status``, ``detail``) and every extension member too (``errors``,
``infeasibility``, ``violations``, ``computed_plan_id``...); ``problem`` is the whole
document.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from planner_service.plan.types import Infeasibility, Violation

if TYPE_CHECKING:  # httpx only when a request is made: a cached plan needs none
    import httpx

__all__ = [
    "BadRequest",
    "Conflict",
    "Forbidden",
    "IntegrityError",
    "InvalidPlan",
    "NoPlanFound",
    "NotFound",
    "Overloaded",
    "PlannerError",
    "PlannerHTTPError",
    "PlannerUnavailable",
    "ServerError",
    "Unauthorized",
    "UnexpectedResponse",
]

_DETAIL_CHARS = 500


class PlannerError(Exception):
    """Base of every error this client raises about the service and its answers."""


class PlannerHTTPError(PlannerError):
    """The service answered with an error status. Built by ``from_response``."""

    type: str
    title: str
    status: int
    detail: str

    def __init__(
        self,
        method: str,
        url: str,
        status: int,
        problem: dict[str, Any],
        retry_after_s: float | None,
    ) -> None:
        for key, value in problem.items():  # extension members as attributes
            if key.isidentifier() and not _reserved(type(self), key):
                setattr(self, key, value)
        self.method = method
        self.url = url
        self.problem = problem
        self.retry_after_s = retry_after_s
        self.type = str(problem.get("type", "about:blank"))
        self.title = str(problem.get("title", _reason(status)))
        self.status = status
        self.detail = str(problem.get("detail", ""))
        super().__init__(f"{method} {url}: {status} {self.title}: {self.detail}")

    @classmethod
    def from_response(
        cls, response: httpx.Response, retry_after_s: float | None = None
    ) -> PlannerHTTPError:
        """The error for a response with a 4xx or 5xx status, of the most specific class."""
        problem = _problem(response)
        kind = _class_for(response.status_code, problem)
        request = response.request
        return kind(request.method, str(request.url), response.status_code, problem, retry_after_s)

    @classmethod
    def from_problem(cls, method: str, url: str, problem: dict[str, Any]) -> PlannerHTTPError:
        """The error a problem document names (an async solve's ``problem``), of the
        class its ``status`` would have had as a response."""
        status = problem.get("status")
        status = status if isinstance(status, int) and 400 <= status < 600 else 500
        return _class_for(status, problem)(method, url, status, problem, None)


class BadRequest(PlannerHTTPError):
    """The input was refused (400, 413, 422...): retrying the same input cannot help.
    ``errors`` lists each bad field (``path``, ``message``, ``value``) when the service
    named them."""

    errors: list[dict[str, str]] | None = None


class NoPlanFound(BadRequest):
    """No plan exists for the request (or none was found in its time limit)."""

    @property
    def infeasibility(self) -> Infeasibility:
        """The reasons and the smallest fixes, as the planner reports them."""
        return Infeasibility.model_validate(self.problem["infeasibility"])


class InvalidPlan(BadRequest):
    """A plan put to the service breaks its request; nothing was stored."""

    @property
    def violations(self) -> list[Violation]:
        return [Violation.model_validate(item) for item in self.problem["violations"]]


class Unauthorized(PlannerHTTPError):
    """401: the route needs ``token=`` (one of the service's SHARDPLAN_API_TOKENS)."""


class Forbidden(PlannerHTTPError):
    """403: the service does not accept this token."""


class NotFound(PlannerHTTPError):
    """404: no plan with this id (or none whose id starts with this prefix), or no alias
    with this name, is stored."""


class Conflict(PlannerHTTPError):
    """409: a plan whose content address is not the id it was put at (``path_plan_id``,
    ``plan_id``, what the plan says, and ``computed_plan_id`` name the three); or a plan id
    prefix more than one stored plan starts with (``prefix``, ``matching_plan_ids``: the
    first 10 in id order, ``more_matching``: whether there are others)."""


class Overloaded(PlannerHTTPError):
    """429 or 503: the service is busy or its store is down, for now. Retried by the
    client; raised only as ``PlannerUnavailable.last_error`` once retries are spent."""


class ServerError(PlannerHTTPError):
    """A 5xx other than 503 (500: a bug on the service, logged there; 502, 504: a proxy
    in front of it got no answer)."""


class IntegrityError(PlannerError):
    """A plan whose bytes do not hash to its ``plan_id``, or not to the id asked for: it
    was changed or damaged after the planner sealed it; a device profile whose content
    address is not the ``profile_id`` asked for; or a body that cannot be decoded as its
    ``Content-Encoding`` says (damaged gzip). It is neither returned nor cached."""

    def __init__(
        self,
        message: str,
        *,
        expected_plan_id: str | None,
        plan_id: str | None,
        expected_profile_id: str | None = None,
        profile_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.expected_plan_id = expected_plan_id
        self.plan_id = plan_id
        self.expected_profile_id = expected_profile_id
        self.profile_id = profile_id


class UnexpectedResponse(PlannerError):
    """A success status whose body is not the document the route documents (a proxy's
    page, a truncated body, a service of another version)."""


class PlannerUnavailable(PlannerError):
    """No answer after every attempt: the service is down, unreachable or overloaded.
    ``attempts`` were made over ``elapsed_s``; ``last_error`` is the last failure (an
    ``httpx.TransportError`` or a ``PlannerHTTPError``), also this error's ``__cause__``."""

    def __init__(
        self, method: str, url: str, *, attempts: int, elapsed_s: float, last_error: Exception
    ) -> None:
        super().__init__(
            f"{method} {url}: no answer after {attempts} attempt(s) over {elapsed_s:.1f} s; "
            f"last: {_describe(last_error)}"
        )
        self.method = method
        self.url = url
        self.attempts = attempts
        self.elapsed_s = elapsed_s
        self.last_error = last_error


def _reserved(kind: type, name: str) -> bool:
    """Names a problem member may not set: the exception's own methods and properties."""
    return hasattr(PlannerHTTPError, name) or isinstance(getattr(kind, name, None), property)


def _describe(error: Exception) -> str:
    text = str(error) or "(no message)"
    return text if isinstance(error, PlannerHTTPError) else f"{type(error).__name__}: {text}"


def _problem(response: httpx.Response) -> dict[str, Any]:
    """The problem+json document, or one made from whatever else the body holds."""
    try:
        document = json.loads(response.content)
    except (ValueError, UnicodeDecodeError):
        document = None
    if isinstance(document, dict):
        return document
    text = response.content.decode("utf-8", "replace").strip()[:_DETAIL_CHARS]
    return {
        "title": _reason(response.status_code) or "Error",
        "status": response.status_code,
        "detail": text or "(empty body)",
    }


_BY_STATUS: dict[int, type[PlannerHTTPError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    429: Overloaded,
    503: Overloaded,
}


def _class_for(status: int, problem: dict[str, Any]) -> type[PlannerHTTPError]:
    if status == 422 and isinstance(problem.get("infeasibility"), dict):
        return NoPlanFound
    if status == 422 and isinstance(problem.get("violations"), list):
        return InvalidPlan
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return ServerError if status >= 500 else BadRequest


def validation_summary(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(document)"
    return f"{error.error_count()} problem(s), first at {where}: {first['msg']}"


def _reason(status: int) -> str:
    """The standard reason phrase of an HTTP status ("" when there is none)."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""
