"""Plan ids as people type them: a plan's full id (the sha256 of its content, 64 lowercase
hex digits) or a prefix of it of at least ``MIN_PREFIX_DIGITS`` digits, as the commands,
reports and pages print plans short (12 digits). The service resolves a prefix against its
store (one plan, or 404 / 409); the clients check what they are given before asking. What
a prefix may be, and the ids it stands for, are defined here once for both.
"""

from __future__ import annotations

import re

from planner_service.plan.errors import FieldProblem

PLAN_ID_DIGITS = 64
MIN_PREFIX_DIGITS = 8
# The most matching ids an ambiguous prefix's answer lists.
MAX_LISTED_MATCHES = 10
HEX_DIGITS = "0123456789abcdef"
PLAN_ID_OR_PREFIX_PATTERN = rf"^[0-9a-f]{{{MIN_PREFIX_DIGITS},{PLAN_ID_DIGITS}}}$"
ACCEPTED = (
    f"a plan id ({PLAN_ID_DIGITS} lowercase hex digits) or a unique prefix of one "
    f"({MIN_PREFIX_DIGITS} to {PLAN_ID_DIGITS} digits)"
)
_PLAN_ID_OR_PREFIX = re.compile(PLAN_ID_OR_PREFIX_PATTERN.strip("^$"))


def is_full_plan_id(text: str) -> bool:
    """A whole plan id, not a prefix (``text`` already checked by ``plan_id_problem``)."""
    return len(text) == PLAN_ID_DIGITS


def plan_id_problem(text: object, path: str) -> FieldProblem | None:
    """What is wrong with ``text`` as a plan id or a prefix of one, named ``path``; None
    when it is one."""
    if isinstance(text, str) and _PLAN_ID_OR_PREFIX.fullmatch(text):
        return None
    return FieldProblem(path, f"must be {ACCEPTED}", text)


def id_range(prefix: str) -> tuple[str, str | None]:
    """The ids that start with ``prefix`` are those from the first bound (included) up to
    the second (excluded; None: no upper bound, for a prefix of only ``f``s). For strings of
    lowercase hex digits every collation orders as bytes do (digits before letters, a
    prefix before its extensions), so a database finds them with a range scan of the
    primary key's index, whatever the column's collation."""
    stem = prefix.rstrip("f")
    if not stem:
        return prefix, None
    last = HEX_DIGITS.index(stem[-1])
    return prefix, stem[:-1] + HEX_DIGITS[last + 1]
