"""``shardplan options REQUEST``: every table's sharding options with their estimates, and
the tables that fit nowhere. Needs no solver."""

from __future__ import annotations

import argparse
import json
import sys

from clients.cli.exits import EXIT_NO_PLAN, EXIT_OK
from clients.cli.request import add_request_arguments, read_request


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "options", help="print every table's sharding options with perf and storage estimates"
    )
    add_request_arguments(parser)
    parser.add_argument("--all", action="store_true", help="include options that no rank can hold")
    parser.add_argument(
        "--format",
        choices=("json", "table"),
        default="json",
        help="json: the options document on one line (default); table: a table per table",
    )
    parser.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    from planner_service.costs.enumerate import enumerate_options, fit_options
    from planner_service.reports.options import options_document, options_table

    request = read_request(args)
    enumerated = enumerate_options(request)
    fitted = fit_options(request, enumerated)
    tables = enumerated if args.all else fitted.tables
    document = options_document(request, tables, fitted.problems, fitted.capacities)
    if args.format == "table":
        sys.stdout.write(options_table(request, document))
    else:
        json.dump(document, sys.stdout, separators=(",", ":"))
        sys.stdout.write("\n")
    for problem in fitted.problems:
        print(f"{problem.code.value}: {problem.message}", file=sys.stderr)
    return EXIT_NO_PLAN if fitted.problems else EXIT_OK
