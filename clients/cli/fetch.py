"""``shardplan fetch PLAN_ID | alias:NAME``: a stored plan from the planner service, for a
training job's launch script. Through the HTTP client: retried, and hashed again, so the
plan written is the one its id addresses. With ``--cache-dir``, plans fetched are kept
there and a plan id is answered from it without asking the service (plans never change),
so a job restarting while the service is down starts from the same plan. An alias can
move, so it is always asked; only with ``--allow-stale-alias``, when the service cannot be
reached, the plan it named when last resolved is used, and stderr says STALE.

Output: the plan's canonical bytes exactly as the service stores them (stdout adds a
newline). With ``-o`` the file is written whole or not at all. stderr says which plan an
alias resolved to. Needs the core install only.

Exit 0: written; 2: bad input (not a plan id or alias, no such plan or alias on the
service, a token refused); 4: the service unreachable, overloaded or failing after the
retries; 5: the plan failed its integrity check (nothing written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from clients.cli.exits import EXIT_OK
from clients.cli.output import add_output_argument
from clients.cli.remote import (
    add_server_arguments,
    cached_plan,
    connected,
    missing_is_bad_input,
)

if TYPE_CHECKING:
    from clients.http import PlannerClient
    from planner_service.plan.types import ShardingPlan

ALIAS_PREFIX = "alias:"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "fetch",
        help="get a stored plan (by id, or alias:NAME) from the service, verified",
        description=__doc__,
    )
    parser.add_argument(
        "plan", metavar="PLAN_ID|alias:NAME", help="a plan id (64 hex digits) or alias:NAME"
    )
    add_output_argument(parser, "the plan")
    add_server_arguments(parser, server_help="the planner service, e.g. http://planner:8000")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="keep fetched plans here (verified when read back); a plan id held here is "
        "not asked for again",
    )
    parser.add_argument(
        "--allow-stale-alias",
        action="store_true",
        help="when the service cannot be reached, use the plan the alias named when last "
        "resolved into --cache-dir (it may have moved since; stderr says STALE)",
    )
    parser.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    alias = args.plan.removeprefix(ALIAS_PREFIX) if args.plan.startswith(ALIAS_PREFIX) else None
    if alias is None:
        _check_plan_id(args.plan)
    plan = cached_plan(args, args.plan, args.cache_dir) if alias is None else None
    if plan is None:
        with connected(args, "fetch", cache_dir=args.cache_dir) as client:
            plan = _alias(client, alias, args) if alias is not None else _plan(client, args.plan)
    _write(plan, args.output)
    return EXIT_OK


def _plan(client: PlannerClient, plan_id: str) -> ShardingPlan:
    with missing_is_bad_input(f"shardplan fetch: no plan {plan_id} on {client.base_url}"):
        return client.get_plan(plan_id)


def _alias(client: PlannerClient, name: str, args: argparse.Namespace) -> ShardingPlan:
    with missing_is_bad_input(f"shardplan fetch: no alias {name!r} on {client.base_url}"):
        resolved = client.resolve(name, allow_stale_alias=args.allow_stale_alias)
    if resolved.stale:
        print(
            f"alias:{name} -> plan {resolved.plan_id} (STALE: {client.base_url} could not be "
            f"reached; this is the plan the alias named when last resolved, at "
            f"{resolved.resolved_at}, kept in {args.cache_dir}; it may have moved since)",
            file=sys.stderr,
        )
    else:
        version = f", version {resolved.version}" if resolved.version is not None else ""
        print(f"alias:{name} -> plan {resolved.plan_id}{version}", file=sys.stderr)
    return resolved.plan


def _write(plan: ShardingPlan, output: Path | None) -> None:
    from clients.cli.output import emit_canonical
    from planner_service.plan.codec import plan_bytes

    emit_canonical(plan_bytes(plan), output)  # the bytes the service stores and hashed


def _check_plan_id(text: str) -> None:
    from clients.cli.files import check_content_address

    check_content_address(
        text,
        command="shardplan fetch",
        argument="PLAN_ID",
        accepted="a plan id (64 lowercase hex digits) or alias:NAME",
    )
