"""Numbers people type on the command line: byte sizes (``80GiB``, ``512MB``, ``1.5TiB``,
or plain bytes, read as the request format reads them) and comma-separated lists of them
or of world sizes.

A bad value is an ``InputError`` naming the option, the value and what is accepted.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from planner_service.plan import units
from planner_service.plan.errors import FieldProblem, InputError
from planner_service.plan.types import MAX_MEMORY_BYTES, ComputeKernel

SOURCE = "shardplan"


def parse_byte_size(text: str, option: str) -> int:
    """``"40GiB"`` -> 42949672960, read as the request format reads sizes (units are
    case-sensitive: ``plan.units``), or a whole number of bytes; at most 2^53."""
    try:
        value = int(text) if text.isdigit() else units.parse_byte_size(text)
    except ValueError as error:
        raise _bad(option, text, str(error)) from None
    if value > MAX_MEMORY_BYTES:
        raise _bad(option, text, "more than a rank may have: at most 2^53 bytes (8 PiB)")
    return value


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


MAX_REGRESSION = 100.0  # 10,000%: a bound, not a limit anyone sets
MAX_STEP_MS = 1e9


def parse_share(text: str, option: str) -> float:
    """A non-negative share: ``"5%"`` or ``"0.05"`` -> 0.05, at most 100 (10,000%)."""
    percent = text.endswith("%")
    try:
        value = float(text[:-1] if percent else text) / (100 if percent else 1)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= MAX_REGRESSION:  # NaN fails this too
        raise _bad(
            option, text, "a share from 0 to 10000% is accepted: 5% or 0.05 for five percent"
        )
    return value


def parse_milliseconds(text: str, option: str) -> float:
    """A positive number of milliseconds, at most 1e9."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 < value <= MAX_STEP_MS:
        raise _bad(option, text, "a positive number of milliseconds up to 1e9, e.g. 12.5")
    return value


def parse_kernels(text: str, option: str) -> list[ComputeKernel]:
    """``"fused,dense"`` -> the compute kernels named, each once."""
    from planner_service.check.gates import GateError, kernels_of

    try:
        return kernels_of(text)
    except GateError as error:
        raise _bad(option, text, str(error)) from None


def _bad(option: str, value: str, message: str) -> InputError:
    return InputError(SOURCE, [FieldProblem(option, message, value)])
