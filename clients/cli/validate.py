"""``shardplan validate REQUEST PLAN``: check a plan against its request, as the planner's
validator does: every row and column covered once, memory per rank within capacity, the
constraints, the content address. Prints every violation, one line each, or one line
saying it is valid. ``measure`` reads and checks ``REQUEST PLAN`` the same way.

Exit 0: valid; 1: invalid (the count on stderr); 2: bad input (a file that cannot be read
or is not a request or a plan)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from clients.cli.exits import EXIT_INVALID, EXIT_OK
from clients.cli.output import add_output_argument, emit
from clients.cli.request import add_request_arguments, read_request

if TYPE_CHECKING:
    from planner_service.plan.types import PlanRequest, ShardingPlan, Violation


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "validate", help="check a plan against its request", description=__doc__
    )
    add_plan_arguments(parser)
    add_output_argument(parser, "the verdict (one line per violation, or the valid line)")
    parser.set_defaults(command=run)


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """``REQUEST`` (and ``--tables``) and ``PLAN``."""
    add_request_arguments(parser)
    parser.add_argument("plan", type=Path, help="ShardingPlan JSON file (- for stdin)")


def read_pair(args: argparse.Namespace, command: str) -> tuple[PlanRequest, ShardingPlan]:
    """The request and the plan of ``add_plan_arguments``' arguments (at most one from
    stdin), each validated as a document."""
    from clients.cli.files import STDIN, read_input, source_name
    from planner_service.plan.codec import parse_plan
    from planner_service.plan.errors import FieldProblem, InputError

    if args.request == args.plan == STDIN:
        raise InputError(
            command,
            [FieldProblem("plan", "only one of request and plan can be - (stdin)", "-")],
        )
    request = read_request(args)
    return request, parse_plan(read_input(args.plan), source=source_name(args.plan))


def print_violations(violations: list[Violation], write: Callable[[str], object]) -> None:
    """One line per violation, given to ``write`` at once, then the count on stderr."""
    write("".join(f"{violation.code.value}: {violation.message}\n" for violation in violations))
    if violations:
        print(f"invalid: {len(violations)} violation(s)", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from planner_service.validate.validator import validate_plan

    request, plan = read_pair(args, "validate")
    violations = validate_plan(request, plan)
    if violations:
        print_violations(violations, lambda lines: emit(lines, args.output))
        return EXIT_INVALID
    emit(
        f"valid: plan {plan.plan_id[:12]} places {len(plan.tables)} table(s) on "
        f"{plan.world_size} rank(s)\n",
        args.output,
    )
    return EXIT_OK
