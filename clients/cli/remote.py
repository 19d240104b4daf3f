"""What the commands that talk to the planner service share: ``--server`` (or
``SHARDPLAN_SERVER``), ``--token`` (or ``SHARDPLAN_TOKEN``) and ``--retries``; opening the
HTTP client (``clients.http``, imported inside ``connected`` only, so that ``--version``
and ``--help`` load no httpx); and the client's errors as one line on stderr and an exit
code:

- 2 (bad input): the service refused the input (a 4xx: a request over its limits, an
  unknown plan id or alias, a missing or refused token), or ``--server`` is not a URL the
  client can use;
- 4 (unavailable): no answer after every retry (down, unreachable, overloaded: 429/503),
  or the service failed (5xx), or answered with something that is not the document
  expected; trying again later may help;
- 5 (integrity): a plan (or device profile) whose content is not what its id addresses
  (changed or damaged on the way, or in the service's store); do not use it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from clients.cli.exits import EXIT_BAD_INPUT, EXIT_INTEGRITY, EXIT_UNAVAILABLE, CommandFailed

if TYPE_CHECKING:
    from clients.http import FetchedPlan, PlannerClient

SERVER_ENV = "SHARDPLAN_SERVER"
TOKEN_ENV = "SHARDPLAN_TOKEN"
DEFAULT_RETRIES = 4


def add_server_arguments(parser: argparse.ArgumentParser, *, server_help: str) -> None:
    """``--server``, ``--token``, ``--retries``. ``--server`` defaults to
    ``$SHARDPLAN_SERVER`` here, the one place that reads it, so every command that takes
    ``--server`` (and decides by it whether to solve here) honours the variable alike."""
    parser.add_argument(
        "--server",
        metavar="URL",
        default=os.environ.get(SERVER_ENV, "").strip() or None,
        help=f"{server_help} (default: ${SERVER_ENV})",
    )
    parser.add_argument(
        "--token",
        help=f"bearer token for the service (default: ${TOKEN_ENV}, which keeps it off the "
        "command line, where other users of the machine can see it)",
    )
    parser.add_argument(
        "--retries",
        type=_retries,
        default=DEFAULT_RETRIES,
        metavar="N",
        help="further attempts after the first on connection errors, 429, 502-504 (default: "
        f"{DEFAULT_RETRIES}, with exponential backoff, about 8 s in all)",
    )


def cached_plan(
    args: argparse.Namespace, plan_id: str, cache_dir: Path | None
) -> FetchedPlan | None:
    """``plan_id`` from ``cache_dir``, verified, with what the service said of its solver
    report, without opening a client (no httpx): a job's launch script starts in the time
    it takes to read the vocabulary. Plans never change, so the client would answer from
    the same file; ``--server`` is still checked."""
    _server_url(args.server)
    if cache_dir is None:
        return None
    from clients.http.cache import DiskCache

    try:
        return DiskCache(cache_dir).fetched(plan_id)
    except OSError as error:  # the cache folder cannot be made or read
        raise _cannot_use_cache(cache_dir, error) from None


@contextmanager
def connected(
    args: argparse.Namespace,
    command: str,
    *,
    cache_dir: Path | None = None,
    document: str = "plan",
) -> Iterator[PlannerClient]:
    """A client for ``args.server``, closed after; the client's errors become
    ``CommandFailed`` with the exit codes of this module's docstring (``document``: what
    the command fetches, as an integrity failure names it)."""
    from clients.http import PlannerClient

    server = _server_url(args.server)
    token = args.token or os.environ.get(TOKEN_ENV) or None
    try:
        client = PlannerClient(server, token=token, retries=args.retries, cache_dir=cache_dir)
    except OSError as error:  # the cache folder cannot be made
        raise _cannot_use_cache(cache_dir, error) from None
    try:
        with client, _failures(command, server, document):
            yield client
    except OSError as error:
        if cache_dir is None or error.filename is None:
            raise
        raise _cannot_use_cache(cache_dir, error) from None


@contextmanager
def _failures(command: str, server: str, document: str) -> Iterator[None]:
    from clients.http import (
        BadRequest,
        Forbidden,
        IntegrityError,
        PlannerError,
        PlannerHTTPError,
        Unauthorized,
    )

    prefix = f"shardplan {command}"
    try:
        yield
    except Unauthorized:
        message = f"{server} needs a token for this: pass --token or set ${TOKEN_ENV}"
        raise CommandFailed(f"{prefix}: {message}", EXIT_BAD_INPUT) from None
    except Forbidden:
        message = f"{server} does not accept this token (--token or ${TOKEN_ENV})"
        raise CommandFailed(f"{prefix}: {message}", EXIT_BAD_INPUT) from None
    except BadRequest as error:
        message = f"{server} refused the input: {error.detail}{_fields(error)}"
        raise CommandFailed(f"{prefix}: {message}", EXIT_BAD_INPUT) from None
    except IntegrityError as error:
        message = f"integrity check failed, the {document} is not used: {error}"
        raise CommandFailed(f"{prefix}: {message}", EXIT_INTEGRITY) from None
    except PlannerHTTPError as error:  # 404 is the command's to explain; 5xx, 409
        code = EXIT_BAD_INPUT if error.status < 500 else EXIT_UNAVAILABLE
        raise CommandFailed(f"{prefix}: {error}", code) from None
    except PlannerError as error:
        # PlannerUnavailable and UnexpectedResponse: 4; an unusable URL (not retried): 2.
        code = EXIT_UNAVAILABLE if _service_trouble(error) else EXIT_BAD_INPUT
        raise CommandFailed(f"{prefix}: {error}", code) from None


@contextmanager
def missing_is_bad_input(message: str) -> Iterator[None]:
    """A 404 from the service (no such plan, alias or profile) as exit 2 with ``message``,
    which names what was asked for and where."""
    from clients.http import NotFound

    try:
        yield
    except NotFound:
        raise CommandFailed(message, EXIT_BAD_INPUT) from None


def _service_trouble(error: Exception) -> bool:
    from clients.http import PlannerUnavailable, UnexpectedResponse

    return isinstance(error, PlannerUnavailable | UnexpectedResponse)


def _fields(error: object) -> str:
    """The fields the service named, as ``; path: message`` parts."""
    named = getattr(error, "errors", None) or []
    return "".join(
        f"; {item.get('path')}: {item.get('message')}" for item in named if isinstance(item, dict)
    )


def _server_url(server: str | None) -> str:
    from planner_service.plan.errors import FieldProblem, InputError

    accepted = "an http:// or https:// URL, e.g. http://planner:8000"
    if server is None:
        missing = (
            f"is required: pass --server URL or set ${SERVER_ENV} to the planner service's "
            "http:// or https:// URL, e.g. http://planner:8000"
        )
        raise InputError("arguments", [FieldProblem("--server", missing)])
    if not server.startswith(("http://", "https://")) or len(server.split("://", 1)[1]) == 0:
        raise InputError("arguments", [FieldProblem("--server", f"must be {accepted}", server)])
    return server


def _cannot_use_cache(cache_dir: Path | None, error: OSError) -> Exception:
    from planner_service.plan.errors import FieldProblem, InputError

    reason = f"cannot use it as the cache: {error.strerror} ({error.filename})"
    return InputError(str(cache_dir), [FieldProblem("--cache-dir", reason)])


def _retries(text: str) -> int:
    if not text.isascii() or not text.isdigit() or int(text) > 20:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to 20, not {text!r}")
    return int(text)
