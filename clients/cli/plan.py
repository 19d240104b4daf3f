"""``shardplan plan REQUEST``: solve a request and print the plan (or why none exists).
Needs OR-Tools: ``shardplan[planner]``."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

from clients.cli.exits import EXIT_NO_PLAN, EXIT_OK
from clients.cli.extras import needs_extra
from clients.cli.request import add_request_arguments, read_request


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("plan", help="solve a request and print the plan")
    add_request_arguments(parser)
    parser.add_argument(
        "--format",
        choices=("json", "table"),
        default="json",
        help="json: the plan document (default); table: stats tables",
    )
    parser.add_argument("--output", "-o", type=Path, help="also write the plan JSON to this file")
    parser.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    with needs_extra("plan", "planner"):
        from planner_service.solve.pipeline import solve
    from clients.cli.files import check_writable, write_output
    from planner_service.plan.capacity import usable_capacity
    from planner_service.plan.codec import plan_bytes
    from planner_service.reports import plan_table

    request = read_request(args)
    if args.output:
        check_writable(args.output, "--output")
    with ProgressLine() as progress:
        outcome = solve(request, on_progress=progress.update)
    if outcome.plan is None:
        assert outcome.infeasibility is not None
        if args.format == "json":
            print(outcome.infeasibility.model_dump_json(indent=2))
        print(outcome.infeasibility.render(), file=sys.stderr)
        return EXIT_NO_PLAN
    document = plan_bytes(outcome.plan)
    if args.output:
        write_output(args.output, "--output", document + b"\n")
    if args.format == "json":
        sys.stdout.write(document.decode() + "\n")
    else:
        capacities = usable_capacity(request.topology, request.constraints)
        sys.stdout.write(
            plan_table(
                request, outcome.plan, capacities, outcome.rank_io_bytes, outcome.wall_time_s
            )
        )
    report = outcome.plan.solver
    print(
        f"{report.status.value}: objective {report.objective:.6g} ms, lower bound "
        f"{report.lower_bound:.6g} ms, gap {report.gap:.2%}, {outcome.wall_time_s:.2f} s",
        file=sys.stderr,
    )
    return EXIT_OK


class ProgressLine:
    """Prints a progress line on stderr every 2 s while a solve runs longer than that."""

    INTERVAL_S = 2.0

    def __init__(self) -> None:
        self._state: tuple[str, float | None, float | None] = ("starting", None, None)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._start = time.monotonic()

    def update(self, stage: str, best: float | None, bound: float | None) -> None:
        self._state = (stage, best, bound)

    def __enter__(self) -> ProgressLine:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(self.INTERVAL_S):
            stage, best, bound = self._state
            parts = [f"planning: {time.monotonic() - self._start:.0f} s, {stage}"]
            if best is not None:
                parts.append(f"best {best:.6g} ms")
            if bound is not None:
                parts.append(f"bound {bound:.6g} ms")
            print(", ".join(parts), file=sys.stderr, flush=True)
