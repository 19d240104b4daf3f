"""``shardplan diff OLD NEW``: what changes between two plans: tables placed differently,
bytes that move, the ranks whose estimates change most. Needs no solver and no request
(``--request`` gives exact element sizes).

Exit 0: the plans are the same (every table placed the same way, every rank estimated the
same); 1: they differ, as diff(1) does; 2: a plan cannot be read or its content does not
match its ``plan_id``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from clients.cli.exits import EXIT_DIFFERENT, EXIT_OK
from clients.cli.output import add_output_argument, emit

DEFAULT_TOP = 10


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "diff",
        help="compare two plans: tables placed differently, bytes that move, rank deltas",
        description=__doc__,
    )
    parser.add_argument("old", type=Path, help="ShardingPlan JSON file (- for stdin)")
    parser.add_argument("new", type=Path, help="ShardingPlan JSON file (- for stdin)")
    parser.add_argument(
        "--format",
        choices=("text", "markdown", "json"),
        default="text",
        help="text (default); markdown, for a pull request comment; json (documented schema)",
    )
    parser.add_argument(
        "--request",
        type=Path,
        help="the new plan's PlanRequest JSON: tables' data types for exact bytes (default: "
        "4 bytes per element)",
    )
    parser.add_argument(
        "--top",
        type=whole_number,
        default=DEFAULT_TOP,
        help=f"show the N ranks whose estimates change most (default {DEFAULT_TOP})",
    )
    add_output_argument(parser, "the comparison")
    parser.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    from clients.cli.files import read_plan_pair
    from planner_service.plan.diff import diff_document, diff_plans
    from planner_service.reports.diff import diff_report

    old, new, request = read_plan_pair(args.old, args.new, args.request, "diff")
    diff = diff_plans(old, new, request)
    if args.format == "json":
        emit(json.dumps(diff_document(diff).model_dump(mode="json"), indent=2) + "\n", args.output)
    else:
        emit(diff_report(diff, top=args.top, markdown=args.format == "markdown"), args.output)
    return EXIT_OK if diff.identical else EXIT_DIFFERENT


def whole_number(text: str) -> int:
    """An argparse type: a whole number, 0 or more (``--top``)."""
    if not text.isascii() or not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number, 0 or more, not {text!r}")
    return int(text)
