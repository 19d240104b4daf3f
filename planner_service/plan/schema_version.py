"""The plan schema versions this code writes and reads, and the check that refuses the
rest: a plan's ``schema_version`` is ``major.minor``, and a reader accepts its own major
version at a minor version no newer than its own.

The vocabulary (``types.ShardingPlan``'s field, ``types.PlanOptions``' check of an inline
previous plan) and the codec both use these, so they live apart from both.
"""

from __future__ import annotations

import re

from planner_service.plan.errors import FieldProblem, InputError

SCHEMA_VERSION = "1.2"  # 1.1: solver.stop_reason; 1.2: migration
# Plans are written at the oldest schema that has their fields: a plan without a
# ``migration`` section stays 1.1, byte for byte what earlier versions wrote.
SCHEMA_VERSION_WITHOUT_MIGRATION = "1.1"
# "major.minor", each at most 9 ASCII digits without leading zeros ("01.01" is not "1.1":
# one version, one spelling): read without int() on unbounded text.
SCHEMA_VERSION_PATTERN = r"^(?:0|[1-9][0-9]{0,8})\.(?:0|[1-9][0-9]{0,8})$"


def check_schema_version(version: object, *, source: str = "plan") -> None:
    """Accept our major version at a minor version no newer than ours, else InputError."""
    problem = schema_version_problem(version)
    if problem is not None:
        raise InputError(source, [FieldProblem("schema_version", problem, version)])


def schema_version_problem(version: object) -> str | None:
    """Why this code cannot read a plan of schema ``version`` (None: it can)."""
    ours_major, ours_minor = _OURS
    parsed = _version_tuple(version) if isinstance(version, str) else None
    if parsed is None:
        return f'must be a string like "{SCHEMA_VERSION}"'
    major, minor = parsed
    if major != ours_major or minor > ours_minor:
        return (
            f"this shardplan reads plan schema {ours_major}.x up to {SCHEMA_VERSION}; "
            f"{'upgrade shardplan' if (major, minor) > _OURS else 're-plan'} to read it"
        )
    return None


def _version_tuple(version: str) -> tuple[int, int] | None:
    """(major, minor) of "1.0"; None for anything else. The pattern bounds both parts to
    nine ASCII digits before int() sees them (str.isdigit accepts "²", and int() refuses
    more than 4,300 digits)."""
    if not _SCHEMA_VERSION.fullmatch(version):
        return None
    major, _, minor = version.partition(".")
    return int(major), int(minor)


_SCHEMA_VERSION = re.compile(SCHEMA_VERSION_PATTERN.strip("^$"))


def _ours() -> tuple[int, int]:
    ours = _version_tuple(SCHEMA_VERSION)
    assert ours is not None  # SCHEMA_VERSION matches its own pattern
    return ours


_OURS = _ours()
