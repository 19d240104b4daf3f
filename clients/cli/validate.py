"""``shardplan validate REQUEST PLAN``: every violation of the plan, one line each."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clients.cli.exits import EXIT_INVALID, EXIT_OK
from clients.cli.request import add_request_arguments, read_request


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("validate", help="check a plan against its request")
    add_request_arguments(parser)
    parser.add_argument("plan", type=Path, help="ShardingPlan JSON file (- for stdin)")
    parser.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    from clients.cli.files import STDIN, read_input, source_name
    from planner_service.plan.codec import parse_plan
    from planner_service.plan.errors import FieldProblem, InputError
    from planner_service.validate.validator import validate_plan

    if args.request == args.plan == STDIN:
        raise InputError(
            "validate",
            [FieldProblem("plan", "only one of request and plan can be - (stdin)", "-")],
        )
    request = read_request(args)
    plan = parse_plan(read_input(args.plan), source=source_name(args.plan))
    violations = validate_plan(request, plan)
    for violation in violations:
        print(f"{violation.code.value}: {violation.message}")
    if violations:
        print(f"invalid: {len(violations)} violation(s)", file=sys.stderr)
        return EXIT_INVALID
    print(
        f"valid: plan {plan.plan_id[:12]} places {len(plan.tables)} table(s) on "
        f"{plan.world_size} rank(s)"
    )
    return EXIT_OK
