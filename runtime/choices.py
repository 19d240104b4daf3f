"""The one reading of a choice a training script passes to the runtime's public constructors
(a config's ``pooling``, a builder's ``kernel``, ``fused_params``' ``"optimizer"``, a
calibration's ``device``): the enum member, or its documented string value.

The enums are ``StrEnum``s, so ``"mean" == PoolingType.MEAN`` but ``"mean" is not
PoolingType.MEAN``: a plain string kept as given passed every ``==`` check and failed every
``is`` check, and a mean-pooled table sum-pooled. Each constructor turns the string into the
member here, once, and refuses anything else with the field and the accepted values, so the
rest of the runtime only ever sees members.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import TypeVar

Choice = TypeVar("Choice", bound=StrEnum)


def choice(
    kind: type[Choice],
    value: object,
    field: str,
    *,
    owner: str = "",
    accepted: Iterable[Choice] | None = None,
) -> Choice:
    """``value`` as a member of ``kind``: a member, or a string equal to a member's value,
    among ``accepted`` (default: every member). Anything else raises ``ValueError`` naming
    ``owner`` (e.g. "table 't'"), the field, the value and what is accepted."""
    allowed = list(kind if accepted is None else accepted)
    if isinstance(value, str):
        for member in allowed:
            if value == member.value:
                return member
    where = f"{owner}: " if owner else ""
    shown = value.value if isinstance(value, StrEnum) else value
    values = ", ".join(repr(member.value) for member in allowed)
    raise ValueError(
        f"{where}{field} {shown!r} is not supported; use one of {values} "
        f"({kind.__name__} members or their values)"
    )
