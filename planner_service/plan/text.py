"""Text that every store keeps alike: the check each text field passes before it reaches
SQLite or PostgreSQL (names, versions, comments, cursors).

PostgreSQL refuses a NUL character in text that SQLite stores, and neither can encode a
lone surrogate (``"\\ud800"`` is valid JSON); other control characters and the bidi
overrides and isolates (U+202A..U+202E, U+2066..U+2069) store fine but make a name print as
another name (the "Trojan Source" trick) or break the line a log or page shows it on. So
every text field refuses them at the edge, with a 422 naming the field, on both stores
alike. Identifiers (table, feature and profile names, planner versions) refuse every
control character and leading or trailing white space; free text (comments, the machine
notes of a profile) may hold tabs and line breaks.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

_BIDI = "\u202a-\u202e\u2066-\u2069"
_SURROGATES = "\ud800-\udfff"
# Every C0 and C1 control character (NUL included), DEL, bidi controls, lone surrogates.
_NOT_IN_IDENTIFIERS = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}{_SURROGATES}]")
# The same less tab, line feed and carriage return.
_NOT_IN_TEXT = re.compile(f"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f{_BIDI}{_SURROGATES}]")


def identifier_problem(value: str) -> str | None:
    """Why ``value`` cannot be a name or version (None: it can)."""
    bad = _NOT_IN_IDENTIFIERS.search(value)
    if bad is not None:
        return _refused(bad.group(), bad.start(), "a name")
    if value != value.strip():
        return "has leading or trailing white space; write the name without it"
    return None


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be free text (None: it can)."""
    bad = _NOT_IN_TEXT.search(value)
    return None if bad is None else _refused(bad.group(), bad.start(), "text")


def _refused(char: str, at: int, kind: str) -> str:
    return (
        f"holds the character U+{ord(char):04X} at position {at}, which {kind} here may not "
        "hold (control characters, bidi overrides, lone surrogates); remove it"
    )


def _checked(problem_of: Callable[[str], str | None]) -> AfterValidator:
    def check(value: str) -> str:
        problem = problem_of(value)
        if problem is not None:
            raise PydanticCustomError("text", "{problem}", {"problem": problem})
        return value

    return AfterValidator(check)


# Annotations for pydantic fields: ``Annotated[str, ..., IdentifierText]``.
IdentifierText = _checked(identifier_problem)
FreeText = _checked(text_problem)
