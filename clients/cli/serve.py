"""``shardplan serve``: run the planner service under uvicorn until stopped (Ctrl-C or
SIGTERM: it finishes what it is answering, then exits). Needs ``shardplan[service]``; the
only command that imports ``planner_service.service``, inside the command.

Exit 0: stopped; 2: bad input (a flag or variable out of range, a store that cannot be
created, the service extra missing)."""

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
# Where a container sets what the flags set (the image's only configuration is its
# environment): a flag given wins over its variable, the variable over the default.
HOST_VARIABLE, DEFAULT_HOST = "SHARDPLAN_HOST", "127.0.0.1"
PORT_VARIABLE, DEFAULT_PORT = "SHARDPLAN_PORT", 8000
WORKERS_VARIABLE, DEFAULT_WORKERS = "SHARDPLAN_HTTP_WORKERS", 1
MAX_PORT = 65535
# Connections waiting to be accepted (the kernel caps it at net.core.somaxconn): a job's
# ranks all connect at startup, and uvicorn's default of 2,048 is half a 4,096-rank job.
BACKLOG = 4096


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("serve", help="run the planner service", description=__doc__)
    parser.add_argument(
        "--host", help=f"address to bind (default: ${HOST_VARIABLE}, else {DEFAULT_HOST})"
    )
    parser.add_argument(
        "--port", type=int, help=f"port to bind (default: ${PORT_VARIABLE}, else {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--db",
        help="plan store: a SQLite path or postgresql://… (default: $SHARDPLAN_DATABASE_URL, "
        f"else {DEFAULT_DATABASE})",
    )
    parser.add_argument(
        "--workers",
        type=int,
        help=f"HTTP worker processes (default: ${WORKERS_VARIABLE}, else {DEFAULT_WORKERS})",
    )
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
    host = args.host or os.environ.get(HOST_VARIABLE, "").strip() or DEFAULT_HOST
    port = _number(args.port, "--port", PORT_VARIABLE, DEFAULT_PORT, 0, MAX_PORT)
    workers = _number(args.workers, "--workers", WORKERS_VARIABLE, DEFAULT_WORKERS, 1, None)
    # Every worker process builds its app from the environment: flags become variables.
    if args.db:
        os.environ["SHARDPLAN_DATABASE_URL"] = args.db
    if args.solve_workers is not None:
        os.environ["SHARDPLAN_SOLVE_WORKERS"] = str(args.solve_workers)
    settings = Settings.from_env()  # refuse bad settings here, once, with a clear message
    _check_store_path(settings.database_url)
    open_files = raise_open_files_limit()
    if workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="shardplan-metrics-")
    # uvicorn supervises N > 1 workers from this process; they die with it, even by SIGKILL.
    os.environ.pop(SUPERVISOR_PID_VARIABLE, None)
    if workers > 1:
        os.environ[SUPERVISOR_PID_VARIABLE] = str(os.getpid())
    print(
        f"shardplan {__version__}: serving on http://{host}:{port} with "
        f"{workers} HTTP worker(s) x {settings.solve_workers} solver process(es), "
        f"store {redacted(settings.database_url)}"
        + ("" if open_files is None else f", up to {open_files} open files per process"),
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(
        "planner_service.service.app:create_served_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level="warning",
        backlog=BACKLOG,
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),  # uvicorn takes int s
    )
    return EXIT_OK


def raise_open_files_limit() -> int | None:
    """Raise this process's soft limit on open files to its hard limit (workers inherit
    it), as nginx's ``worker_rlimit_nofile`` does: each connection is a file, and a job's
    ranks connect at once, while many systems start services with a soft limit of 1,024.
    Returns the limit now in force (None where there is none to read: Windows)."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # e.g. an unlimited hard limit the kernel refuses
            pass
    return soft


def _number(
    flag_value: int | None, flag: str, variable: str, default: int, low: int, high: int | None
) -> int:
    """The flag's value, else the variable's (an empty one means the default), checked
    against ``low``..``high`` under the name it came from."""
    from planner_service.plan.errors import FieldProblem, InputError

    source, problem_path, value = flag, "", flag_value
    if value is None:
        text = os.environ.get(variable, "").strip()
        if not text:
            return default
        source, problem_path = "environment", variable
        try:
            value = int(text)
        except ValueError:
            raise InputError(source, [FieldProblem(variable, "must be an integer", text)]) from None
    if value < low or (high is not None and value > high):
        accepted = f"at least {low}" if high is None else f"between {low} and {high}"
        raise InputError(source, [FieldProblem(problem_path, f"must be {accepted}", value)])
    return value


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
