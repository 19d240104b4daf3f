"""The order tables are shown in, everywhere a plan is shown (CLI, plan page, diff):
natural order, so that ``t2`` comes before ``t10``."""

from __future__ import annotations

import re
from collections.abc import Iterable

_DIGITS = re.compile(r"([0-9]+)")


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that compares runs of digits as numbers: ``sorted(["t10", "t2", "T1"],
    key=natural_key) == ["T1", "t2", "t10"]``. Text compares case-insensitively first, then
    as written, so that the order is total (``"a"`` and ``"A"`` never tie)."""
    parts = _DIGITS.split(name)
    key: list[tuple[int, int | str]] = []
    for index, part in enumerate(parts):
        if index % 2:
            key.append((0, int(part)))
        elif part:
            key.append((1, part.casefold()))
    return (*key, (2, name))


def natural_sorted(names: Iterable[str]) -> list[str]:
    return sorted(names, key=natural_key)
