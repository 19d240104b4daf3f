"""``shardplan measure REQUEST PLAN``: the plan executed by the runtime on synthetic batches
at its world size, each rank's step time and its parts beside the plan's prediction
(docs/measure.md). Needs the runtime (``shardplan[runtime]``).

Output: a table per rank, measured beside predicted (``--format json``: the report), on
standard output or in FILE instead with ``-o FILE``.

Exit 0: measured; 1: the plan is invalid for the request (its violations on stderr;
nothing runs); 2: bad input (or a world size this machine cannot run, said before any
rank starts; the runtime extra missing); 4: a rank raised, died or passed its deadline."""

from __future__ import annotations

import argparse
import sys

from clients.cli.exits import EXIT_BAD_INPUT, EXIT_INVALID, EXIT_OK, EXIT_UNAVAILABLE, CommandFailed
from clients.cli.extras import needs_extra
from clients.cli.output import add_output_argument, emit
from clients.cli.validate import add_plan_arguments, print_violations, read_pair


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "measure",
        help="run a plan on synthetic batches and time each rank's step",
        description=__doc__,
    )
    add_plan_arguments(parser)
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
    from planner_service.validate.validator import validate_plan

    request, plan = read_pair(args, "measure")
    violations = validate_plan(request, plan)
    if violations:  # stdout is the report's: the violations go to stderr
        print_violations(violations, sys.stderr.write)
        return EXIT_INVALID
    with needs_extra("measure", "runtime"):
        from runtime.measure import (
            DeviceKind,
            MeasureRefused,
            MeasureSettings,
            RankFailed,
            default_device,
            measure_plan,
        )
        from runtime.measure.table import render_table
    settings = MeasureSettings(
        device=DeviceKind(args.device) if args.device else default_device(),
        threads=args.threads,
        warmup=args.warmup,
        steps=args.steps,
        seed=args.seed,
        timeout_s=args.timeout_s,
    )
    try:
        report = measure_plan(request, plan, settings)
    except MeasureRefused as refused:
        raise CommandFailed(f"shardplan measure: {refused}", EXIT_BAD_INPUT) from None
    except RankFailed as failed:
        raise CommandFailed(f"shardplan measure: {failed}", EXIT_UNAVAILABLE) from None
    if report is None:  # a torchrun rank other than 0: rank 0 reports
        return EXIT_OK
    if args.format == "json":
        emit(report.model_dump_json(indent=2) + "\n", args.output)
    else:
        emit(render_table(report), args.output)
    return EXIT_OK
