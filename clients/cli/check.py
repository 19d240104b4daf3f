"""``shardplan check REQUEST``: does the model fit? For CI (exit codes, markdown for the
pull request) and for capacity planning (the least world size, a what-if sweep over world
and HBM sizes). Solves here, with OR-Tools (``shardplan[planner]``), or with ``--server
URL`` on the planner service, which needs only the core install: each check and each
sweep cell is one POST /v1/plans there. One piece still runs here: ``--min-world-size``
on a request that fits searches below its world size with the local planner, so it needs
``shardplan[planner]`` even with ``--server`` (exit 2 naming the extra when missing).

Gates a team sets fail the check with their numbers: --max-hbm-utilization,
--require-kernels (fused: nothing may leave HBM), --max-step-ms (the predicted step time)
and --max-regression against --baseline, the plan running today (a plan file; a plan id or
alias:NAME from --server). Every report says where the bytes live: tables and bytes per
kernel and memory tier, tables that left HBM, HBM and DDR headroom, the step time.

Exit 0: it fits and passes every gate; 3: it does not fit, or a gate fails; 2: bad input;
with --server also 4 (the service unreachable or failing) and 5 (a plan that fails its
integrity check). A sweep exits 0 when any cell fits, ``--min-world-size`` when
every HBM size has a least world size that passes the check there.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from clients.cli.exits import EXIT_NO_PLAN, EXIT_OK
from clients.cli.output import add_output_argument
from clients.cli.remote import add_server_arguments, connected

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from clients.http import PlannerClient
    from planner_service.check.baseline import Baseline
    from planner_service.check.source import PlanSource
    from planner_service.check.what_if import LeastWorldSizes, Sweep, WhatIf
    from planner_service.plan.api import CheckGates, CheckReport
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
    parser.add_argument(
        "--require-kernels",
        metavar="KERNEL,...",
        help="fail when a table is on another compute kernel: fused (or fused,dense) fails "
        "when anything leaves HBM for host memory (fused_uvm, fused_uvm_caching)",
    )
    parser.add_argument(
        "--max-step-ms",
        metavar="MS",
        help="fail when the predicted step time (the slowest rank) is above this",
    )
    parser.add_argument(
        "--baseline",
        metavar="PLAN",
        help="compare with this plan (the one running today): a plan file, or with --server "
        "a plan id or alias:NAME; reports step time, memory, tiers and bytes that would move",
    )
    parser.add_argument(
        "--max-regression",
        metavar="SHARE",
        help="fail when the predicted step time is more than this above --baseline's, e.g. "
        "5%% or 0.05",
    )
    parser.add_argument("--format", choices=FORMATS, default="text", help="default: text")
    add_output_argument(parser, "the report")
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
            return _run(args, ServiceSource(client), client)
    return _run(args, source or solve_locally)


def _run(args: argparse.Namespace, source: PlanSource, client: PlannerClient | None = None) -> int:
    from clients.cli.files import read_input, source_name
    from clients.cli.numbers import parse_byte_size, parse_count, parse_list

    gates = _gates(args)
    limit = gates.max_hbm_utilization
    hbm = parse_list(args.hbm, "--hbm", parse_byte_size) if args.hbm is not None else []
    world_sizes = (
        parse_list(args.world_sizes, "--world-sizes", parse_count)
        if args.world_sizes is not None
        else []
    )
    from planner_service.plan.codec import parse_request

    request = parse_request(read_input(args.request), source=source_name(args.request))
    if args.min_world_size or world_sizes or hbm:
        _sweep_takes_no_gates(args)
        return _what_if(args, request, (world_sizes, hbm), _how(source, limit))
    baseline = _baseline(args.baseline, client) if args.baseline is not None else None
    return _check(args, request, source, gates, baseline)


def _gates(args: argparse.Namespace) -> CheckGates:
    """The gates the options set, each value checked (an InputError naming the option)."""
    from clients.cli.numbers import (
        parse_fraction,
        parse_kernels,
        parse_milliseconds,
        parse_share,
    )
    from planner_service.plan.api import CheckGates

    def given(text: str | None, parse: Callable[[str, str], Any], option: str) -> Any:
        return None if text is None else parse(text, option)

    if args.max_regression is not None and args.baseline is None:
        raise _bad("--max-regression", args.max_regression, "needs --baseline to compare with")
    return CheckGates(
        max_hbm_utilization=given(
            args.max_hbm_utilization, parse_fraction, "--max-hbm-utilization"
        ),
        require_kernels=given(args.require_kernels, parse_kernels, "--require-kernels"),
        max_step_ms=given(args.max_step_ms, parse_milliseconds, "--max-step-ms"),
        max_regression=given(args.max_regression, parse_share, "--max-regression"),
    )


def _sweep_takes_no_gates(args: argparse.Namespace) -> None:
    """A what-if answers at other sizes: only --max-hbm-utilization applies there."""
    for option in ("require_kernels", "max_step_ms", "baseline", "max_regression"):
        value = getattr(args, option)
        if value is not None:
            flag = "--" + option.replace("_", "-")
            raise _bad(
                flag,
                value,
                "applies to one check, not to a what-if (--min-world-size, --world-sizes, "
                "--hbm); run the check at the size you choose with it",
            )


def _baseline(text: str, client: PlannerClient | None) -> Baseline:
    """``--baseline``: a plan file (its content address checked), else a plan id or
    alias:NAME fetched from ``--server`` (verified by the client), marked imported when the
    service says its solver report is unverified (as ``POST /v1/check`` marks it)."""
    from clients.cli.files import read_verified_plan
    from planner_service.check.baseline import Baseline

    path = Path(text)
    if path.is_file():
        return Baseline(read_verified_plan(path), text)
    if client is None:
        raise _bad(
            "--baseline",
            text,
            "is no plan file here; a plan id (or a unique prefix of 8 or more hex digits) or "
            "alias:NAME is fetched from the planner service: give --server URL (or set "
            "$SHARDPLAN_SERVER)",
        )
    from clients.cli.stored_plans import ACCEPTED, fetch_named, plan_name

    try:
        name = plan_name(text, command="shardplan check", argument="--baseline")
    except ValueError:
        raise _bad("--baseline", text, f"is no plan file here, nor {ACCEPTED}") from None
    fetched = fetch_named(client, name, command="check")
    return Baseline(fetched.plan, text, imported=not fetched.solver_report_verified)


def _bad(option: str, value: str, message: str) -> Exception:
    from planner_service.plan.errors import FieldProblem, InputError

    return InputError("shardplan check", [FieldProblem(option, message, value)])


def _check(
    args: argparse.Namespace,
    request: PlanRequest,
    source: PlanSource,
    gates: CheckGates,
    baseline: Baseline | None,
) -> int:
    """One check, with a progress line on stderr while a solve takes long."""
    from clients.cli.files import source_name
    from clients.cli.progress import with_progress_line
    from planner_service.check.report import check

    report = check(request, with_progress_line(source), gates, baseline)
    _emit(_render(report, request, args.format, source_name(args.request)), args.output)
    return EXIT_OK if report.passed else EXIT_NO_PLAN


def _what_if(
    args: argparse.Namespace,
    request: PlanRequest,
    sizes: tuple[list[int], list[int]],
    how: WhatIf,
) -> int:
    """The least world size per HBM size (``--min-world-size``), or the sweep over
    ``sizes`` (world sizes x HBM sizes): its JSON or its table, and whether it passed."""
    from clients.cli.plan_source import search_locally
    from planner_service.check.what_if import least_world_sizes, sweep
    from planner_service.reports.what_if import least_table, sweep_table

    world_sizes, hbm = sizes
    answer: LeastWorldSizes | Sweep
    if args.min_world_size:
        answer = least_world_sizes(request, hbm, search_locally, how)
        table = least_table(answer, args.format == "markdown")
    else:
        answer = sweep(request, world_sizes, hbm, how)
        table = sweep_table(answer, args.format == "markdown")
    _emit(answer.model_dump_json(indent=2) if args.format == "json" else table, args.output)
    return EXIT_OK if answer.passed else EXIT_NO_PLAN


def _how(source: PlanSource, limit: float | None) -> WhatIf:
    """The what-if as this command answers it: a progress bar on stderr, and errors that
    name its options."""
    from clients.cli.numbers import SOURCE
    from clients.cli.progress import CellProgress
    from planner_service.check.what_if import WhatIf, WhatIfNames

    names = WhatIfNames(source=SOURCE, world_sizes="--world-sizes", hbm="--hbm")
    return WhatIf(source, names, max_hbm_utilization=limit, progress=CellProgress)


def _render(report: CheckReport, request: PlanRequest, format: str, source: str) -> str:
    from planner_service.reports.check import render_markdown, render_text

    if format == "json":
        return report.model_dump_json(indent=2) + "\n"
    if format == "markdown":
        return render_markdown(report, request, source)
    return render_text(report, request, source)


def _emit(text: str, output: Path | None) -> None:
    from clients.cli.output import emit

    emit(text if text.endswith("\n") else text + "\n", output)
