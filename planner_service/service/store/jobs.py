"""The leased job queue behind ``Prefer: respond-async`` solves: one row of ``solves`` per
job id (the request, its status and progress, and the lease of the service process running
it, renewed while it runs), so that a job outlives the process that started it. A job no
process had room for waits in the table with no owner (``enqueue``, bounded) until one with
room takes it. A row still queued or running whose lease has lapsed is taken over
(``SolveJobs.claim``) and solved again; one whose processes keep stopping is given up after
``max_attempts``.

Statuses are ``SolveJobStatus`` here; their values are what the ``status`` column holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from planner_service.plan.api import SolveJobStatus
from planner_service.service.store.database import Cursor, Database, named

QUEUED, RUNNING, DONE, FAILED = (
    SolveJobStatus.QUEUED,
    SolveJobStatus.RUNNING,
    SolveJobStatus.DONE,
    SolveJobStatus.FAILED,
)
# The statuses a process may still be working on: their rows hold a lease.
_ACTIVE = "status IN ({})".format(
    ", ".join(f"'{status.value}'" for status in SolveJobStatus if not status.ended)
)


class StoredSolve(BaseModel):
    """A row of ``solves`` without its request: a job's state as last recorded."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    request_hash: str
    planner_version: str
    time_limit_s: float
    status: SolveJobStatus
    stage: str | None
    objective: float | None
    lower_bound: float | None
    attempts: int
    owner: str | None
    heartbeat_at: str
    created_at: str
    started_at: str | None
    updated_at: str
    plan_id: str | None
    problem: bytes | None

    @property
    def active(self) -> bool:
        return not self.status.ended

    @property
    def waiting(self) -> bool:
        """Queued with no process to run it yet: it waits for one with room."""
        return self.status is QUEUED and self.owner is None


_COLUMNS = ", ".join(StoredSolve.model_fields)
# Jobs accepted with no process to run them yet: the durable queue that ``enqueue`` bounds.
_WAITING = f"status = '{QUEUED.value}' AND owner IS NULL"
_QUEUE_LOCK = "solves:queue"  # the key_lock of admissions (no alias name holds a colon)


class JobQueueFullError(RuntimeError):
    """``max_waiting`` jobs wait already: ``waiting`` of them, ``time_limits_s`` in all."""

    def __init__(self, waiting: int, time_limits_s: float) -> None:
        super().__init__(f"{waiting} job(s) wait for a solver process")
        self.waiting = waiting
        self.time_limits_s = time_limits_s


@dataclass(frozen=True)
class NewSolve:
    """What a job is made of when it is first asked for."""

    job_id: str
    request_hash: str
    planner_version: str
    request: bytes
    time_limit_s: float


class SolveJobs:
    """The ``solves`` table's operations: the queue, its leases, and each job's record."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def get(self, job_id: str) -> StoredSolve | None:
        with self.database.transaction() as cursor:
            return self._select(cursor, job_id)

    def request(self, job_id: str) -> bytes | None:
        with self.database.transaction() as cursor:
            cursor.execute(
                self.database.sql("SELECT request FROM solves WHERE job_id = ?"), (job_id,)
            )
            row = cursor.fetchone()
        return None if row is None else bytes(row[0])

    def claim(
        self,
        job_id: str,
        *,
        owner: str,
        now: str,
        stale_before: str,
        max_attempts: int,
        new: NewSolve | None = None,
    ) -> tuple[StoredSolve | None, bool]:
        """Take job ``job_id`` for ``owner`` to solve, and say whether it was taken: a new
        job (``new``, inserted), one waiting in the queue (``enqueue``), one queued or
        running whose lease lapsed (heartbeat before ``stale_before``: its process is
        gone), or one that failed (asked for again). Not taken: done, no plan, or running
        with a live lease. A lapsed job that already had ``max_attempts`` fails instead
        (``gave up`` problem). The row as it stands after this, None when there is no
        such job."""
        with self.database.transaction(write=True) as cursor:
            inserted = new is not None and self._insert(cursor, new, owner=owner, now=now)
            stored = self._select(cursor, job_id, lock=True)
            if stored is None or inserted:
                return stored, inserted
            lapsed = stored.active and stored.heartbeat_at < stale_before
            if stored.waiting or stored.status is FAILED:
                self._requeue(cursor, stored, owner=owner, now=now, lapsed=stored.waiting)
            elif lapsed and stored.attempts >= max_attempts:
                self._end(cursor, job_id, FAILED, None, _gave_up(stored), now)
            elif lapsed:
                self._requeue(cursor, stored, owner=owner, now=now, lapsed=True)
            else:
                return stored, False
            after = self._select(cursor, job_id)
        assert after is not None
        return after, after.status is QUEUED

    def add_done(self, new: NewSolve, plan_id: str, now: str) -> StoredSolve:
        """A job for a request whose plan is stored already: done at once (a job that
        exists keeps its row, and is marked done)."""
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                self.database.sql(
                    "INSERT INTO solves (job_id, request_hash, planner_version, request, "
                    "time_limit_s, status, attempts, heartbeat_at, created_at, updated_at, "
                    "plan_id) VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?) "
                    "ON CONFLICT (job_id) DO UPDATE SET status = excluded.status, "
                    "plan_id = excluded.plan_id, problem = NULL, "
                    "updated_at = excluded.updated_at WHERE solves.status <> excluded.status"
                ),
                (new.job_id, new.request_hash, new.planner_version, new.request,
                 new.time_limit_s, DONE.value, now, now, now, plan_id),
            )  # fmt: skip
            done = self._select(cursor, new.job_id)
        assert done is not None
        return done

    def enqueue(self, new: NewSolve, *, now: str, max_waiting: int) -> StoredSolve:
        """A job no process has room to start now: its row as it stands, inserted (or a
        failed one queued again) to wait without an owner, in order of arrival, until a
        process with room takes it (``claim``). ``JobQueueFullError`` rather than a
        ``max_waiting``-th waiting job, counted across every process sharing the store
        (admissions take one lock, so the count is exact)."""
        with self.database.transaction(write=True) as cursor:
            if self.database.dialect.key_lock is not None:
                cursor.execute(self.database.dialect.key_lock, (_QUEUE_LOCK,))
            stored = self._select(cursor, new.job_id, lock=True)
            if stored is not None and stored.status is not FAILED:
                return stored
            self._check_room(cursor, max_waiting)
            if stored is None:
                self._insert(cursor, new, owner=None, now=now)
            else:
                self._requeue(cursor, stored, owner=None, now=now, lapsed=False)
            after = self._select(cursor, new.job_id)
        assert after is not None
        return after

    def _check_room(self, cursor: Cursor, max_waiting: int) -> None:
        cursor.execute(
            self.database.sql(
                f"SELECT COUNT(*), COALESCE(SUM(time_limit_s), 0) FROM solves WHERE {_WAITING}"
            )
        )
        waiting, time_limits_s = cursor.fetchone()
        if int(waiting) >= max_waiting:
            raise JobQueueFullError(int(waiting), float(time_limits_s))

    def to_take(self, stale_before: str, limit: int) -> list[str]:
        """Ids of up to ``limit`` jobs a process with room should take: waiting ones, and
        ones queued or running whose lease lapsed; oldest first."""
        with self.database.transaction() as cursor:
            cursor.execute(
                self.database.sql(
                    f"SELECT job_id FROM solves WHERE {_ACTIVE} "
                    "AND (owner IS NULL OR heartbeat_at < ?) "
                    "ORDER BY heartbeat_at, job_id LIMIT ?"
                ),
                (stale_before, limit),
            )
            return [str(row[0]) for row in cursor.fetchall()]

    def record_progress(
        self,
        job_id: str,
        owner: str,
        *,
        running: bool,
        stage: str | None,
        objective: float | None,
        bound: float | None,
        started_at: str | None,
        now: str,
    ) -> bool:
        """Record how far ``owner``'s solve of the job got, renewing its lease; False when
        the job is no longer ``owner``'s to run (taken over, or ended)."""
        status = RUNNING if running else QUEUED
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                self.database.sql(
                    "UPDATE solves SET status = ?, stage = ?, objective = ?, lower_bound = ?, "
                    "started_at = COALESCE(started_at, ?), heartbeat_at = ?, updated_at = ? "
                    f"WHERE job_id = ? AND owner = ? AND {_ACTIVE}"
                ),
                (status.value, stage, objective, bound, started_at, now, now, job_id, owner),
            )
            return bool(cursor.rowcount == 1)

    def end(
        self,
        job_id: str,
        status: SolveJobStatus,
        *,
        plan_id: str | None,
        problem: bytes | None,
        progress: tuple[str | None, float | None, float | None] = (None, None, None),
        now: str,
    ) -> None:
        """The job ended: ``done`` with its plan, or ``no_plan`` / ``failed`` with the
        problem document that says why; ``progress`` (stage, objective, lower bound) as it
        ended, where known."""
        with self.database.transaction(write=True) as cursor:
            self._end(cursor, job_id, status, plan_id, problem, now)
            cursor.execute(
                self.database.sql(
                    "UPDATE solves SET stage = COALESCE(?, stage), "
                    "objective = COALESCE(?, objective), "
                    "lower_bound = COALESCE(?, lower_bound) WHERE job_id = ?"
                ),
                (*progress, job_id),
            )

    def renew(self, owner: str, now: str) -> None:
        """Renew the lease of every job ``owner`` is solving."""
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                self.database.sql(
                    f"UPDATE solves SET heartbeat_at = ? WHERE owner = ? AND {_ACTIVE}"
                ),
                (now, owner),
            )

    def release(self, owner: str) -> None:
        """Give up ``owner``'s jobs (it is stopping): their leases lapse now, so another
        process takes them over at once rather than when they would have lapsed."""
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                self.database.sql(
                    f"UPDATE solves SET heartbeat_at = '' WHERE owner = ? AND {_ACTIVE}"
                ),
                (owner,),
            )

    def _select(self, cursor: Cursor, job_id: str, *, lock: bool = False) -> StoredSolve | None:
        """The job's row, read by column name; ``lock``: held until the transaction ends."""
        for_update = self.database.dialect.for_update if lock else ""
        cursor.execute(
            self.database.sql(f"SELECT {_COLUMNS} FROM solves WHERE job_id = ?{for_update}"),
            (job_id,),
        )
        row = cursor.fetchone()
        return None if row is None else StoredSolve(**named(cursor, row))

    def _insert(self, cursor: Cursor, new: NewSolve, *, owner: str | None, now: str) -> bool:
        """Queue a new job for ``owner`` (its first attempt), or to wait for one (None: no
        attempt yet); False when its row exists already."""
        cursor.execute(
            self.database.sql(
                "INSERT INTO solves (job_id, request_hash, planner_version, request, "
                "time_limit_s, status, attempts, owner, heartbeat_at, created_at, "
                "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (job_id) DO NOTHING"
            ),
            (new.job_id, new.request_hash, new.planner_version, new.request,
             new.time_limit_s, QUEUED.value, 0 if owner is None else 1, owner, now, now, now),
        )  # fmt: skip
        return bool(cursor.rowcount == 1)

    def _requeue(
        self, cursor: Cursor, stored: StoredSolve, *, owner: str | None, now: str, lapsed: bool
    ) -> None:
        """Queue the job again for ``owner`` (None: to wait for one), its progress cleared:
        one more attempt when its lease lapsed or it waited, the first of a new run when it
        had failed (none yet when it is to wait)."""
        cursor.execute(
            self.database.sql(
                "UPDATE solves SET status = ?, stage = NULL, objective = NULL, "
                "lower_bound = NULL, attempts = ?, owner = ?, heartbeat_at = ?, "
                "started_at = NULL, updated_at = ?, problem = NULL WHERE job_id = ?"
            ),
            (
                QUEUED.value,
                _attempts(stored, owner=owner, lapsed=lapsed),
                owner,
                now,
                now,
                stored.job_id,
            ),
        )

    def _end(
        self,
        cursor: Cursor,
        job_id: str,
        status: SolveJobStatus,
        plan_id: str | None,
        problem: bytes | None,
        now: str,
    ) -> None:
        cursor.execute(
            self.database.sql(
                "UPDATE solves SET status = ?, plan_id = ?, problem = ?, updated_at = ? "
                "WHERE job_id = ?"
            ),
            (status.value, plan_id, problem, now, job_id),
        )


def _attempts(stored: StoredSolve, *, owner: str | None, lapsed: bool) -> int:
    """A requeued job's starts: none yet when it is to wait, one more after a lapse or a
    wait, the first of a new run after a failure."""
    if owner is None:
        return 0
    return stored.attempts + 1 if lapsed else 1


def _gave_up(stored: StoredSolve) -> bytes:
    detail = (
        f"this job was started {stored.attempts} times and each time the service process "
        "solving it stopped before it ended (restarts, or a crash the request causes); "
        "it is not resumed again. POST the request again to retry"
    )
    return json.dumps(
        {"type": "about:blank", "title": "Solve abandoned", "status": 503, "detail": detail}
    ).encode()
