"""``shardplan options REQUEST``: every table's sharding options with their estimates, and
the tables that fit nowhere (named on stderr). Needs no solver.

Exit 0: every table has an option that fits; 2: bad input; 3: a table fits no rank (the
options shown are still written)."""

from __future__ import annotations

import argparse
import json
import sys

from clients.cli.exits import EXIT_NO_PLAN, EXIT_OK
from clients.cli.output import add_output_argument, emit
from clients.cli.request import add_request_arguments, read_request


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "options",
        help="print every table's sharding options with perf and storage estimates",
        description=__doc__,
    )
    add_request_arguments(parser)
    parser.add_argument("--all", action="store_true", help="include options that no rank can hold")
    parser.add_argument(
        "--format",
        choices=("json", "table"),
        default="json",
        help="json: the options document on one line (default); table: a table per table",
    )
    add_output_argument(parser, "the options")
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
        emit(options_table(request, document), args.output)
    else:
        emit(json.dumps(document, separators=(",", ":")) + "\n", args.output)
    for problem in fitted.problems:
        print(f"{problem.code.value}: {problem.message}", file=sys.stderr)
    return EXIT_NO_PLAN if fitted.problems else EXIT_OK
