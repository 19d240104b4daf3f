"""``shardplan request TEMPLATE --tables tables.csv``: a request whose tables come from a
CSV file, printed as JSON (the template's own spelling kept: a size written "80GiB" stays
so). Every command that reads a request (plan, options, validate, measure) takes the same
``REQUEST`` and ``--tables``, read here.

Exit 0: written; 2: bad input (an invalid template or CSV line, named with its line and
column; an output path that cannot be written)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from clients.cli.exits import EXIT_OK
from clients.cli.output import add_output_argument, emit

if TYPE_CHECKING:
    from planner_service.plan.types import PlanRequest

TABLES_HELP = (
    "CSV file of the tables (header: name,num_embeddings,embedding_dim,pooling_factor and "
    "optionally feature_names,data_type,optimizer); REQUEST then has no tables"
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "request",
        help="print a request whose tables come from a CSV file, as JSON",
        description=__doc__,
    )
    parser.add_argument(
        "request", type=Path, help="PlanRequest JSON without tables: the template (- for stdin)"
    )
    parser.add_argument("--tables", type=Path, required=True, help=TABLES_HELP)
    add_output_argument(parser, "the request")
    parser.set_defaults(command=run)


def add_request_arguments(parser: argparse.ArgumentParser) -> None:
    """``REQUEST`` and ``--tables``, for every command that reads a request."""
    parser.add_argument("request", type=Path, help="PlanRequest JSON file (- for stdin)")
    parser.add_argument("--tables", type=Path, help=TABLES_HELP)


def run(args: argparse.Namespace) -> int:
    document, _ = merged_request(args.request, args.tables)
    emit(json.dumps(document, indent=2) + "\n", args.output)
    return EXIT_OK


def read_request(args: argparse.Namespace) -> PlanRequest:
    """The request of ``add_request_arguments``' arguments, validated."""
    from clients.cli.files import read_input, source_name
    from planner_service.plan.codec import parse_request

    if args.tables is None:
        return parse_request(read_input(args.request), source=source_name(args.request))
    return merged_request(args.request, args.tables)[1]


def merged_request(template: Path, tables: Path) -> tuple[dict[str, object], PlanRequest]:
    """``template`` with its ``tables`` read from a CSV file: as JSON data in the template's
    own spelling (a size written "80GiB" stays so), and validated."""
    from clients.cli.files import STDIN, read_input, source_name
    from clients.cli.tables_csv import tables_from_csv
    from planner_service.plan.codec import load_json, parse_request
    from planner_service.plan.errors import FieldProblem, InputError

    if template == tables == STDIN:
        problem = FieldProblem("--tables", "only one of REQUEST and --tables can be - (stdin)", "-")
        raise InputError("request", [problem])
    source = source_name(template)
    document = load_json(read_input(template), source)
    if not isinstance(document, dict):
        raise InputError(source, [FieldProblem("", "must be a JSON object (a PlanRequest)")])
    if "tables" in document:
        problem = FieldProblem("tables", f"given here and by --tables {tables}; remove one")
        raise InputError(source, [problem])
    document["tables"] = tables_from_csv(read_input(tables), source_name(tables))
    return document, parse_request(json.dumps(document), source=source)
