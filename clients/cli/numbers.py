"""Numbers people type on the command line: byte sizes (``80GiB``, ``512MB``, ``1.5TiB``,
or plain bytes) and comma-separated lists of them or of world sizes.

A bad value is an ``InputError`` naming the option, the value and what is accepted. Byte
sizes in request files are the request format's business (``planner_service/plan/``);
this parser is the command line's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal, localcontext

from planner_service.plan.errors import FieldProblem, InputError
from planner_service.plan.types import MAX_MEMORY_BYTES

SOURCE = "shardplan"
# Decimal units are powers of 1000 (as disk and network makers use them), binary ones
# powers of 1024 (as GPU memory is sold: an "80 GB" H100 has 80 GiB).
UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
ACCEPTED_SIZE = (
    "a whole number of bytes, or a number and a unit: B, KB, MB, GB, TB (powers of 1000), "
    "KiB, MiB, GiB, TiB (powers of 1024), e.g. 80GiB or 512MB"
)
_SIZE = re.compile(
    r"(?P<number>[0-9]{1,20}(?:\.[0-9]{1,20})?)\s*(?P<unit>[a-z]*)", flags=re.IGNORECASE
)


def parse_byte_size(text: str, option: str) -> int:
    """``"40GiB"`` -> 42949672960. Case does not matter; the result is whole bytes."""
    found = _SIZE.fullmatch(text.strip())
    factor = UNITS.get(found["unit"].lower() or "b") if found else None
    if found is None or factor is None:
        raise _bad(option, text, f"not a byte size; accepted: {ACCEPTED_SIZE}")
    with localcontext(prec=60):  # exact: at most 40 digits times 1024^4
        value = Decimal(found["number"]) * factor
    if value != value.to_integral_value():
        raise _bad(option, text, f"is {value} bytes, not a whole number; {ACCEPTED_SIZE}")
    if value > MAX_MEMORY_BYTES:
        raise _bad(option, text, "more than a rank may have: at most 2^53 bytes (8 PiB)")
    return int(value)


def parse_list(text: str, option: str, parse: Callable[[str, str], int]) -> list[int]:
    """``"8,16,32"`` -> [8, 16, 32], each item read by ``parse``; empty items and repeats
    are errors (a repeated row or column would only cost another solve)."""
    values: list[int] = []
    for item in text.split(","):
        if not item.strip():
            raise _bad(option, text, "an empty item; give a comma-separated list, e.g. 8,16,32")
        value = parse(item.strip(), option)
        if value in values:
            raise _bad(option, text, f"lists {item.strip()} twice; list each value once")
        values.append(value)
    return values


def parse_count(text: str, option: str) -> int:
    """A positive whole number (a world size)."""
    if not re.fullmatch(r"[0-9]{1,9}", text) or int(text) < 1:
        raise _bad(option, text, "not a positive whole number, e.g. 8")
    return int(text)


def parse_fraction(text: str, option: str) -> float:
    """A fraction in (0, 1], such as 0.9."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 < value <= 1.0:  # NaN fails this too
        raise _bad(option, text, "a fraction in (0, 1] is accepted, e.g. 0.9 for 90%")
    return value


def _bad(option: str, value: str, message: str) -> InputError:
    return InputError(SOURCE, [FieldProblem(option, message, value)])
