"""``shardplan check REQUEST``: does the model fit? For CI (exit codes, markdown for the
pull request) and for capacity planning (the least world size, a what-if sweep over world
and HBM sizes). Solves here, with OR-Tools (``shardplan[planner]``), or with ``--server
URL`` on the planner service, which needs only the core install: each check and each
sweep cell is one POST /v1/plans there. One piece still runs here: ``--min-world-size``
on a request that fits searches below its world size with the local planner, so it needs
``shardplan[planner]`` even with ``--server`` (exit 2 naming the extra when missing).

Exit 0: it fits (a plan, and no rank over ``--max-hbm-utilization``); 3: it does not; 2:
bad input; with --server also 4 (the service unreachable or failing) and 5 (a plan that
fails its integrity check). A sweep exits 0 when any cell fits, ``--min-world-size`` when
every HBM size has a least world size that passes the check there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from clients.cli.exits import EXIT_NO_PLAN, EXIT_OK
from clients.cli.remote import add_server_arguments, connected

if TYPE_CHECKING:
    from clients.cli.check_report import CheckReport
    from clients.cli.plan_source import PlanSource
    from planner_service.plan.types import PlanRequest

FORMATS = ("text", "json", "markdown")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "check",
        help="does the request fit? exit 0 fits, 3 does not; markdown for pull requests",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("request", type=Path, help="PlanRequest JSON file (- for stdin)")
    parser.add_argument(
        "--max-hbm-utilization",
        metavar="FRACTION",
        help="fail when any rank would use more than this fraction of its usable HBM (after "
        "the reservation), in (0, 1], e.g. 0.9",
    )
    parser.add_argument("--format", choices=FORMATS, default="text", help="default: text")
    what_if = parser.add_mutually_exclusive_group()
    what_if.add_argument(
        "--min-world-size",
        action="store_true",
        help="find the fewest ranks of these devices that fit (per --hbm size, when given); "
        "on a request that fits, the search below its world size runs here, with the local "
        "planner (shardplan[planner]), also with --server",
    )
    what_if.add_argument(
        "--world-sizes",
        metavar="N,N,...",
        help="what-if sweep: check at each of these world sizes (rows)",
    )
    parser.add_argument(
        "--hbm",
        metavar="SIZE,SIZE,...",
        help="what-if sweep: check at each of these HBM sizes per rank (columns), e.g. 40GiB,80GiB",
    )
    add_server_arguments(
        parser,
        server_help="plan on this planner service (POST /v1/plans) instead of here: needs no "
        "OR-Tools (for CI runners); the same report and exit codes",
    )
    parser.set_defaults(command=run)


def run(args: argparse.Namespace, source: PlanSource | None = None) -> int:
    """``source`` answers each request with its plan or why none exists: the planner in
    this process (the default), or the service (``--server``)."""
    # Here, not at the top: every shardplan command imports this module when it starts.
    from clients.cli.plan_source import ServiceSource, solve_locally

    if source is None and args.server is not None:
        with connected(args, "check") as client:
            return _run(args, ServiceSource(client))
    return _run(args, source or solve_locally)


def _run(args: argparse.Namespace, source: PlanSource) -> int:
    from clients.cli.files import read_input, source_name
    from clients.cli.numbers import parse_byte_size, parse_count, parse_fraction, parse_list
    from clients.cli.what_if import least_table, least_world_sizes, sweep, sweep_table
    from planner_service.plan.codec import parse_request

    limit = (
        parse_fraction(args.max_hbm_utilization, "--max-hbm-utilization")
        if args.max_hbm_utilization is not None
        else None
    )
    hbm = parse_list(args.hbm, "--hbm", parse_byte_size) if args.hbm is not None else []
    world_sizes = (
        parse_list(args.world_sizes, "--world-sizes", parse_count)
        if args.world_sizes is not None
        else []
    )
    request = parse_request(read_input(args.request), source=source_name(args.request))

    markdown = args.format == "markdown"
    if args.min_world_size:
        least = least_world_sizes(request, hbm, source, max_hbm_utilization=limit)
        _emit(
            least.model_dump_json(indent=2)
            if args.format == "json"
            else least_table(least, markdown)
        )
        passed = all(row.check is not None and row.check.fits for row in least.rows)
        return EXIT_OK if passed else EXIT_NO_PLAN
    if world_sizes or hbm:
        matrix = sweep(request, world_sizes, hbm, source, max_hbm_utilization=limit)
        _emit(
            matrix.model_dump_json(indent=2)
            if args.format == "json"
            else sweep_table(matrix, markdown)
        )
        return EXIT_OK if any(cell.check.fits for cell in matrix.cells) else EXIT_NO_PLAN
    report = check(request, source, max_hbm_utilization=limit)
    _emit(_render(report, request, args.format, source_name(args.request)))
    return EXIT_OK if report.fits else EXIT_NO_PLAN


def check(
    request: PlanRequest, source: PlanSource, *, max_hbm_utilization: float | None = None
) -> CheckReport:
    """Plan ``request`` (a progress line on stderr while it takes long) and report. Over
    the limit, plan again with the reservation that keeps the margin: that plan, or the
    planner's fixes when there is none, is the smallest fix."""
    from clients.cli.check_report import check_report, margin_request, with_margin_fix
    from clients.cli.plan import ProgressLine

    with ProgressLine() as progress:
        answer = source(request, on_progress=progress.update)
    report = check_report(
        request, answer.plan, answer.infeasibility, max_hbm_utilization=max_hbm_utilization
    )
    tightened = margin_request(request, report)
    if tightened is None:
        return report
    with ProgressLine() as progress:
        answer = source(tightened, on_progress=progress.update)
    return with_margin_fix(report, tightened, answer.plan, answer.infeasibility)


def _render(report: CheckReport, request: PlanRequest, format: str, source: str) -> str:
    from clients.cli.check_report import render_markdown, render_text

    if format == "json":
        return report.model_dump_json(indent=2) + "\n"
    if format == "markdown":
        return render_markdown(report, request, source)
    return render_text(report, request, source)


def _emit(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
