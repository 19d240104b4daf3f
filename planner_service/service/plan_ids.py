"""Plan ids in requests: a full id, or a unique prefix of one (``plan.plan_ids``), resolved
against the store to the one plan it names.

A full id is taken as it is, with no lookup, so every route answers it byte for byte as
before (an unknown one is the route's own 404). A prefix costs one range scan of the
primary key (``Plans.ids_starting_with``): no stored id starting with it is a 404 in a path
(422 in a body, which names the field), more than one a 409 listing them (at most
``MAX_LISTED_MATCHES``, in id order). 409, not 422: the prefix is well formed, and becomes
ambiguous only when the store holds a second plan starting with it; the answer says how to
fix it (more digits). What a prefix names can change that way, so an answer to one is not
cached without revalidation (``PlanRef.headers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from starlette.concurrency import run_in_threadpool

from planner_service.plan.errors import FieldProblem, InputError
from planner_service.plan.plan_ids import (
    MAX_LISTED_MATCHES,
    MIN_PREFIX_DIGITS,
    is_full_plan_id,
    plan_id_problem,
)
from planner_service.service.http.problems import ProblemError
from planner_service.service.http.responses import IMMUTABLE, NO_CACHE
from planner_service.service.state import ServiceState

AMBIGUOUS_TITLE = "Ambiguous plan id prefix"
AMBIGUOUS = (
    "more than one stored plan's id starts with the prefix: `matching_plan_ids` lists "
    f"them (at most {MAX_LISTED_MATCHES}), `more_matching` says whether there are others"
)


class Where(Enum):
    """Where a request names a plan: its problem's ``in``, and what an unknown id is."""

    PATH = "path"
    QUERY = "query"
    BODY = "body"


@dataclass(frozen=True)
class PlanRef:
    """A stored plan as a request named it: ``plan_id`` the full id, ``asked`` what the
    request said (the same, or a prefix of it)."""

    plan_id: str
    asked: str

    @property
    def by_prefix(self) -> bool:
        return self.asked != self.plan_id

    def headers(self, route: str = "") -> dict[str, str]:
        """Caching headers of an answer about this plan at ``/v1/plans/<asked><route>``:
        immutable for a full id; for a prefix, revalidated (``no-cache``) and naming the
        plan (``X-Shardplan-Plan-Id``) and its own address (``Content-Location``)."""
        if not self.by_prefix:
            return {"Cache-Control": IMMUTABLE}
        return {
            "Cache-Control": NO_CACHE,
            "X-Shardplan-Plan-Id": self.plan_id,
            "Content-Location": f"/v1/plans/{self.plan_id}{route}",
        }


async def resolve_plan_id(
    state: ServiceState, text: str, *, where: Where, field: str = "plan_id"
) -> PlanRef:
    """The plan ``text`` names (``field`` of the request's ``where``); see the module
    docstring for the answers when it names none, or more than one."""
    problem = plan_id_problem(text, field)
    if problem is not None:
        raise _malformed(problem, where)
    if is_full_plan_id(text):
        return PlanRef(text, text)
    store = state.store()
    matches = await run_in_threadpool(
        lambda: store.plans.ids_starting_with(text, limit=MAX_LISTED_MATCHES + 1)
    )
    if not matches:
        raise _unknown(text, where, field)
    if len(matches) > 1:
        raise _ambiguous(text, matches)
    return PlanRef(matches[0], text)


def _malformed(problem: FieldProblem, where: Where) -> Exception:
    """422 in the words of the other input errors of its place: a path parameter's as
    FastAPI's are rendered (``problems._validation_problem``), a body's as ``InputError``."""
    if where is Where.BODY:
        return InputError(where.value, [problem])
    return ProblemError(
        422,
        f"{where.value} {problem.render()}",
        errors=[{**problem.as_dict(), "in": where.value}],
    )


def _unknown(prefix: str, where: Where, field: str) -> Exception:
    message = f"no plan id starts with {prefix} here"
    if where is not Where.BODY:
        return ProblemError(404, f"{field} {message}" if where is Where.QUERY else message)
    return InputError(where.value, [FieldProblem(field, message, prefix)])


def _ambiguous(prefix: str, matches: list[str]) -> ProblemError:
    listed = matches[:MAX_LISTED_MATCHES]
    more = len(matches) > MAX_LISTED_MATCHES
    count = f"more than {MAX_LISTED_MATCHES}" if more else str(len(matches))
    return ProblemError(
        409,
        f"plan id prefix {prefix} is ambiguous: {count} stored plans start with it "
        f"({', '.join(listed)}{', ...' if more else ''}); give more digits of the one you "
        "mean",
        title=AMBIGUOUS_TITLE,
        prefix=prefix,
        matching_plan_ids=listed,
        more_matching=more,
    )


PLAN_ID_DESCRIPTION = (
    "a plan's content address (sha256, 64 lowercase hex digits) or a unique prefix of it "
    f"({MIN_PREFIX_DIGITS} digits or more)"
)
