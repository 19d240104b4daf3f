"""``shardplan serve``: run the planner service under uvicorn until stopped (Ctrl-C or
SIGTERM: it finishes what it is answering, then exits). Needs ``shardplan[service]``;
the only command that imports ``planner_service.service``, inside the command.

It binds its port before it says it serves or starts anything: a port it cannot listen on
(another process has it, or it needs privileges) is one line naming the address, and exit
2. ``--access-log`` (or ``SHARDPLAN_ACCESS_LOG=1``) logs one line per request on stdout;
off by default, as at fleet scale a job's startup is thousands of lines.

Exit 0: stopped by Ctrl-C; 2: bad input (a flag or variable, the store's path, the port or
host it cannot bind, a missing extra). Stopped by SIGTERM, it ends as SIGTERM's default
does (uvicorn raises the signal again once it has shut down gracefully).
"""

from __future__ import annotations

import argparse
import copy
import errno
import math
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from clients.cli.exits import EXIT_BAD_INPUT, EXIT_OK, CommandFailed
from clients.cli.extras import needs_extra
from planner_service import __version__

# The service's default store (settings.DEFAULT_DATABASE), for the help text only.
DEFAULT_DATABASE = "var/shardplan.db"
# Where a container sets what the flags set (the image's only configuration is its
# environment): a flag given wins over its variable, the variable over the default.
HOST_VARIABLE, DEFAULT_HOST = "SHARDPLAN_HOST", "127.0.0.1"
PORT_VARIABLE, DEFAULT_PORT = "SHARDPLAN_PORT", 8000
WORKERS_VARIABLE, DEFAULT_WORKERS = "SHARDPLAN_HTTP_WORKERS", 1
ACCESS_LOG_VARIABLE = "SHARDPLAN_ACCESS_LOG"  # a service setting; --access-log sets it
MAX_PORT = 65535
# Connections waiting to be accepted (the kernel caps it at net.core.somaxconn): a job's
# ranks all connect at startup, and uvicorn's default of 2,048 is half a 4,096-rank job.
BACKLOG = 4096
# uvicorn's httptools protocol with limits on request heads (``http/heads.py``).
BOUNDED_PROTOCOL = "planner_service.service.http.heads:BoundedHttpToolsProtocol"


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
    parser.add_argument(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="log one line per request (client, request line, status) on stdout (default: "
        f"${ACCESS_LOG_VARIABLE}, else off)",
    )
    parser.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    with needs_extra("serve", "service"):
        import uvicorn  # noqa: F401 (here: a missing extra is one line, before anything)

        from planner_service.service.settings import SUPERVISOR_PID_VARIABLE, Settings
    host = args.host or os.environ.get(HOST_VARIABLE, "").strip() or DEFAULT_HOST
    port = _number(args.port, "--port", PORT_VARIABLE, DEFAULT_PORT, 0, MAX_PORT)
    workers = _number(args.workers, "--workers", WORKERS_VARIABLE, DEFAULT_WORKERS, 1, None)
    # Every worker process builds its app from the environment: flags become variables.
    if args.db:
        os.environ["SHARDPLAN_DATABASE_URL"] = args.db
    if args.solve_workers is not None:
        os.environ["SHARDPLAN_SOLVE_WORKERS"] = str(args.solve_workers)
    if args.access_log is not None:
        os.environ[ACCESS_LOG_VARIABLE] = "1" if args.access_log else "0"
    settings = Settings.from_env()  # refuse bad settings here, once, with a clear message
    _check_store_path(settings.database_url)
    listening = listening_socket(host, port)
    port = listening.getsockname()[1]  # the one the system chose for --port 0
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
    serve_on(
        listening,
        app="planner_service.service.app:create_served_app",
        factory=True,
        http=BOUNDED_PROTOCOL,  # 431 past SHARDPLAN_MAX_HEADER_BYTES / _REQUEST_HEAD_BYTES
        host=host,
        port=port,
        workers=workers,
        log_config=log_config(access_log=settings.access_log),
        log_level=None,  # the levels are log_config's
        access_log=settings.access_log,
        backlog=BACKLOG,
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),  # uvicorn takes int s
    )
    return EXIT_OK


def listening_socket(host: str, port: int) -> socket.socket:
    """The socket the service accepts on, bound as uvicorn binds one (``SO_REUSEADDR``;
    IPv6 when the host has a colon) but here, before anything is printed or started, so
    that a port it cannot have is one line and exit 2 rather than a line saying it serves
    followed by uvicorn's error and exit 3. uvicorn's workers listen on it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
        # Listening now claims the port: Linux lets several sockets bind one address with
        # SO_REUSEADDR as long as none of them listens yet.
        listening.listen(BACKLOG)
    except OSError as error:
        listening.close()
        hint = _BIND_HINTS.get(error.errno or 0, "choose another --host or --port")
        raise CommandFailed(
            f"shardplan serve: cannot listen on {host}:{port}: {error.strerror or error}; {hint}",
            EXIT_BAD_INPUT,
        ) from None
    listening.set_inheritable(True)
    return listening


_BIND_HINTS = {
    errno.EADDRINUSE: "another process has it: stop that one, or choose another --port",
    errno.EACCES: "ports below 1024 need privileges: choose another --port",
    errno.EADDRNOTAVAIL: "no interface of this machine has that address: choose another --host",
}


def serve_on(listening: socket.socket, **options: Any) -> None:
    """What ``uvicorn.run(**options)`` does, on a socket bound already: one server in this
    process, or ``workers`` processes under uvicorn's supervisor, each accepting on
    ``listening``."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    config = uvicorn.Config(**options)
    try:
        if config.workers > 1:
            Multiprocess(config, sockets=[listening]).run()
        else:
            uvicorn.Server(config).run(sockets=[listening])
    except KeyboardInterrupt:  # Ctrl-C: uvicorn has shut down gracefully already
        pass


def log_config(*, access_log: bool) -> dict[str, Any]:
    """uvicorn's logging, at warnings and errors only, and with ``access_log`` one line per
    request on stdout (uvicorn's format: client address, request line, status)."""
    from uvicorn.config import LOGGING_CONFIG

    config: dict[str, Any] = copy.deepcopy(LOGGING_CONFIG)
    loggers = config["loggers"]
    loggers["uvicorn"]["level"] = loggers["uvicorn.error"]["level"] = "WARNING"
    loggers["uvicorn.access"]["level"] = "INFO" if access_log else "WARNING"
    return config


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
