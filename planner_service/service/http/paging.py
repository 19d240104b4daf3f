"""Pages of GET /v1/plans and GET /v1/aliases: the ``limit`` and ``after`` query
parameters, and cursors.

A cursor is the sort key of the last row of a page, encoded (base64url) so that clients
treat it as opaque: the store carries on strictly after it (keyset paging), so a page
costs the same however deep it is, and rows stored meanwhile never shift or repeat one.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Annotated, TypeVar

from fastapi import Query

from planner_service.plan.api import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from planner_service.plan.text import identifier_problem
from planner_service.service.http.problems import ProblemError

CURSOR_PATTERN = r"^[A-Za-z0-9_-]{1,1024}$"
_SEPARATOR = "\n"

Limit = Annotated[
    int,
    Query(ge=1, le=MAX_PAGE_SIZE, description=f"items per page, 1 to {MAX_PAGE_SIZE}"),
]
After = Annotated[
    str | None,
    Query(
        pattern=CURSOR_PATTERN,
        description="the `next` of the previous page (opaque); absent for the first page",
    ),
]
DEFAULT_LIMIT = DEFAULT_PAGE_SIZE

R = TypeVar("R")


def encode_cursor(*key: str) -> str:
    text = _SEPARATOR.join(key).encode()
    return base64.urlsafe_b64encode(text).rstrip(b"=").decode()


def decode_cursor(cursor: str, fields: int) -> tuple[str, ...]:
    """The sort key a cursor holds; 422 naming ``after`` when it holds none. Its parts
    are compared with stored text, so each must be text both stores keep (``plan.text``):
    a NUL would be a 503 from PostgreSQL and an empty page from SQLite."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        text = ""
    key = tuple(text.split(_SEPARATOR))
    if len(key) != fields or not all(key) or any(map(identifier_problem, key)):
        message = "not a cursor this service made: pass the `next` of a previous page"
        raise ProblemError(
            422,
            f"query after = {cursor[:80]!r}: {message}",
            errors=[{"path": "after", "in": "query", "message": message, "value": cursor[:80]}],
        )
    return key


def page(rows: Sequence[R], limit: int) -> tuple[Sequence[R], bool]:
    """The first ``limit`` of ``limit + 1`` rows fetched, and whether there are more."""
    return rows[:limit], len(rows) > limit
