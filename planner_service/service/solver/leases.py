"""The heartbeat of the jobs a service process runs: a thread of its own renews their leases
in the store every ``job_lease_s / 3`` while this process holds any, so that another
replica never resumes a job that is still being solved here.

A thread, not a task on the event loop: a loop that stalls (a 200,000-shard request was
once decoded on it, for 9 s) would otherwise let the lease lapse under a live solve, and
a second replica solved the same job again (issue 36). The thread is not fooled into
keeping a dead job alive: it renews only while the event loop has shown itself alive
(``beat``) within ``stall_limit_s``, the longest a job may legitimately run (the largest
time limit and the watchdog's grace). A process whose loop is stuck for longer than that
lets its leases lapse, and its jobs are resumed elsewhere.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from planner_service.service.store import StoreUnavailableError

log = logging.getLogger("shardplan.api")


class LeaseKeeper:
    """Calls ``renew`` every ``interval_s`` from its own thread while jobs are held and the
    event loop beat within ``stall_limit_s``. ``renew``'s failures are logged: a store that
    is down lets the leases lapse, as it should. ``hold``/``drop`` and ``beat`` are called
    on the event loop's thread; the thread only reads what they set."""

    def __init__(
        self, renew: Callable[[], None], *, interval_s: float, stall_limit_s: float
    ) -> None:
        self._renew = renew
        self.interval_s = interval_s
        self.stall_limit_s = stall_limit_s
        self._held = 0
        self._last_beat = time.monotonic()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.renewals = 0  # leases renewed (all of this process's at once), for tests

    def start(self) -> None:
        self._stopped.clear()
        self._thread = threading.Thread(target=self._run, name="shardplan-leases", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing; returns once the thread has ended (within one renewal)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def hold(self) -> None:
        """A job started here: renew until it is dropped."""
        self._held += 1

    def drop(self) -> None:
        self._held -= 1

    def beat(self) -> None:
        """Called from the event loop: it is alive, so the jobs it runs are."""
        self._last_beat = time.monotonic()

    def due(self) -> bool:
        """Whether leases should be renewed now."""
        loop_alive = time.monotonic() - self._last_beat < self.stall_limit_s
        return self._held > 0 and loop_alive

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            if not self.due():
                continue
            try:
                self._renew()
                self.renewals += 1
            except StoreUnavailableError as error:  # the leases lapse, as they must
                log.warning("jobs: renewing this process's leases failed: %s", error)
            except Exception:  # a bug: logged, and the heartbeat goes on
                log.exception("jobs: renewing this process's leases raised")
