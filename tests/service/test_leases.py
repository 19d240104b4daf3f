"""The lease keeper (``service/solver/leases.py``) against a real store: it renews the
leases of the jobs a process holds from its own thread, however busy the event loop is,
and stops once the loop has not shown itself alive for longer than a job may run."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from planner_service.service.solver.leases import LeaseKeeper
from planner_service.service.store import NewSolve, open_store

pytestmark = pytest.mark.alone  # a lease renewed or let lapse on time

JOB = "j" * 64


def stamp() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


@pytest.fixture
def store(tmp_path):
    opened = open_store(str(tmp_path / "jobs.db"))
    opened.jobs.claim(
        JOB,
        owner="a",
        now=stamp(),
        stale_before="2025",
        max_attempts=3,
        new=NewSolve(JOB, "r" * 64, "v1", b"{}", 5.0),
    )
    yield opened
    opened.close()


def heartbeat(store) -> str:
    row = store.jobs.get(JOB)
    assert row is not None
    return row.heartbeat_at


def keeper_for(store, stall_limit_s: float) -> LeaseKeeper:
    return LeaseKeeper(
        lambda: store.jobs.renew("a", stamp()), interval_s=0.05, stall_limit_s=stall_limit_s
    )


def wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.02)


def test_a_held_job_is_renewed_from_the_keepers_thread_without_the_loop(store):
    keeper = keeper_for(store, stall_limit_s=60)
    keeper.start()
    try:
        first = heartbeat(store)
        time.sleep(0.3)
        assert heartbeat(store) == first  # nothing held: nothing renewed
        keeper.hold()
        # No beat from any event loop in this test: the thread renews on its own.
        wait_until(lambda: heartbeat(store) > first)
        renewed = heartbeat(store)
        wait_until(lambda: heartbeat(store) > renewed)
        keeper.drop()
        count = keeper.renewals
        time.sleep(0.3)
        assert keeper.renewals == count
    finally:
        keeper.stop()


def test_a_loop_silent_past_the_stall_limit_lets_the_leases_lapse(store):
    keeper = keeper_for(store, stall_limit_s=0.4)
    keeper.hold()
    keeper.beat()
    keeper.start()
    try:
        wait_until(lambda: keeper.renewals >= 2)
        time.sleep(0.5)  # no beat: the loop is stuck longer than any job may run
        assert not keeper.due()
        last = heartbeat(store)
        time.sleep(0.3)
        assert heartbeat(store) == last
        keeper.beat()  # alive again
        wait_until(lambda: heartbeat(store) > last)
    finally:
        keeper.stop()
