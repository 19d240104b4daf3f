"""Byte units, and how messages and pages print byte counts."""

from __future__ import annotations

GiB = 1024**3
MiB = 1024**2


def gib(num_bytes: int, decimals: int = 3) -> str:
    """``num_bytes`` in GiB, as messages print it: ``gib(3 * 2**29)`` is "1.500 GiB"."""
    return f"{num_bytes / GiB:.{decimals}f} GiB"
