"""A stored plan named on the command line: ``PLAN_ID``, a plan's id or a unique prefix of
it of at least 8 hex digits (the commands print plans by their first 12), or
``alias:NAME``. ``plan_name`` checks the name before anything is sent; ``fetch_named``
fetches the plan through the HTTP client (verified: its content hashes to its id, which is
or starts with the one asked for) and turns the service's answers about the name into one
line each: no such plan or alias, or a prefix more than one plan starts with. The plan
comes with what the service says of its solver report (``FetchedPlan``: unverified for an
imported plan; ``unverified_note`` says so in one line). ``shardplan fetch`` takes its
plan this way, and so can any command that takes one from the service.

Imported inside the commands that use it: it loads the vocabulary (pydantic).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from clients.cli.exits import EXIT_BAD_INPUT, CommandFailed
from clients.cli.remote import cached_plan, missing_is_bad_input
from planner_service.plan.errors import FieldProblem, InputError
from planner_service.plan.plan_ids import ACCEPTED as PLAN_ID_ACCEPTED
from planner_service.plan.plan_ids import is_full_plan_id, plan_id_problem

if TYPE_CHECKING:
    import argparse

    from clients.http import FetchedPlan, PlannerClient

ALIAS_PREFIX = "alias:"
ACCEPTED = f"{PLAN_ID_ACCEPTED}, or alias:NAME"


@dataclass(frozen=True)
class PlanName:
    """A checked name: ``alias`` for ``alias:NAME`` (its name checked by the client),
    else ``plan_id``, a whole id or a prefix of one."""

    text: str

    @property
    def alias(self) -> str | None:
        return self.text.removeprefix(ALIAS_PREFIX) if self.text.startswith(ALIAS_PREFIX) else None

    @property
    def plan_id(self) -> str | None:
        return None if self.alias is not None else self.text

    @property
    def by_prefix(self) -> bool:
        return self.plan_id is not None and not is_full_plan_id(self.plan_id)


def plan_name(text: str, *, command: str, argument: str) -> PlanName:
    """``text`` as a plan's name, or an InputError (exit 2) naming ``argument`` of
    ``command`` and what it accepts."""
    name = PlanName(text)
    if name.alias is None and plan_id_problem(text, argument) is not None:
        raise InputError(command, [FieldProblem(argument, f"must be {ACCEPTED}", text)])
    return name


def cached_named(
    args: argparse.Namespace, name: PlanName, cache_dir: Path | None
) -> FetchedPlan | None:
    """The plan a whole id names, from ``cache_dir`` without opening a client
    (``remote.cached_plan``); None for an alias or a prefix, which only the service can
    answer (an alias moves; a plan stored later can share a prefix)."""
    if name.plan_id is None or name.by_prefix:
        return None
    return cached_plan(args, name.plan_id, cache_dir)


def fetch_named(
    client: PlannerClient,
    name: PlanName,
    *,
    command: str,
    allow_stale_alias: bool = False,
    cache_dir: Path | None = None,
) -> FetchedPlan:
    """The plan ``name`` names, from ``client``; stderr says which plan an alias or a
    prefix named (an alias answered from the cache says STALE)."""
    if name.alias is not None:
        return _alias(client, name.alias, command, allow_stale_alias, cache_dir)
    assert name.plan_id is not None
    with _named_on(client, name.plan_id, command):
        fetched = client.fetch_plan(name.plan_id)
    if name.by_prefix:
        print(f"{name.plan_id} -> plan {fetched.plan.plan_id}", file=sys.stderr)
    return fetched


def unverified_note(fetched: FetchedPlan, command: str) -> str | None:
    """One line for stderr when the service does not vouch for the plan's solver report
    (an imported plan), else None."""
    if fetched.solver_report_verified:
        return None
    return (
        f"shardplan {command}: plan {fetched.plan.plan_id[:12]} was imported into the "
        "service (PUT /v1/plans): its solver report (status, lower bound, gap) is the "
        "importer's word, unverified"
    )


@contextmanager
def _named_on(client: PlannerClient, plan_id: str, command: str) -> Iterator[None]:
    """No plan, or more than one, named by ``plan_id`` on the service: exit 2, one line."""
    from clients.http import Conflict

    missing = (
        f"no plan {plan_id}" if is_full_plan_id(plan_id) else f"no plan id starts with {plan_id}"
    )
    with missing_is_bad_input(f"shardplan {command}: {missing} on {client.base_url}"):
        try:
            yield
        except Conflict as conflict:
            matching = getattr(conflict, "matching_plan_ids", None)
            if not isinstance(matching, list):
                raise
            more = getattr(conflict, "more_matching", False)
            count = f"more than {len(matching)}" if more else str(len(matching))
            raise CommandFailed(
                f"shardplan {command}: {count} plans on {client.base_url} start with {plan_id} "
                f"({', '.join(map(str, matching))}); give more digits of the one you mean",
                EXIT_BAD_INPUT,
            ) from None


def _alias(
    client: PlannerClient,
    alias: str,
    command: str,
    allow_stale_alias: bool,
    cache_dir: Path | None,
) -> FetchedPlan:
    from clients.http import FetchedPlan

    with missing_is_bad_input(f"shardplan {command}: no alias {alias!r} on {client.base_url}"):
        resolved = client.resolve(alias, allow_stale_alias=allow_stale_alias)
    if resolved.stale:
        print(
            f"alias:{alias} -> plan {resolved.plan_id} (STALE: {client.base_url} could not be "
            f"reached; this is the plan the alias named when last resolved, at "
            f"{resolved.resolved_at}, kept in {cache_dir}; it may have moved since)",
            file=sys.stderr,
        )
    else:
        version = f", version {resolved.version}" if resolved.version is not None else ""
        print(f"alias:{alias} -> plan {resolved.plan_id}{version}", file=sys.stderr)
    return FetchedPlan(plan=resolved.plan, solver_report_verified=resolved.solver_report_verified)
