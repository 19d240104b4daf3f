"""``shardplan fetch PLAN_ID | alias:NAME``: a stored plan from the planner service, for a
training job's launch script. Through the HTTP client: retried, and hashed again, so the
plan written is the one its id addresses. PLAN_ID is a plan's id or a unique prefix of it
(8 hex digits or more: the 12 the commands print will do). With ``--cache-dir``, plans
fetched are kept there and a whole plan id is answered from it without asking the service
(plans never change), so a job restarting while the service is down starts from the same
plan. An alias can move, and a prefix can come to name more than one plan, so they are
always asked; only with ``--allow-stale-alias``, when the service cannot be reached, the
plan an alias named when last resolved is used, and stderr says STALE.

Output: the plan's canonical bytes exactly as the service stores them (stdout adds a
newline). With ``-o`` the file is written whole or not at all. stderr says which plan an
alias or a prefix named, and, for a plan imported into the service (PUT /v1/plans), that
its solver report (status, lower bound, gap) is the importer's word, unverified (from the
cache too). Needs the core install only.

Exit 0: written; 2: bad input (not a plan id, prefix or alias; no such plan or alias on the
service, or more than one plan starting with the prefix; a token refused); 4: the service
unreachable, overloaded or failing after the retries; 5: the plan failed its integrity
check (nothing written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from clients.cli.exits import EXIT_OK
from clients.cli.output import add_output_argument
from clients.cli.remote import add_server_arguments, connected

if TYPE_CHECKING:
    from clients.http import FetchedPlan


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "fetch",
        help="get a stored plan (by id, or alias:NAME) from the service, verified",
        description=__doc__,
    )
    parser.add_argument(
        "plan",
        metavar="PLAN_ID|alias:NAME",
        help="a plan id (64 hex digits), a unique prefix of one (8 or more), or alias:NAME",
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
    from clients.cli.stored_plans import cached_named, fetch_named, plan_name, unverified_note

    name = plan_name(args.plan, command="shardplan fetch", argument="PLAN_ID")
    fetched = cached_named(args, name, args.cache_dir)
    if fetched is None:
        with connected(args, "fetch", cache_dir=args.cache_dir) as client:
            fetched = fetch_named(
                client,
                name,
                command="fetch",
                allow_stale_alias=args.allow_stale_alias,
                cache_dir=args.cache_dir,
            )
    note = unverified_note(fetched, "fetch")
    if note is not None:
        print(note, file=sys.stderr)  # stdout is the plan's bytes alone
    _write(fetched, args.output)
    return EXIT_OK


def _write(fetched: FetchedPlan, output: Path | None) -> None:
    from clients.cli.output import emit_canonical
    from planner_service.plan.codec import plan_bytes

    emit_canonical(plan_bytes(fetched.plan), output)  # the bytes the service stores and hashed
