"""Ctrl-C that ends ``shardplan`` at once, even in the middle of a solve."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

from clients.cli.exits import EXIT_INTERRUPTED


def exit_on_ctrl_c(work: Callable[[], int]) -> int:
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
