"""Byte units: how messages and pages print byte counts, and how requests may write them.

A request may give any byte field as an integer or as a size string, ``"80GiB"`` or
``"512 MB"``: a decimal number (digits, optionally a fraction) and one unit, ``B``,
``KB``/``MB``/``GB``/``TB`` (powers of 1000) or ``KiB``/``MiB``/``GiB``/``TiB`` (powers of
1024), ASCII spaces allowed around and between them (not tabs, line breaks or Unicode
spaces, which read as a space or a line and are not one). Units are case-sensitive,
because ``Gb`` and ``mb`` usually mean bits or a typo; the size must come to a whole
number of bytes (``"1.5KiB"`` is 1536, ``"0.3B"`` is refused). The integer is the canonical form: a
request reads the same, and hashes the same, however its sizes are written.
"""

from __future__ import annotations

import re
from fractions import Fraction

GiB = 1024**3
MiB = 1024**2

DECIMAL_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
BINARY_UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
BYTE_UNITS = {**DECIMAL_UNITS, **BINARY_UNITS}
# At most 20 digits either side of the point: Fraction() never sees a long text.
_SIZE = re.compile(r" *([0-9]{1,20}(?:\.[0-9]{1,20})?) *([A-Za-z]{1,8}) *")
_UNITS_TEXT = ", ".join(BYTE_UNITS)


def gib(num_bytes: int, decimals: int = 3) -> str:
    """``num_bytes`` in GiB, as messages print it: ``gib(3 * 2**29)`` is "1.500 GiB"."""
    return f"{gib_number(num_bytes, decimals)} GiB"


def size(num_bytes: float) -> str:
    """``num_bytes`` in the largest binary unit that keeps at least 1 before the point, so
    the number shows: ``size(2**20)`` is "1.00 MiB", ``size(3 * 2**29)`` "1.50 GiB",
    ``size(512)`` "512 B"; negative sizes (an overdraft) keep their sign."""
    sign, value = ("-", -float(num_bytes)) if num_bytes < 0 else ("", float(num_bytes))
    if value < 1024:
        return f"{sign}{value:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        scaled = value / BINARY_UNITS[unit]
        if round(scaled, 2) < 1024:  # 1023.999 MiB reads "1.00 GiB", not "1024.00 MiB"
            return f"{sign}{scaled:.2f} {unit}"
    return f"{sign}{value / BINARY_UNITS['TiB']:.2f} TiB"


def gib_number(num_bytes: int, decimals: int = 2) -> str:
    """``num_bytes`` in GiB without the unit, for columns headed "GiB"."""
    return f"{num_bytes / GiB:.{decimals}f}"


def percent(part: float, whole: float) -> str:
    """``part`` as a share of ``whole``, as tables and pages print it: "12.5%"; "-" when
    ``whole`` is 0 (a tier a rank does not have)."""
    return f"{100 * part / whole:.1f}%" if whole else "-"


def parse_byte_size(text: str) -> int:
    """The bytes a size string means (module docstring), or ValueError saying what is
    accepted: ``parse_byte_size("80GiB") == 85_899_345_920``."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(
            "is not a byte size; write an integer number of bytes, or a number and a unit "
            f'like "80GiB" or "512 MB" (units: {_UNITS_TEXT})'
        )
    number, unit = match.groups()
    multiplier = BYTE_UNITS.get(unit)
    if multiplier is None:
        same = [known for known in BYTE_UNITS if known.lower() == unit.lower()]
        hint = f" (units are case-sensitive: {same[0]!r})" if same else ""
        raise ValueError(f"has unknown unit {unit!r}{hint}; units: {_UNITS_TEXT}")
    size = Fraction(number) * multiplier
    if size.denominator != 1:
        raise ValueError(
            f"is {float(size):,.3f} bytes, not a whole number; give a size that comes to "
            "whole bytes"
        )
    return int(size)
