"""``shardplan serve``: run the planner service under uvicorn. Needs ``shardplan[service]``;
the only command that imports ``planner_service.service``, inside the command."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

from clients.cli.exits import EXIT_OK
from clients.cli.extras import needs_extra
from planner_service import __version__

# The service's default store (settings.DEFAULT_DATABASE), for the help text only.
DEFAULT_DATABASE = "var/shardplan.db"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("serve", help="run the planner service")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    parser.add_argument(
        "--db",
        help="plan store: a SQLite path or postgresql://… (default: $SHARDPLAN_DATABASE_URL, "
        f"else {DEFAULT_DATABASE})",
    )
    parser.add_argument("--workers", type=int, default=1, help="HTTP worker processes (default 1)")
    parser.add_argument(
        "--solve-workers",
        type=int,
        help="solver processes per HTTP worker (default: $SHARDPLAN_SOLVE_WORKERS, else the "
        "number of CPUs)",
    )
    parser.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    with needs_extra("serve", "service"):
        import uvicorn

        from planner_service.service.settings import SUPERVISOR_PID_VARIABLE, Settings
    from planner_service.plan.errors import FieldProblem, InputError

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
        f"store {redacted(settings.database_url)}",
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
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),  # uvicorn takes int s
    )
    return EXIT_OK


def redacted(url: str) -> str:
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
    from clients.cli.files import cannot_write, check_writable

    if url.startswith(("postgresql://", "postgres://")):
        return
    path = Path(url.removeprefix("sqlite://"))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # as the store does
    except OSError as error:
        raise cannot_write(path, "--db", error) from None
    check_writable(path, "--db")
