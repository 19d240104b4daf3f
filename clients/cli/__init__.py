"""The ``shardplan`` command line: plan how a model's embedding tables are sharded across
ranks, check plans, and get them to training jobs.

Exit codes: 0 success; 1 the plan is invalid (``validate``; ``measure``, which then runs
nothing) or the plans differ (``diff``); 2 bad input (usage, unreadable or invalid files,
output paths that cannot be written, checked before solving, a command whose extra is not
installed, or for ``measure`` a plan whose world size this machine cannot run, said
before any rank starts, or for ``serve`` an address it cannot listen on; with
``--server``: what the service refused as input, an unknown plan id, prefix or alias, a
prefix more than one plan starts with, a missing or refused token); 3 no plan exists (a
table fits nowhere, or the solver proves it; for ``check``: the model does not fit, or a
gate fails); 4 the service
(``--server``) could not be reached, was overloaded after the retries, or failed (5xx),
or for ``measure`` a rank raised, died or passed its deadline; 5 a plan or device profile
from the service failed its integrity check (its content does not hash to its id: nothing
is written); 130 interrupted (Ctrl-C, at once, even mid-solve). Bad input never shows a
traceback.

Environment: ``SHARDPLAN_SERVER`` is the planner service wherever ``--server`` is
accepted and not given; ``SHARDPLAN_TOKEN`` its token (``--token``).

Each command parses its arguments, calls one library function and renders the result; each
lives in its own module here. ``--help`` shows this docstring's first three paragraphs,
and each command's help its module's docstring (``helptext``).

Start-up: the parser is built from every command module, for ``--version`` and ``--help``
too, so a command module imports only the standard library and ``clients.cli``'s light
modules (exits, extras, helptext, output, remote) at its top; what the command runs with
(pydantic, the cost model, OR-Tools, the service) it imports inside ``run``. ``shardplan
--version`` then loads no third-party library at all, and ``diff``, ``migrate``,
``validate`` and ``fetch`` only what they use (docs/benchmarks.md, "Start-up";
tests/project/test_imports.py checks).
"""

from __future__ import annotations

# First: the command's clock starts before anything heavier is imported (``clock.py``).
import clients.cli.clock  # isort: skip

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence

from clients.cli import (
    calibrate,
    check,
    diff,
    fetch,
    measure,
    migrate,
    options,
    plan,
    profile,
    request,
    schema,
    serve,
    validate,
)
from clients.cli.exits import EXIT_BAD_INPUT, EXIT_OK, CommandFailed
from clients.cli.extras import MissingExtraError
from clients.cli.helptext import PlainParser
from clients.cli.interrupt import exit_on_ctrl_c
from clients.cli.output import check_output
from planner_service import __version__

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """The command ``argv`` (this process's own command line when None: the console
    script's call, which then may end the process at once, see ``_exit_now``)."""
    own_process = argv is None
    # A call with its own ``argv`` (tests, in-process) starts its clock now.
    started_at = clients.cli.clock.STARTED_AT if own_process else time.monotonic()
    args = _parser().parse_args(argv)
    args.started_at = started_at
    code = _run(args)
    if own_process and getattr(args, "exit_at_once", False):
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    """End the process now that its output is written and flushed, skipping the
    interpreter's teardown: after a solve, freeing its objects and OR-Tools' static
    state took 0.4 to 0.8 s that the user waited for and a time limit would not count
    (docs/cli.md, "Time limits"). Nothing of a command that asks for this needs an
    ``atexit`` handler: logging is shut down here."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BrokenPipeError, ValueError):  # `| head`; a closed stream
            stream.flush()
    os._exit(code)


def _run(args: argparse.Namespace) -> int:
    command: Callable[[argparse.Namespace], int] = args.command
    try:
        check_output(args)
        if command is serve.run:  # uvicorn shuts down gracefully on Ctrl-C itself
            return command(args)
        return exit_on_ctrl_c(lambda: command(args))
    except ValueError as error:
        # Imported here, not at start-up: if an InputError was raised, it is loaded.
        from planner_service.plan.errors import InputError

        if not isinstance(error, InputError):
            raise
        print(error.render(), file=sys.stderr)
        return EXIT_BAD_INPUT
    except MissingExtraError as error:
        print(error, file=sys.stderr)
        return EXIT_BAD_INPUT
    except CommandFailed as error:
        print(error, file=sys.stderr)
        return error.exit_code
    except BrokenPipeError:  # e.g. `shardplan schema | head`
        return EXIT_OK


# In the order of the workflow: make a request, see its options, plan, check the plan and
# the fit, compare and move plans, get one to a job, serve them; then the tools around it.
COMMANDS = (
    request,
    options,
    plan,
    validate,
    check,
    diff,
    migrate,
    fetch,
    serve,
    measure,
    calibrate,
    profile,
    schema,
)


def _parser() -> argparse.ArgumentParser:
    assert __doc__ is not None
    summary, exits, environment = __doc__.split("\n\n")[:3]
    parser = PlainParser(prog="shardplan", description=summary, epilog=f"{exits}\n\n{environment}")
    parser.add_argument("--version", action="version", version=f"shardplan {__version__}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser
