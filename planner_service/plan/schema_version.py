"""The plan schema versions this code writes and reads, and the check that refuses the
rest: a plan's ``schema_version`` is ``major.minor``, and a reader accepts each major
version it knows at a minor version no newer than the newest it knows of that major.

The vocabulary (``types.ShardingPlan``'s field, ``types.PlanOptions``' check of an inline
previous plan) and the codec both use these, so they live apart from both.
"""

from __future__ import annotations

import re

from planner_service.plan.errors import FieldProblem, InputError

SCHEMA_VERSION = "2.0"  # 1.1: solver.stop_reason; 1.2: migration; 2.0: tables as runs
# Schema 2.0 writes each table's shards as a split rule and a rank list (types.
# CompactSharding) instead of a list of shard records: a reader of 1.x that looks for
# ``shards`` would find none, so the major version changed, and 1.x readers refuse it.
COMPACT_SCHEMA = (2, 0)
# The newest minor version read of each major version: 1.x plans (explicit shards) are
# still read and verified against their own canonical bytes.
NEWEST_MINOR = {1: 2, 2: 0}
# Plans expanded back to explicit shards (``plan.compact.expand_plan``) are written at the
# oldest 1.x schema that has their fields: without a ``migration`` section, 1.1.
SCHEMA_VERSION_WITHOUT_MIGRATION = "1.1"
SCHEMA_VERSION_WITH_MIGRATION = "1.2"
# "major.minor", each at most 9 ASCII digits without leading zeros ("01.01" is not "1.1":
# one version, one spelling): read without int() on unbounded text.
SCHEMA_VERSION_PATTERN = r"^(?:0|[1-9][0-9]{0,8})\.(?:0|[1-9][0-9]{0,8})$"
READS = "1.0 to 1.2 and 2.0"


def check_schema_version(version: object, *, source: str = "plan") -> None:
    """Accept the versions ``NEWEST_MINOR`` allows, else InputError."""
    problem = schema_version_problem(version)
    if problem is not None:
        raise InputError(source, [FieldProblem("schema_version", problem, version)])


def schema_version_problem(version: object) -> str | None:
    """Why this code cannot read a plan of schema ``version`` (None: it can)."""
    parsed = _version_tuple(version) if isinstance(version, str) else None
    if parsed is None:
        return f'must be a string like "{SCHEMA_VERSION}"'
    major, minor = parsed
    newest = NEWEST_MINOR.get(major)
    if newest is None or minor > newest:
        newer = major > max(NEWEST_MINOR) or newest is not None
        return (
            f"this shardplan reads plan schemas {READS}; "
            f"{'upgrade shardplan' if newer else 're-plan'} to read it"
        )
    return None


def schema_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a version a ``ShardingPlan`` holds (its pattern checked)."""
    major, _, minor = version.partition(".")
    return int(major), int(minor)


def _version_tuple(version: str) -> tuple[int, int] | None:
    """(major, minor) of "1.0"; None for anything else. The pattern bounds both parts to
    nine ASCII digits before int() sees them (str.isdigit accepts "²", and int() refuses
    more than 4,300 digits)."""
    if not _SCHEMA_VERSION.fullmatch(version):
        return None
    major, _, minor = version.partition(".")
    return int(major), int(minor)


_SCHEMA_VERSION = re.compile(SCHEMA_VERSION_PATTERN.strip("^$"))
