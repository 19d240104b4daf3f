"""``shardplan validate REQUEST PLAN``: every violation of the plan, one line each; and how
a command that takes ``REQUEST PLAN`` reads and checks the pair (``measure`` too)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from clients.cli.exits import EXIT_INVALID, EXIT_OK
from clients.cli.request import add_request_arguments, read_request

if TYPE_CHECKING:
    from planner_service.plan.types import PlanRequest, ShardingPlan, Violation


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("validate", help="check a plan against its request")
    add_plan_arguments(parser)
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


def print_violations(violations: list[Violation], out: TextIO) -> None:
    """One line per violation on ``out``, then the count on stderr."""
    for violation in violations:
        print(f"{violation.code.value}: {violation.message}", file=out)
    if violations:
        print(f"invalid: {len(violations)} violation(s)", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from planner_service.validate.validator import validate_plan

    request, plan = read_pair(args, "validate")
    violations = validate_plan(request, plan)
    print_violations(violations, sys.stdout)
    if violations:
        return EXIT_INVALID
    print(
        f"valid: plan {plan.plan_id[:12]} places {len(plan.tables)} table(s) on "
        f"{plan.world_size} rank(s)"
    )
    return EXIT_OK
