"""The ``shardplan`` command line.

Each command parses its arguments, calls one library function and renders the result.
Exit codes: 0 success, 1 the plan is invalid, 2 bad input (usage, unreadable or invalid
files, output paths that cannot be written, checked before solving), 3 no plan exists (a
table fits nowhere, or the solver proves it), 130 interrupted (Ctrl-C, at once, even
mid-solve). Bad input never shows a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel

from planner_service import __version__
from planner_service.costs.enumerate import enumerate_options, fit_options
from planner_service.plan.capacity import usable_capacity
from planner_service.plan.codec import parse_plan, parse_request, plan_bytes
from planner_service.plan.errors import FieldProblem, InputError
from planner_service.plan.types import PlanRequest, ShardingPlan
from planner_service.reports import options_document, plan_table
from planner_service.service.settings import DEFAULT_DATABASE, SUPERVISOR_PID_VARIABLE, Settings
from planner_service.solve.pipeline import solve
from planner_service.validate.validator import validate_plan

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_BAD_INPUT = 2
EXIT_NO_PLAN = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
STDIN = Path("-")

_SCHEMA_MODELS: dict[str, type[BaseModel]] = {"request": PlanRequest, "plan": ShardingPlan}


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.command
    try:
        if command is _serve:  # uvicorn shuts down gracefully on Ctrl-C itself
            return command(args)
        return _exit_on_ctrl_c(lambda: command(args))
    except InputError as error:
        print(error.render(), file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # e.g. `shardplan schema | head`
        return EXIT_OK


def _exit_on_ctrl_c(work: Callable[[], int]) -> int:
    """Run ``work`` in a thread while the main thread waits for Ctrl-C, which ends the
    process at once with exit 130.

    Python's own KeyboardInterrupt cannot do this during a solve: it is raised only when the
    main thread is back in Python, which CP-SAT's search is not until its time limit, and
    CP-SAT installs its own SIGINT handler while it searches. That handler ends only the
    current search, so the solve went on to its next stage (three Ctrl-Cs, then a plan and
    exit 0), and resets SIGINT to the default when done. SIGINT blocked in every thread
    started here and taken by ``sigwait`` runs no handler at all; of the threads native
    libraries start at import, which do not block it, Linux picks none while the main
    thread waits for it.
    """
    if not hasattr(signal, "pthread_sigmask"):  # Windows: KeyboardInterrupt it is
        return work()
    main_thread = threading.get_ident()
    outcome: list[int | BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as error:  # re-raised in the main thread
            outcome.append(error)
        finally:
            signal.pthread_kill(main_thread, signal.SIGINT)  # wakes it: done

    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        worker = threading.Thread(target=run, name="shardplan", daemon=True)
        worker.start()
        signal.sigwait({signal.SIGINT})
        if not outcome:
            print("shardplan: interrupted", file=sys.stderr, flush=True)
            os._exit(EXIT_INTERRUPTED)
        worker.join()
        while signal.SIGINT in signal.sigpending():  # a Ctrl-C just as it finished
            signal.sigwait({signal.SIGINT})
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shardplan", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"shardplan {__version__}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    validate = sub.add_parser("validate", help="check a plan against its request")
    validate.add_argument("request", type=Path, help="PlanRequest JSON file (- for stdin)")
    validate.add_argument("plan", type=Path, help="ShardingPlan JSON file (- for stdin)")
    validate.set_defaults(command=_validate)

    plan = sub.add_parser("plan", help="solve a request and print the plan")
    plan.add_argument("request", type=Path, help="PlanRequest JSON file (- for stdin)")
    plan.add_argument(
        "--format",
        choices=("json", "table"),
        default="json",
        help="json: the plan document (default); table: stats tables",
    )
    plan.add_argument("--output", "-o", type=Path, help="also write the plan JSON to this file")
    plan.set_defaults(command=_plan)

    options = sub.add_parser(
        "options", help="print every table's sharding options with perf and storage estimates"
    )
    options.add_argument("request", type=Path, help="PlanRequest JSON file (- for stdin)")
    options.add_argument("--all", action="store_true", help="include options that no rank can hold")
    options.set_defaults(command=_options)

    schema = sub.add_parser("schema", help="print the JSON Schemas of requests and plans")
    schema.add_argument("--model", choices=sorted(_SCHEMA_MODELS), help="print only this one")
    schema.set_defaults(command=_schema)

    serve = sub.add_parser("serve", help="run the planner service")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    serve.add_argument(
        "--db",
        help="plan store: a SQLite path or postgresql://… (default: $SHARDPLAN_DATABASE_URL, "
        f"else {DEFAULT_DATABASE})",
    )
    serve.add_argument("--workers", type=int, default=1, help="HTTP worker processes (default 1)")
    serve.add_argument(
        "--solve-workers",
        type=int,
        help="solver processes per HTTP worker (default: $SHARDPLAN_SOLVE_WORKERS, else the "
        "number of CPUs)",
    )
    serve.set_defaults(command=_serve)
    return parser


def _validate(args: argparse.Namespace) -> int:
    if args.request == args.plan == STDIN:
        raise InputError(
            "validate",
            [FieldProblem("plan", "only one of request and plan can be - (stdin)", "-")],
        )
    request = parse_request(_read(args.request), source=_name(args.request))
    plan = parse_plan(_read(args.plan), source=_name(args.plan))
    violations = validate_plan(request, plan)
    for violation in violations:
        print(f"{violation.code.value}: {violation.message}")
    if violations:
        print(f"invalid: {len(violations)} violation(s)", file=sys.stderr)
        return EXIT_INVALID
    print(
        f"valid: plan {plan.plan_id[:12]} places {len(plan.tables)} table(s) on "
        f"{plan.world_size} rank(s)"
    )
    return EXIT_OK


def _plan(args: argparse.Namespace) -> int:
    request = parse_request(_read(args.request), source=_name(args.request))
    if args.output:
        _check_writable(args.output, "--output")
    with _ProgressLine() as progress:
        outcome = solve(request, on_progress=progress.update)
    if outcome.plan is None:
        assert outcome.infeasibility is not None
        if args.format == "json":
            print(outcome.infeasibility.model_dump_json(indent=2))
        print(outcome.infeasibility.render(), file=sys.stderr)
        return EXIT_NO_PLAN
    document = plan_bytes(outcome.plan)
    if args.output:
        _write(args.output, "--output", document + b"\n")
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


class _ProgressLine:
    """Prints a progress line on stderr every 2 s while a solve runs longer than that."""

    INTERVAL_S = 2.0

    def __init__(self) -> None:
        self._state: tuple[str, float | None, float | None] = ("starting", None, None)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._start = time.monotonic()

    def update(self, stage: str, best: float | None, bound: float | None) -> None:
        self._state = (stage, best, bound)

    def __enter__(self) -> _ProgressLine:
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


def _options(args: argparse.Namespace) -> int:
    request = parse_request(_read(args.request), source=_name(args.request))
    enumerated = enumerate_options(request)
    fitted = fit_options(request, enumerated)
    tables = enumerated if args.all else fitted.tables
    document = options_document(request, tables, fitted.problems, fitted.capacities)
    json.dump(document, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")
    for problem in fitted.problems:
        print(f"{problem.code.value}: {problem.message}", file=sys.stderr)
    return EXIT_NO_PLAN if fitted.problems else EXIT_OK


def _schema(args: argparse.Namespace) -> int:
    names = [args.model] if args.model else sorted(_SCHEMA_MODELS)
    schemas = {
        _SCHEMA_MODELS[name].__name__: _SCHEMA_MODELS[name].model_json_schema() for name in names
    }
    print(json.dumps(schemas, indent=2, sort_keys=True))
    return EXIT_OK


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    # Every worker process builds its app from the environment: flags become variables.
    if args.db:
        os.environ["SHARDPLAN_DATABASE_URL"] = args.db
    if args.solve_workers is not None:
        os.environ["SHARDPLAN_SOLVE_WORKERS"] = str(args.solve_workers)
    if args.workers < 1:
        raise InputError("--workers", [FieldProblem("", "must be at least 1", args.workers)])
    settings = Settings.from_env()  # refuse bad settings here, once, with a clear message
    _check_store_path(settings.database_url)
    if args.workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="shardplan-metrics-")
    # uvicorn supervises N > 1 workers from this process; they die with it, even by SIGKILL.
    os.environ.pop(SUPERVISOR_PID_VARIABLE, None)
    if args.workers > 1:
        os.environ[SUPERVISOR_PID_VARIABLE] = str(os.getpid())
    print(
        f"shardplan {__version__}: serving on http://{args.host}:{args.port} with "
        f"{args.workers} HTTP worker(s) x {settings.solve_workers} solver process(es), "
        f"store {_redacted(settings.database_url)}",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(
        "planner_service.service.app:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level="warning",
        timeout_graceful_shutdown=10,
    )
    return EXIT_OK


def _redacted(url: str) -> str:
    """A database URL without its password."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        credentials, _, host = rest.rpartition("@")
        user = credentials.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"
    return url


def _check_store_path(url: str) -> None:
    """A SQLite file that cannot be created fails every worker's start with a traceback, so
    it is refused here. PostgreSQL is the service's to check: it serves anyway, and /readyz
    says why."""
    if url.startswith(("postgresql://", "postgres://")):
        return
    path = Path(url.removeprefix("sqlite://"))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # as the store does
    except OSError as error:
        raise _cannot_write(path, "--db", error) from None
    _check_writable(path, "--db")


def _check_writable(path: Path, option: str) -> None:
    """Fail as writing ``path`` would, but before a long solve rather than after it, and
    without leaving a file behind."""
    try:
        if path.exists():
            path.open("ab").close()
        else:
            tempfile.TemporaryFile(dir=path.parent).close()
    except OSError as error:
        raise _cannot_write(path, option, error) from None


def _write(path: Path, option: str, data: bytes) -> None:
    try:
        path.write_bytes(data)
    except OSError as error:
        raise _cannot_write(path, option, error) from None


def _cannot_write(path: Path, option: str, error: OSError) -> InputError:
    reason = f"{error.strerror} (choose another path)"
    if isinstance(error, FileNotFoundError | NotADirectoryError | FileExistsError):
        reason = f"{path.parent} is not a directory (create it, or choose another path)"
    return InputError(str(path), [FieldProblem(option, f"cannot write: {reason}")])


def _name(path: Path) -> str:
    return "<stdin>" if path == STDIN else str(path)


def _read(path: Path) -> bytes:
    try:
        return sys.stdin.buffer.read() if path == STDIN else path.read_bytes()
    except OSError as error:
        raise InputError(
            str(path), [FieldProblem("", f"cannot read file: {error.strerror}")]
        ) from None


if __name__ == "__main__":
    sys.exit(main())
