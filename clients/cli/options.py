"""``shardplan options REQUEST``: every table's sharding options with their estimates, and
the tables that fit nowhere. Needs no solver."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from clients.cli.exits import EXIT_NO_PLAN, EXIT_OK
from clients.cli.files import read_input, source_name
from planner_service.costs.enumerate import enumerate_options, fit_options
from planner_service.plan.codec import parse_request
from planner_service.reports import options_document


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "options", help="print every table's sharding options with perf and storage estimates"
    )
    parser.add_argument("request", type=Path, help="PlanRequest JSON file (- for stdin)")
    parser.add_argument("--all", action="store_true", help="include options that no rank can hold")
    parser.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    request = parse_request(read_input(args.request), source=source_name(args.request))
    enumerated = enumerate_options(request)
    fitted = fit_options(request, enumerated)
    tables = enumerated if args.all else fitted.tables
    document = options_document(request, tables, fitted.problems, fitted.capacities)
    json.dump(document, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")
    for problem in fitted.problems:
        print(f"{problem.code.value}: {problem.message}", file=sys.stderr)
    return EXIT_NO_PLAN if fitted.problems else EXIT_OK
