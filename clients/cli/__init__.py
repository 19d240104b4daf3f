"""The ``shardplan`` command line.

Each command parses its arguments, calls one library function and renders the result; each
lives in its own module here. Exit codes: 0 success, 1 the plan is invalid, 2 bad input
(usage, unreadable or invalid files, output paths that cannot be written, checked before
solving, or a command whose extra is not installed), 3 no plan exists (a table fits
nowhere, or the solver proves it; for ``check``: the model does not fit), 130 interrupted
(Ctrl-C, at once, even mid-solve). Bad input never shows a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from clients.cli import check, options, plan, schema, serve, validate
from clients.cli.exits import EXIT_BAD_INPUT, EXIT_OK
from clients.cli.extras import MissingExtraError
from clients.cli.interrupt import exit_on_ctrl_c
from planner_service import __version__
from planner_service.plan.errors import InputError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.command
    try:
        if command is serve.run:  # uvicorn shuts down gracefully on Ctrl-C itself
            return command(args)
        return exit_on_ctrl_c(lambda: command(args))
    except InputError as error:
        print(error.render(), file=sys.stderr)
        return EXIT_BAD_INPUT
    except MissingExtraError as error:
        print(error, file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # e.g. `shardplan schema | head`
        return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    assert __doc__ is not None
    parser = argparse.ArgumentParser(prog="shardplan", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"shardplan {__version__}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    for command in (validate, plan, check, options, schema, serve):
        command.add_parser(sub)
    return parser
