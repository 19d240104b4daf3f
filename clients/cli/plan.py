"""``shardplan plan REQUEST``: solve a request and print the plan (or why none exists).
Needs OR-Tools (``shardplan[planner]``), unless ``--server`` (or ``SHARDPLAN_SERVER``) has
the service solve it.

Output: the plan's JSON (``--format table``: its stats tables) on standard output, or in
FILE instead with ``-o FILE``; the solver's report on stderr. When no plan exists, the
explanation takes the plan's place (as JSON; with ``--format table`` only on stderr) and
stderr says it in words.

Exit 0: a plan; 2: bad input (an invalid request or file, an output path that cannot be
written; with --server, what the service refused); 3: no plan exists (a table fits no
rank, or the solver proves it); with --server also 4 (the service unreachable,
overloaded or failing) and 5 (a plan that fails its integrity check)."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from clients.cli.exits import EXIT_NO_PLAN, EXIT_OK
from clients.cli.extras import needs_extra
from clients.cli.output import add_output_argument, emit
from clients.cli.progress import ProgressLine
from clients.cli.remote import add_server_arguments, connected
from clients.cli.request import add_request_arguments, read_request

if TYPE_CHECKING:
    from clients.http import PlannerClient
    from planner_service.plan.api import SolveJob
    from planner_service.plan.types import Infeasibility, PlanRequest, ShardingPlan


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("plan", help="solve a request and print the plan", description=__doc__)
    add_request_arguments(parser)
    parser.add_argument(
        "--format",
        choices=("json", "table"),
        default="json",
        help="json: the plan document (default); table: stats tables",
    )
    add_output_argument(parser, "the plan (or, when none exists, its explanation)")
    parser.add_argument(
        "--previous-plan",
        type=Path,
        help="re-plan from this plan (ShardingPlan JSON file): sent as the request's "
        "options.previous_plan; options.max_moved_bytes and options.move_cost_ms_per_gib "
        "limit and price the moves (docs/requests.md)",
    )
    parser.add_argument(
        "--max-moved-bytes",
        metavar="SIZE",
        help='with --previous-plan: options.max_moved_bytes, e.g. "10GiB" or 0',
    )
    parser.add_argument(
        "--move-cost-ms-per-gib",
        metavar="MS",
        type=float,
        help="with --previous-plan: options.move_cost_ms_per_gib, milliseconds of "
        "objective per GiB moved",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="price shards with this device profile (shardplan calibrate's JSON): sets the "
        "request's options.cost_model to calibrated and options.device_profile to it "
        "(docs/requests.md)",
    )
    add_server_arguments(
        parser,
        server_help="solve on this planner service (POST /v1/plans as an async job, which "
        "stores the plan; progress from its event stream) instead of here: needs no "
        "OR-Tools; the same output and exit codes",
    )
    parser.set_defaults(command=run, exit_at_once=True)


# Writing a plan after its solve. Its JSON (schema 2.0) follows tables and ranks: 1.56 MB
# for 10,000 tables on 4,096 ranks, at about 2.3 ns a byte written to a file (5 ms for the
# 2.2 MB of a shard-list plan of 14,964 shards measured on the loaded 2-core machine); the
# stats tables (``--format table``) 164 ms for 2,002 tables (82 us per table) there.
# About three times that is kept.
WRITE_S_PER_TABLE = 1e-6
WRITE_S_PER_RANK = 2e-6
TABLE_S_PER_TABLE = 250e-6


@dataclass(frozen=True)
class Solved:
    """A plan or why there is none, with what the tables print beside the plan."""

    plan: ShardingPlan | None
    infeasibility: Infeasibility | None
    rank_io_bytes: list[tuple[int, int]]
    wall_time_s: float  # the solve's (the stats tables show it); with --server, the round trip's
    where: str  # "" here, " on SERVER (round trip)" with --server


def run(args: argparse.Namespace) -> int:
    from planner_service.plan.capacity import usable_capacity
    from planner_service.plan.codec import plan_bytes
    from planner_service.plan.errors import FieldProblem, InputError
    from planner_service.reports.plan_table import plan_table

    if args.previous_plan is None and (
        args.max_moved_bytes is not None or args.move_cost_ms_per_gib is not None
    ):
        problem = FieldProblem(
            "--previous-plan",
            "missing: --max-moved-bytes and --move-cost-ms-per-gib limit and price moves from "
            "a previous plan; give it as --previous-plan PLAN_FILE",
        )
        raise InputError("plan", [problem])
    with_files = args.previous_plan is not None or args.profile is not None
    request = _with_files(args) if with_files else read_request(args)
    if args.server is None:
        outcome = _solve_here(request, args.started_at, table=args.format == "table")
    else:
        with connected(args, "plan") as client:
            outcome = _solve_on(client, request)
    if outcome.plan is None:
        assert outcome.infeasibility is not None
        if args.format == "json":
            emit(outcome.infeasibility.model_dump_json(indent=2) + "\n", args.output)
        print(outcome.infeasibility.render(), file=sys.stderr)
        return EXIT_NO_PLAN
    if args.format == "json":
        emit(plan_bytes(outcome.plan) + b"\n", args.output)
    else:
        capacities = usable_capacity(request.topology, request.constraints)
        table = plan_table(
            request, outcome.plan, capacities, outcome.rank_io_bytes, outcome.wall_time_s
        )
        emit(table, args.output)
    report = outcome.plan.solver
    # The time the user waited: from the command's start, imports and writing included.
    wall_s = time.monotonic() - args.started_at
    print(
        f"{report.status.value}: objective {report.objective:.6g} ms, lower bound "
        f"{report.lower_bound:.6g} ms, gap {report.gap:.2%}, {wall_s:.2f} s{outcome.where}",
        file=sys.stderr,
    )
    if outcome.plan.migration is not None:
        migration = outcome.plan.migration
        print(
            f"moved from {migration.previous_plan_id[:12]}: {migration.moved_bytes:,} bytes "
            f"({migration.tables_moved} tables, {len(migration.ranks)} ranks send or receive)",
            file=sys.stderr,
        )
    return EXIT_OK


def _solve_here(request: PlanRequest, started_at: float, *, table: bool) -> Solved:
    """The solve, within what the command has left of ``options.time_limit_s`` since it
    started (``clock.py``), keeping time for writing the plan after it."""
    with needs_extra("plan", "planner"):
        from planner_service.solve.deadline import AfterSolve, Deadline
        from planner_service.solve.pipeline import solve
    after = AfterSolve(
        s_per_table=WRITE_S_PER_TABLE + (TABLE_S_PER_TABLE if table else 0.0),
        s_per_rank=WRITE_S_PER_RANK,
    )
    spent_s = time.monotonic() - started_at
    deadline = Deadline.for_time_limit(request.options.time_limit_s, spent_s=spent_s, after=after)
    with ProgressLine() as progress:
        outcome = solve(request, on_progress=progress.update, deadline=deadline)
    return Solved(
        outcome.plan, outcome.infeasibility, outcome.rank_io_bytes, outcome.wall_time_s, ""
    )


def _solve_on(client: PlannerClient, request: PlanRequest) -> Solved:
    """The service's plan, solved as an async job whose event stream feeds the progress
    line (so no connection is held for the whole solve, and a restarted service resumes
    it); the bytes each rank buffers are recomputed from its shards, as the validator
    prices them (the same estimates the solver used)."""
    from clients.http import NoPlanFound
    from planner_service.validate.usage import rank_usage

    start = time.monotonic()
    with ProgressLine() as progress:
        progress.update(f"on {client.base_url}", None, None)

        def report(job: SolveJob) -> None:
            stage = job.stage or job.status.value
            progress.update(f"{stage} on {client.base_url}", job.objective, job.lower_bound)

        infeasibility: Infeasibility | None = None
        try:
            plan = client.wait_for_plan(request, on_progress=report)
        except NoPlanFound as none:
            plan, infeasibility = None, none.infeasibility
    wall_time_s = time.monotonic() - start
    where = f" on {client.base_url} (round trip)"
    if plan is None:
        return Solved(None, infeasibility, [], wall_time_s, where)
    usage = rank_usage(request, plan.tables)
    io = usage.io_bytes(request.topology.world_size)
    return Solved(plan, None, io, wall_time_s, where)


def _with_files(args: argparse.Namespace) -> PlanRequest:
    """The request with what ``--previous-plan`` and ``--profile`` give added to its
    options before validating (the request's ``max_moved_bytes`` needs the previous plan,
    its ``cost_model`` the profile): the plan as ``options.previous_plan``, the profile as
    ``options.device_profile`` with ``options.cost_model`` calibrated. Each file is checked
    first, so a bad one is named as itself."""
    import json

    from clients.cli.files import read_input, read_profile, read_verified_plan, source_name
    from clients.cli.request import merged_request
    from planner_service.plan.canonical import canonical_bytes
    from planner_service.plan.codec import load_json, parse_request
    from planner_service.plan.errors import FieldProblem, InputError

    previous = None if args.previous_plan is None else read_verified_plan(args.previous_plan)
    profile = None if args.profile is None else read_profile(args.profile)
    source = source_name(args.request)
    if args.tables is None:
        document = load_json(read_input(args.request), source)
    else:
        document = merged_request(args.request, args.tables)[0]
    if not isinstance(document, dict) or not isinstance(document.get("options", {}), dict):
        raise InputError(source, [FieldProblem("", "must be a JSON object (a PlanRequest)")])
    options = document.setdefault("options", {})
    if previous is not None:
        options["previous_plan"] = json.loads(canonical_bytes(previous))
    if args.max_moved_bytes is not None:
        cap = args.max_moved_bytes
        options["max_moved_bytes"] = int(cap) if cap.isascii() and cap.isdigit() else cap
    if args.move_cost_ms_per_gib is not None:
        options["move_cost_ms_per_gib"] = args.move_cost_ms_per_gib
    if profile is not None:
        options["cost_model"] = "calibrated"
        options["device_profile"] = json.loads(canonical_bytes(profile))
    return parse_request(json.dumps(document), source=source)
