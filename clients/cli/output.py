"""Where a command's document goes: ``-o/--output FILE``, shared by every command that
prints one (a plan, a report, a schema, a profile). Without it the document is printed on
standard output; with it, it is written to FILE instead, whole or not at all (a temporary
file in FILE's folder renamed over it, so a reader never sees half of it), and standard
output stays empty. Progress and summary lines go to stderr either way, and the exit code
is the same.

``main`` checks that FILE can be written before the command runs (``check_output``), so
a long solve never ends in a path it cannot write. Imports only the standard library at
its top: every command module imports it on start-up.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

OPTION = "--output"


def add_output_argument(parser: argparse.ArgumentParser, document: str) -> None:
    """``-o/--output FILE``; ``document`` names what the command prints ("the plan")."""
    parser.add_argument(
        "-o",
        OPTION,
        type=Path,
        metavar="FILE",
        help=f"write {document} to FILE instead of standard output (whole or not at all)",
    )


def check_output(args: argparse.Namespace) -> None:
    """Fail now, as writing would fail later, if the command has an ``--output`` that
    cannot be written (an InputError naming the path: exit 2)."""
    output: Path | None = getattr(args, "output", None)
    if output is not None:
        from clients.cli.files import check_writable

        check_writable(output, OPTION)


def emit(document: str | bytes, output: Path | None) -> None:
    """``document`` on standard output, or in ``output`` instead (``--output``)."""
    if output is not None:
        from clients.cli.files import write_atomically

        data = document.encode() if isinstance(document, str) else document
        write_atomically(output, OPTION, data)
        return
    if isinstance(document, str):
        sys.stdout.write(document)
    else:
        sys.stdout.flush()  # text written before goes first
        sys.stdout.buffer.write(document)
    sys.stdout.flush()


def emit_canonical(document: bytes, output: Path | None) -> None:
    """A verified document's canonical bytes (a fetched plan or profile): a file holds
    exactly the bytes its content address hashes; a terminal gets a newline after them."""
    emit(document if output is not None else document + b"\n", output)
