"""``shardplan measure REQUEST PLAN [--versus OTHER ...]``: the plan executed by the runtime on
synthetic batches at its world size, each rank's step time and its parts beside the plan's
prediction (docs/measure.md). With ``--versus``, other plans of the request's tables (from
this request or another of the same tables and topology: another cost model, constraints,
time limit) are measured side by side with it: the same ranks hold every plan and take a step of
each in turn, so the machine's drift from one second to the next slows them alike, and a
last table ranks them by their step. Needs the runtime (``shardplan[runtime]``).

Output: a table per rank, measured beside predicted (``--format json``: the report; with
``--versus``, a list of reports, PLAN's first, then each OTHER's in order), on standard
output or in FILE instead with ``-o FILE``.

Exit 0: measured; 1: the plan is invalid for the request, or an OTHER cannot run its tables
(the violations on stderr; nothing runs); 2: bad input (or a world size this machine cannot
run, said before any rank starts; the runtime extra missing); 4: a rank raised, died or
passed its deadline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from clients.cli.exits import EXIT_BAD_INPUT, EXIT_INVALID, EXIT_OK, EXIT_UNAVAILABLE, CommandFailed
from clients.cli.extras import needs_extra
from clients.cli.output import add_output_argument, emit
from clients.cli.validate import add_plan_arguments, print_violations, read_pair

if TYPE_CHECKING:
    from planner_service.plan.types import ShardingPlan


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "measure",
        help="run a plan on synthetic batches and time each rank's step",
        description=__doc__,
    )
    add_plan_arguments(parser)
    parser.add_argument(
        "--versus",
        type=Path,
        action="append",
        default=[],
        metavar="OTHER",
        help="another plan of the request's tables, measured side by side with PLAN "
        "(repeatable; "
        f"at most {MAX_VERSUS})",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="cpu: gloo ranks; cuda: one rank per GPU with NCCL (default: cuda if available)",
    )
    parser.add_argument(
        "--threads", type=_positive, default=1, help="torch threads per cpu rank (default 1)"
    )
    parser.add_argument(
        "--warmup", type=_natural, default=5, help="untimed steps first (default 5)"
    )
    parser.add_argument("--steps", type=_positive, default=20, help="timed steps (default 20)")
    parser.add_argument(
        "--seed", type=_natural, default=0, help="seed of the synthetic batches (default 0)"
    )
    parser.add_argument(
        "--timeout-s",
        type=_seconds,
        default=120.0,
        help="deadline of every collective, seconds (default 120)",
    )
    parser.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table: per rank measured beside predicted (default); json: the report",
    )
    add_output_argument(parser, "the report (as --format gives it)")
    parser.set_defaults(command=run)


MAX_VERSUS = 31  # other plans measured side by side with PLAN: 32 plans in one run at most


def _positive(text: str) -> int:
    value = _natural(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a positive number of seconds")
    return value


def _natural(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number")
    return int(text)


def run(args: argparse.Namespace) -> int:
    from planner_service.validate.validator import runnable_violations, validate_plan

    request, plan = read_pair(args, "measure")
    others = _read_versus(args.versus)
    checks = [(args.plan, validate_plan(request, plan))]
    checks += [
        (path, runnable_violations(request, other))
        for path, other in zip(args.versus, others, strict=True)
    ]
    for path, violations in checks:
        if violations:  # stdout is the report's: the violations go to stderr
            if others:
                print(f"{path}:", file=sys.stderr)
            print_violations(violations, sys.stderr.write)
            return EXIT_INVALID
    with needs_extra("measure", "runtime"):
        from runtime.measure import (
            DeviceKind,
            MeasureRefused,
            MeasureSettings,
            RankFailed,
            default_device,
            measure_plans,
        )
        from runtime.measure.table import render_side_by_side, render_table
    settings = MeasureSettings(
        device=DeviceKind(args.device) if args.device else default_device(),
        threads=args.threads,
        warmup=args.warmup,
        steps=args.steps,
        seed=args.seed,
        timeout_s=args.timeout_s,
    )
    try:
        reports = measure_plans(request, [plan, *others], settings)
    except MeasureRefused as refused:
        raise CommandFailed(f"shardplan measure: {refused}", EXIT_BAD_INPUT) from None
    except RankFailed as failed:
        raise CommandFailed(f"shardplan measure: {failed}", EXIT_UNAVAILABLE) from None
    if reports is None:  # a torchrun rank other than 0: rank 0 reports
        return EXIT_OK
    if args.format == "json":
        if others:
            dumped = ",\n".join(report.model_dump_json(indent=2) for report in reports)
            emit(f"[\n{dumped}\n]\n", args.output)
        else:
            emit(reports[0].model_dump_json(indent=2) + "\n", args.output)
    elif others:
        from clients.cli.files import source_name

        names = [source_name(path) for path in [args.plan, *args.versus]]
        tables = "\n".join(render_table(report) for report in reports)
        emit(tables + "\n" + render_side_by_side(reports, names), args.output)
    else:
        emit(render_table(reports[0]), args.output)
    return EXIT_OK


def _read_versus(paths: list[Path]) -> list[ShardingPlan]:
    """The ``--versus`` plans, each validated as a document (standard input is PLAN's or
    REQUEST's only)."""
    from clients.cli.files import STDIN, read_input, source_name
    from planner_service.plan.codec import parse_plan
    from planner_service.plan.errors import FieldProblem, InputError

    if len(paths) > MAX_VERSUS:
        raise InputError(
            "measure",
            [FieldProblem("--versus", f"at most {MAX_VERSUS} other plans", str(len(paths)))],
        )
    for path in paths:
        if path == STDIN:
            raise InputError(
                "measure",
                [FieldProblem("--versus", "a file (standard input is PLAN's or REQUEST's)", "-")],
            )
    return [parse_plan(read_input(path), source=source_name(path)) for path in paths]
