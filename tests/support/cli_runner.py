"""Running the ``shardplan`` command in the test process: ``main(argv)`` with its standard
streams and environment swapped for the call, returning what a subprocess would
(``returncode``, ``stdout``, ``stderr`` as text).

A subprocess costs 0.2 to 0.7 s of interpreter start and imports per call; the suite makes
hundreds of calls whose subject is what the command prints and returns, not how a process
starts. Tests whose subject *is* the process (start-up imports, Ctrl-C, ``serve``, the
console script itself) use ``run_cli_process`` instead.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping


@contextlib.contextmanager
def _environment(changes: Mapping[str, str] | None) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(changes or {})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class _Streams:
    """Text streams with a ``buffer``, as the real ones have (``fetch`` writes bytes)."""

    def __init__(self, stdin: str | bytes | None) -> None:
        data = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
        self.stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
        self._out, self._err = io.BytesIO(), io.BytesIO()
        self.stdout = io.TextIOWrapper(self._out, encoding="utf-8", write_through=True)
        self.stderr = io.TextIOWrapper(self._err, encoding="utf-8", write_through=True)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        saved = sys.stdin, sys.stdout, sys.stderr
        sys.stdin, sys.stdout, sys.stderr = self.stdin, self.stdout, self.stderr
        try:
            yield
        finally:
            self.stdout.flush()
            self.stderr.flush()
            sys.stdin, sys.stdout, sys.stderr = saved

    def text(self) -> tuple[str, str]:
        return self._out.getvalue().decode(), self._err.getvalue().decode()


def _exit_code(exit: SystemExit, streams: _Streams) -> int:
    """What the interpreter would exit with for this ``SystemExit`` (argparse's usage
    errors are 2, ``--help`` and ``--version`` 0; a message exits 1 after printing it)."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    print(exit.code, file=streams.stderr)
    return 1


def run_in_process(
    *args: object,
    stdin: str | bytes | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """``shardplan ARGS`` run by calling ``clients.cli.main``: any exception other than
    ``SystemExit`` propagates, so a traceback a user would see fails the test. ``timeout``
    is accepted for call sites shared with ``run_process``; pytest-timeout bounds the call."""
    del timeout
    from clients.cli import main

    argv = [str(arg) for arg in args]
    streams = _Streams(stdin)
    with _environment(env), streams.installed():
        try:
            code = main(argv)
        except SystemExit as exit:
            code = _exit_code(exit, streams)
    out, err = streams.text()
    return subprocess.CompletedProcess(["shardplan", *argv], code, out, err)


def run_process(
    exe: object,
    *args: object,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``shardplan ARGS`` as a real process of the installed console script."""
    return subprocess.run(
        [str(exe), *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )
