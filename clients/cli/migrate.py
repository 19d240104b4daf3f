"""``shardplan migrate OLD NEW``: the bytes that move between which ranks to go from one
plan to the other, region by region, as the runtime's re-sharding in place moves them.
Needs no solver; ``--request`` (the new plan's) gives the tables' data types and
optimizers, ``--optimizer`` the optimizer whose state moves with every table.

Exit 0: done; 2: a plan cannot be read or its content does not match its ``plan_id``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from clients.cli.diff import DEFAULT_TOP, whole_number
from clients.cli.exits import EXIT_OK
from clients.cli.output import add_output_argument, emit

# OptimizerType's values, spelled here so that building the parser imports no pydantic
# (tests/clients/cli/test_migrate.py checks they are the same).
OPTIMIZERS = ("sgd", "rowwise_adagrad", "adagrad", "adam")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "migrate",
        help="the bytes that move between which ranks to go from one plan to another",
        description=__doc__,
    )
    parser.add_argument("old", type=Path, help="the plan trained under (JSON file, - for stdin)")
    parser.add_argument("new", type=Path, help="the plan to resume under (JSON file, - for stdin)")
    parser.add_argument(
        "--request",
        type=Path,
        help="the new plan's PlanRequest JSON: tables' data types and optimizers (default: "
        "4-byte weights and --optimizer)",
    )
    parser.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        help="the optimizer whose state moves with every table, overriding the request's "
        "(default: the request's, else sgd: no state)",
    )
    parser.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text (default) or json (documented schema, every region)",
    )
    parser.add_argument(
        "--top",
        type=whole_number,
        default=DEFAULT_TOP,
        help=f"show the N pairs of ranks that move most bytes (default {DEFAULT_TOP})",
    )
    add_output_argument(parser, "the moves")
    parser.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    from clients.cli.files import read_plan_pair
    from planner_service.plan.migrate import migrate, migrate_document
    from planner_service.plan.types import OptimizerType
    from planner_service.reports.migration import migrate_report

    old, new, request = read_plan_pair(args.old, args.new, args.request, "migrate")
    optimizer = None if args.optimizer is None else OptimizerType(args.optimizer)
    migration = migrate(old, new, request, optimizer)
    if args.format == "json":
        document = migrate_document(migration).model_dump(mode="json")
        emit(json.dumps(document, indent=2) + "\n", args.output)
    else:
        emit(migrate_report(migration, top=args.top), args.output)
    return EXIT_OK
