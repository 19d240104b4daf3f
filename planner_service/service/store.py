"""The plan store: one interface, two real implementations sharing their SQL.

- ``SqliteStore`` (default): one file under ``./var/``, WAL journal, ``synchronous=FULL``,
  so a committed plan survives a killed process and a power cut; zero set-up.
- ``PostgresStore`` (production): ``SHARDPLAN_DATABASE_URL=postgresql://…``, psycopg 3 with
  a connection pool; several service replicas can share one database.

Plans are immutable: inserted once by ``plan_id`` (their content address) with the request
and a summary (world size, tables, objective, status: what a list shows) beside them, never
updated or deleted. ``put_plan`` returns only after the commit, so a plan the API reports
as stored is durable. Aliases are the one mutable thing; every change is appended to
``alias_history`` in the same transaction as the alias itself.

Solves asked for with ``Prefer: respond-async`` are rows of ``solves`` (one per job id:
the request, its status and progress, and the lease of the service process running it,
renewed while it runs), so that a job outlives the process that started it: a row still
queued or running whose lease has lapsed is taken over (``claim_solve``) and solved again.

Lists are pages in a fixed order with a keyset cursor (the last row's sort key), so a page
costs the same however deep it is and rows stored meanwhile neither repeat nor shift it.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import zstandard

from planner_service.plan.api import PlanListing, PlanSummary

# One schema for both databases: TEXT timestamps (ISO 8601, UTC) and binary plan bytes.
# ``BLOB`` is spelled per database (``BYTEA`` on PostgreSQL).
_SCHEMA = """
CREATE TABLE IF NOT EXISTS plans (
    plan_id TEXT PRIMARY KEY,
    request_hash TEXT NOT NULL,
    planner_version TEXT NOT NULL,
    request BLOB NOT NULL,
    plan BLOB NOT NULL,
    created_at TEXT NOT NULL,
    world_size INTEGER,
    num_tables INTEGER,
    objective DOUBLE PRECISION,
    status TEXT,
    plan_gzip BLOB,
    plan_zstd BLOB
);
CREATE INDEX IF NOT EXISTS plans_by_request ON plans (request_hash, planner_version);
CREATE INDEX IF NOT EXISTS plans_by_creation ON plans (created_at, plan_id);
CREATE TABLE IF NOT EXISTS aliases (
    name TEXT PRIMARY KEY,
    plan_id TEXT NOT NULL REFERENCES plans (plan_id),
    version INTEGER NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS alias_history (
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    plan_id TEXT NOT NULL REFERENCES plans (plan_id),
    previous_plan_id TEXT,
    actor TEXT NOT NULL,
    comment TEXT,
    changed_at TEXT NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE TABLE IF NOT EXISTS solves (
    job_id TEXT PRIMARY KEY,
    request_hash TEXT NOT NULL,
    planner_version TEXT NOT NULL,
    request BLOB NOT NULL,
    time_limit_s DOUBLE PRECISION NOT NULL,
    status TEXT NOT NULL,
    stage TEXT,
    objective DOUBLE PRECISION,
    lower_bound DOUBLE PRECISION,
    attempts INTEGER NOT NULL,
    owner TEXT,
    heartbeat_at TEXT NOT NULL,
    created_at TEXT NOT NULL,
    started_at TEXT,
    updated_at TEXT NOT NULL,
    plan_id TEXT,
    problem BLOB
);
CREATE INDEX IF NOT EXISTS solves_by_heartbeat ON solves (status, heartbeat_at);
"""
# Added after the first release: stores made before gain them (NULL), then are backfilled.
_SUMMARY_COLUMNS = {
    "world_size": "INTEGER",
    "num_tables": "INTEGER",
    "objective": "DOUBLE PRECISION",
    "status": "TEXT",
}
_BACKFILL_BATCH = 100
# Columns added after the first release, each NULL in rows stored before it: ``plan_gzip``
# and ``plan_zstd`` are filled the first time such a plan is fetched (``plan_bodies``).
_LATER_COLUMNS = {"plan_gzip": "BLOB", "plan_zstd": "BLOB"}
GZIP_LEVEL = 6
ZSTD_LEVEL = 3


def gzip_plan(data: bytes) -> bytes:
    """The plan's gzip encoding, the same bytes every time for the same plan on the same
    zlib: level 6, mtime 0 (RFC 1952 "no time stamp"), no file name."""
    return gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)


def zstd_plan(data: bytes) -> bytes:
    """The plan's zstd encoding (RFC 8878), the same bytes every time for the same plan on
    the same zstd: level 3, one frame with the content size and a checksum of the content
    (so a damaged body fails to decode)."""
    compressor = zstandard.ZstdCompressor(
        level=ZSTD_LEVEL, write_content_size=True, write_checksum=True
    )
    return compressor.compress(data)


@dataclass(frozen=True)
class PlanBodies:
    """A stored plan's representations: its identity bytes and their gzip and zstd
    encodings."""

    identity: bytes
    gzip: bytes
    zstd: bytes

    @classmethod
    def of(cls, data: bytes) -> PlanBodies:
        return cls(data, gzip_plan(data), zstd_plan(data))

    @property
    def size(self) -> int:
        return len(self.identity) + len(self.gzip) + len(self.zstd)


@dataclass(frozen=True)
class StoredPlan:
    plan_id: str
    plan: bytes
    request: bytes
    created_at: str


@dataclass(frozen=True)
class AliasChange:
    """One change of an alias: who pointed it where, when, and where it pointed before."""

    name: str
    version: int
    plan_id: str
    previous_plan_id: str | None
    actor: str
    comment: str | None
    changed_at: str


ACTIVE_SOLVES = ("queued", "running")
SOLVE_COLUMNS = (
    "job_id, request_hash, planner_version, time_limit_s, status, stage, objective, "
    "lower_bound, attempts, owner, heartbeat_at, created_at, started_at, updated_at, "
    "plan_id, problem"
)


@dataclass(frozen=True)
class StoredSolve:
    """A row of ``solves`` without its request: a job's state as last recorded."""

    job_id: str
    request_hash: str
    planner_version: str
    time_limit_s: float
    status: str  # queued, running (ACTIVE_SOLVES), done, no_plan, failed
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
        return self.status in ACTIVE_SOLVES


@dataclass(frozen=True)
class NewSolve:
    """What a job is made of when it is first asked for."""

    job_id: str
    request_hash: str
    planner_version: str
    request: bytes
    time_limit_s: float


def _solve_row(row: Sequence[Any]) -> StoredSolve:
    problem = None if row[15] is None else bytes(row[15])
    return StoredSolve(
        row[0], row[1], row[2], float(row[3]), row[4], row[5], row[6], row[7], int(row[8]),
        row[9], row[10], row[11], row[12], row[13], row[14], problem,
    )  # fmt: skip


class UnknownPlanError(LookupError):
    """An alias was pointed at a plan the store does not hold."""


class StoreUnavailableError(RuntimeError):
    """The database cannot be reached or refused the operation."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class PlanStore(ABC):
    """Plans by content address, the request each was planned from, and aliases."""

    placeholder = "?"
    blob_type = "BLOB"
    columns_query = "SELECT name FROM pragma_table_info('plans')"
    bytewise = ""  # the collation that orders text by its bytes (SQLite's default)

    # --------------------------------------------------------------- database specifics

    @abstractmethod
    def _transaction(self, *, write: bool = False) -> AbstractContextManager[Any]:
        """A cursor inside one transaction, committed on normal exit, rolled back on error;
        ``write`` transactions take the write lock up front where the database has one."""

    @abstractmethod
    def close(self) -> None: ...

    def _sql(self, text: str) -> str:
        return text.replace("?", self.placeholder)

    def _create_schema(self, cursor: Any) -> None:
        for statement in _SCHEMA.replace("BLOB", self.blob_type).split(";"):
            if statement.strip():
                cursor.execute(statement)
        self._add_summaries(cursor)

    def _add_summaries(self, cursor: Any) -> None:
        """Give a store made before plan summaries existed its summary columns, and fill
        them from the stored plans, a batch at a time (once: new plans come with one)."""
        cursor.execute(self.columns_query)
        present = {str(row[0]) for row in cursor.fetchall()}
        for name, column_type in (_SUMMARY_COLUMNS | _LATER_COLUMNS).items():
            if name not in present:
                column_type = column_type.replace("BLOB", self.blob_type)
                cursor.execute(f"ALTER TABLE plans ADD COLUMN {name} {column_type}")
        select = self._sql("SELECT plan_id, plan FROM plans WHERE world_size IS NULL LIMIT ?")
        while True:
            cursor.execute(select, (_BACKFILL_BATCH,))
            rows = cursor.fetchall()
            if not rows:
                return
            for plan_id, data in rows:
                summary = PlanSummary.of_stored(bytes(data))
                cursor.execute(
                    self._sql(
                        "UPDATE plans SET world_size = ?, num_tables = ?, objective = ?, "
                        "status = ? WHERE plan_id = ?"
                    ),
                    (*_summary_values(summary), plan_id),
                )

    # --------------------------------------------------------------- operations

    def ping(self) -> None:
        """Raise StoreUnavailableError unless the database answers a query."""
        with self._transaction() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()

    def put_plan(
        self,
        *,
        plan_id: str,
        request_hash: str,
        planner_version: str,
        request: bytes,
        plan: bytes,
        summary: PlanSummary,
        bodies: PlanBodies | None = None,
    ) -> bool:
        """Insert a plan once, with its encodings (``bodies``, made here unless given);
        True when this call stored it, False when it already was. ``plan_for_request``
        finds it by ``request_hash`` and ``planner_version``. Returns after the commit."""
        encoded = PlanBodies.of(plan) if bodies is None else bodies
        assert encoded.identity == plan
        with self._transaction(write=True) as cursor:
            cursor.execute(
                self._sql(
                    "INSERT INTO plans (plan_id, request_hash, planner_version, request, plan, "
                    "created_at, world_size, num_tables, objective, status, plan_gzip, "
                    "plan_zstd) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (plan_id) DO NOTHING"
                ),
                (
                    plan_id,
                    request_hash,
                    planner_version,
                    request,
                    plan,
                    _now(),
                    *_summary_values(summary),
                    encoded.gzip,
                    encoded.zstd,
                ),
            )
            return bool(cursor.rowcount == 1)

    def list_plans(self, *, limit: int, before: Sequence[str] | None = None) -> list[PlanListing]:
        """Up to ``limit`` plans, newest first (by ``created_at``, then ``plan_id``), only
        those after ``before`` in that order (a ``(created_at, plan_id)`` already listed)."""
        where = ""
        arguments: tuple[str, ...] = ()
        if before is not None:
            where = "WHERE created_at < ? OR (created_at = ? AND plan_id < ?) "
            arguments = (before[0], before[0], before[1])
        with self._transaction() as cursor:
            cursor.execute(
                self._sql(
                    "SELECT plan_id, planner_version, created_at, world_size, num_tables, "
                    f"objective, status FROM plans {where}"
                    "ORDER BY created_at DESC, plan_id DESC LIMIT ?"
                ),
                (*arguments, limit),
            )
            rows: Sequence[Sequence[Any]] = cursor.fetchall()
        return [
            PlanListing(
                plan_id=row[0],
                planner_version=row[1],
                created_at=row[2],
                summary=PlanSummary(
                    world_size=row[3], num_tables=row[4], objective=row[5], status=row[6]
                ),
            )
            for row in rows
        ]

    def get_plan(self, plan_id: str) -> StoredPlan | None:
        with self._transaction() as cursor:
            cursor.execute(
                self._sql("SELECT plan_id, plan, request, created_at FROM plans WHERE plan_id = ?"),
                (plan_id,),
            )
            row = cursor.fetchone()
        if row is None:
            return None
        return StoredPlan(row[0], bytes(row[1]), bytes(row[2]), row[3])

    def plan_bodies(self, plan_id: str) -> PlanBodies | None:
        """A plan's identity, gzip and zstd bytes. A plan stored before an encoding's
        column existed gets that encoding now, stored once for every later fetch (by any
        replica; one that raced this one keeps its own bytes)."""
        with self._transaction() as cursor:
            cursor.execute(
                self._sql("SELECT plan, plan_gzip, plan_zstd FROM plans WHERE plan_id = ?"),
                (plan_id,),
            )
            row = cursor.fetchone()
        if row is None:
            return None
        data = bytes(row[0])
        if row[1] is not None and row[2] is not None:
            return PlanBodies(data, bytes(row[1]), bytes(row[2]))
        with self._transaction(write=True) as cursor:
            cursor.execute(
                self._sql(
                    "UPDATE plans SET plan_gzip = COALESCE(plan_gzip, ?), "
                    "plan_zstd = COALESCE(plan_zstd, ?) WHERE plan_id = ?"
                ),
                (gzip_plan(data) if row[1] is None else None,
                 zstd_plan(data) if row[2] is None else None, plan_id),
            )  # fmt: skip
            cursor.execute(
                self._sql("SELECT plan_gzip, plan_zstd FROM plans WHERE plan_id = ?"),
                (plan_id,),
            )
            gzipped, zstd = cursor.fetchone()
        return PlanBodies(data, bytes(gzipped), bytes(zstd))

    def plan_for_request(self, request_hash: str, planner_version: str) -> str | None:
        """The plan_id already planned for this request by this planner version, if any."""
        with self._transaction() as cursor:
            cursor.execute(
                self._sql(
                    "SELECT plan_id FROM plans WHERE request_hash = ? AND planner_version = ? "
                    "ORDER BY created_at LIMIT 1"
                ),
                (request_hash, planner_version),
            )
            row = cursor.fetchone()
        return None if row is None else str(row[0])

    def set_alias(
        self, name: str, plan_id: str, *, actor: str, comment: str | None = None
    ) -> AliasChange:
        """Point ``name`` at ``plan_id`` and record the change; UnknownPlanError when the
        plan is not stored."""
        with self._transaction(write=True) as cursor:
            self._lock_alias(cursor, name)
            cursor.execute(self._sql("SELECT 1 FROM plans WHERE plan_id = ?"), (plan_id,))
            if cursor.fetchone() is None:
                raise UnknownPlanError(plan_id)
            cursor.execute(
                self._sql("SELECT plan_id, version FROM aliases WHERE name = ?"), (name,)
            )
            row = cursor.fetchone()
            previous, version = (None, 1) if row is None else (str(row[0]), int(row[1]) + 1)
            change = AliasChange(name, version, plan_id, previous, actor, comment, _now())
            cursor.execute(
                self._sql(
                    "INSERT INTO alias_history (name, version, plan_id, previous_plan_id, actor, "
                    "comment, changed_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
                ),
                (name, version, plan_id, previous, actor, comment, change.changed_at),
            )
            cursor.execute(
                self._sql(
                    "INSERT INTO aliases (name, plan_id, version, updated_at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (name) DO UPDATE SET plan_id = excluded.plan_id, "
                    "version = excluded.version, updated_at = excluded.updated_at"
                ),
                (name, plan_id, version, change.changed_at),
            )
        return change

    def _lock_alias(self, cursor: Any, name: str) -> None:
        """Serialise concurrent changes of one alias (SQLite's BEGIN IMMEDIATE already does)."""
        del cursor, name

    # --------------------------------------------------------------- solves (jobs)

    for_update = ""  # row locks inside a write transaction (SQLite's BEGIN IMMEDIATE locks all)

    def get_solve(self, job_id: str) -> StoredSolve | None:
        with self._transaction() as cursor:
            cursor.execute(
                self._sql(f"SELECT {SOLVE_COLUMNS} FROM solves WHERE job_id = ?"), (job_id,)
            )
            row = cursor.fetchone()
        return None if row is None else _solve_row(row)

    def solve_request(self, job_id: str) -> bytes | None:
        with self._transaction() as cursor:
            cursor.execute(self._sql("SELECT request FROM solves WHERE job_id = ?"), (job_id,))
            row = cursor.fetchone()
        return None if row is None else bytes(row[0])

    def claim_solve(
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
        job (``new``, inserted), one queued or running whose lease lapsed (heartbeat
        before ``stale_before``: its process is gone), or one that failed (asked for
        again). Not taken: done, no plan, or running with a live lease. A lapsed job that
        already had ``max_attempts`` fails instead (``gave up`` problem). The row as it
        stands after this, None when there is no such job."""
        with self._transaction(write=True) as cursor:
            if new is not None:
                cursor.execute(
                    self._sql(
                        "INSERT INTO solves (job_id, request_hash, planner_version, request, "
                        "time_limit_s, status, attempts, owner, heartbeat_at, created_at, "
                        "updated_at) VALUES (?, ?, ?, ?, ?, 'queued', 1, ?, ?, ?, ?) "
                        "ON CONFLICT (job_id) DO NOTHING"
                    ),
                    (new.job_id, new.request_hash, new.planner_version, new.request,
                     new.time_limit_s, owner, now, now, now),
                )  # fmt: skip
                inserted = cursor.rowcount == 1
            else:
                inserted = False
            cursor.execute(
                self._sql(f"SELECT {SOLVE_COLUMNS} FROM solves WHERE job_id = ?{self.for_update}"),
                (job_id,),
            )
            row = cursor.fetchone()
            if row is None or inserted:
                return (None if row is None else _solve_row(row)), inserted
            stored = _solve_row(row)
            lapsed = stored.active and stored.heartbeat_at < stale_before
            if lapsed and stored.attempts >= max_attempts:
                self._end_solve(cursor, job_id, "failed", None, _gave_up(stored), now)
            elif lapsed or stored.status == "failed":
                attempts = stored.attempts + 1 if lapsed else 1
                cursor.execute(
                    self._sql(
                        "UPDATE solves SET status = 'queued', stage = NULL, objective = NULL, "
                        "lower_bound = NULL, attempts = ?, owner = ?, heartbeat_at = ?, "
                        "started_at = NULL, updated_at = ?, problem = NULL WHERE job_id = ?"
                    ),
                    (attempts, owner, now, now, job_id),
                )
            else:
                return stored, False
            cursor.execute(
                self._sql(f"SELECT {SOLVE_COLUMNS} FROM solves WHERE job_id = ?"), (job_id,)
            )
            after = _solve_row(cursor.fetchone())
        return after, after.status == "queued"

    def add_done_solve(self, new: NewSolve, plan_id: str, now: str) -> StoredSolve:
        """A job for a request whose plan is stored already: done at once (a job that
        exists keeps its row, and is marked done)."""
        with self._transaction(write=True) as cursor:
            cursor.execute(
                self._sql(
                    "INSERT INTO solves (job_id, request_hash, planner_version, request, "
                    "time_limit_s, status, attempts, heartbeat_at, created_at, updated_at, "
                    "plan_id) VALUES (?, ?, ?, ?, ?, 'done', 0, ?, ?, ?, ?) "
                    "ON CONFLICT (job_id) DO UPDATE SET status = 'done', "
                    "plan_id = excluded.plan_id, problem = NULL, "
                    "updated_at = excluded.updated_at WHERE solves.status <> 'done'"
                ),
                (new.job_id, new.request_hash, new.planner_version, new.request,
                 new.time_limit_s, now, now, now, plan_id),
            )  # fmt: skip
            cursor.execute(
                self._sql(f"SELECT {SOLVE_COLUMNS} FROM solves WHERE job_id = ?"), (new.job_id,)
            )
            return _solve_row(cursor.fetchone())

    def lapsed_solves(self, stale_before: str, limit: int) -> list[str]:
        """Ids of up to ``limit`` jobs queued or running whose lease lapsed, oldest first."""
        with self._transaction() as cursor:
            cursor.execute(
                self._sql(
                    "SELECT job_id FROM solves WHERE status IN ('queued', 'running') "
                    "AND heartbeat_at < ? ORDER BY heartbeat_at, job_id LIMIT ?"
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
        with self._transaction(write=True) as cursor:
            cursor.execute(
                self._sql(
                    "UPDATE solves SET status = ?, stage = ?, objective = ?, lower_bound = ?, "
                    "started_at = COALESCE(started_at, ?), heartbeat_at = ?, updated_at = ? "
                    "WHERE job_id = ? AND owner = ? AND status IN ('queued', 'running')"
                ),
                ("running" if running else "queued", stage, objective, bound, started_at,
                 now, now, job_id, owner),
            )  # fmt: skip
            return bool(cursor.rowcount == 1)

    def end_solve(
        self,
        job_id: str,
        status: str,
        *,
        plan_id: str | None,
        problem: bytes | None,
        progress: tuple[str | None, float | None, float | None] = (None, None, None),
        now: str,
    ) -> None:
        """The job ended: ``done`` with its plan, or ``no_plan`` / ``failed`` with the
        problem document that says why; ``progress`` (stage, objective, lower bound) as it
        ended, where known."""
        with self._transaction(write=True) as cursor:
            self._end_solve(cursor, job_id, status, plan_id, problem, now)
            cursor.execute(
                self._sql(
                    "UPDATE solves SET stage = COALESCE(?, stage), "
                    "objective = COALESCE(?, objective), "
                    "lower_bound = COALESCE(?, lower_bound) WHERE job_id = ?"
                ),
                (*progress, job_id),
            )

    def _end_solve(
        self,
        cursor: Any,
        job_id: str,
        status: str,
        plan_id: str | None,
        problem: bytes | None,
        now: str,
    ) -> None:
        cursor.execute(
            self._sql(
                "UPDATE solves SET status = ?, plan_id = ?, problem = ?, updated_at = ? "
                "WHERE job_id = ?"
            ),
            (status, plan_id, problem, now, job_id),
        )

    def renew_solves(self, owner: str, now: str) -> None:
        """Renew the lease of every job ``owner`` is solving."""
        with self._transaction(write=True) as cursor:
            cursor.execute(
                self._sql(
                    "UPDATE solves SET heartbeat_at = ? "
                    "WHERE owner = ? AND status IN ('queued', 'running')"
                ),
                (now, owner),
            )

    def release_solves(self, owner: str) -> None:
        """Give up ``owner``'s jobs (it is stopping): their leases lapse now, so another
        process takes them over at once rather than when they would have lapsed."""
        with self._transaction(write=True) as cursor:
            cursor.execute(
                self._sql(
                    "UPDATE solves SET heartbeat_at = '' "
                    "WHERE owner = ? AND status IN ('queued', 'running')"
                ),
                (owner,),
            )

    def list_aliases(self, *, limit: int, after: str | None = None) -> list[AliasChange]:
        """Up to ``limit`` aliases by name in bytewise order (the same on both databases),
        only names after ``after``; each as the change that set it last."""
        where = ""
        arguments: tuple[str, ...] = ()
        if after is not None:
            where, arguments = f"WHERE a.name{self.bytewise} > ? ", (after,)
        with self._transaction() as cursor:
            cursor.execute(
                self._sql(
                    "SELECT h.name, h.version, h.plan_id, h.previous_plan_id, h.actor, "
                    "h.comment, h.changed_at FROM aliases a JOIN alias_history h "
                    f"ON h.name = a.name AND h.version = a.version {where}"
                    f"ORDER BY a.name{self.bytewise} LIMIT ?"
                ),
                (*arguments, limit),
            )
            rows: Sequence[Sequence[Any]] = cursor.fetchall()
        return [_alias_change(row) for row in rows]

    def get_alias(self, name: str) -> AliasChange | None:
        """The alias's current target, as its latest change."""
        history = self.alias_history(name, limit=1)
        return history[0] if history else None

    def alias_history(self, name: str, *, limit: int = 100) -> list[AliasChange]:
        """Changes of ``name``, newest first."""
        with self._transaction() as cursor:
            cursor.execute(
                self._sql(
                    "SELECT name, version, plan_id, previous_plan_id, actor, comment, changed_at "
                    "FROM alias_history WHERE name = ? ORDER BY version DESC LIMIT ?"
                ),
                (name, limit),
            )
            rows: Sequence[Sequence[Any]] = cursor.fetchall()
        return [_alias_change(row) for row in rows]


def _gave_up(stored: StoredSolve) -> bytes:
    detail = (
        f"this job was started {stored.attempts} times and each time the service process "
        "solving it stopped before it ended (restarts, or a crash the request causes); "
        "it is not resumed again. POST the request again to retry"
    )
    return json.dumps(
        {"type": "about:blank", "title": "Solve abandoned", "status": 503, "detail": detail}
    ).encode()


def _alias_change(row: Sequence[Any]) -> AliasChange:
    return AliasChange(row[0], int(row[1]), row[2], row[3], row[4], row[5], row[6])


def _summary_values(summary: PlanSummary) -> tuple[int, int, float, str]:
    return summary.world_size, summary.num_tables, summary.objective, summary.status.value


class SqliteStore(PlanStore):
    """One SQLite file; a connection per thread; WAL + synchronous=FULL."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        with self._transaction(write=True) as cursor:
            self._create_schema(cursor)

    def _connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            try:
                connection = sqlite3.connect(
                    self.path, isolation_level=None, check_same_thread=False, timeout=30
                )
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA synchronous=FULL")
                connection.execute("PRAGMA foreign_keys=ON")
            except sqlite3.Error as error:
                raise StoreUnavailableError(f"SQLite {self.path}: {error}") from error
            self._local.connection = connection
            with self._lock:
                self._connections.append(connection)
        return connection

    @contextmanager
    def _transaction(self, *, write: bool = False) -> Iterator[sqlite3.Cursor]:
        connection = self._connection()
        cursor = connection.cursor()
        try:
            cursor.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield cursor
            except BaseException:
                connection.rollback()
                raise
            connection.commit()
        except sqlite3.Error as error:
            raise StoreUnavailableError(f"SQLite {self.path}: {error}") from error
        finally:
            cursor.close()

    def close(self) -> None:
        with self._lock:
            for connection in self._connections:
                connection.close()
            self._connections.clear()
        self._local = threading.local()


class PostgresStore(PlanStore):
    """PostgreSQL through a psycopg 3 connection pool."""

    placeholder = "%s"
    blob_type = "BYTEA"
    columns_query = (
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = 'plans'"
    )
    bytewise = ' COLLATE "C"'
    for_update = " FOR UPDATE"
    _SCHEMA_LOCK = 0x5348415244  # pg_advisory_xact_lock key: replicas create the schema once

    def __init__(self, url: str, *, max_connections: int = 8) -> None:
        import psycopg
        from psycopg_pool import ConnectionPool

        self._errors = (psycopg.Error, TimeoutError)
        self.url = url
        try:
            # One direct connection first: it fails at once when the server refuses, where
            # a pool would retry until its timeout. It creates the schema, once across
            # replicas starting together (transaction-scoped advisory lock).
            with (
                psycopg.connect(url, connect_timeout=10) as connection,
                connection.transaction(),
                connection.cursor() as cursor,
            ):
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", (self._SCHEMA_LOCK,))
                self._create_schema(cursor)
            # check_connection: a connection broken by a database restart is replaced
            # on checkout instead of failing one request after the restart.
            self._pool = ConnectionPool(
                url,
                min_size=1,
                max_size=max_connections,
                open=True,
                timeout=5,  # waiting longer for a connection means overload or an outage
                check=ConnectionPool.check_connection,
            )
        except self._errors as error:
            raise StoreUnavailableError(f"PostgreSQL: {error}") from error

    @contextmanager
    def _transaction(self, *, write: bool = False) -> Iterator[Any]:
        from psycopg_pool import PoolTimeout

        try:
            with (
                self._pool.connection() as connection,
                connection.transaction(),
                connection.cursor() as cursor,
            ):
                yield cursor
        except (*self._errors, PoolTimeout) as error:
            raise StoreUnavailableError(f"PostgreSQL: {error}") from error

    def _lock_alias(self, cursor: Any, name: str) -> None:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (name,))

    def ping(self) -> None:
        """A fresh connection, not the pool's: answers at once when the server is down."""
        import psycopg

        try:
            with psycopg.connect(self.url, connect_timeout=3) as connection:
                connection.execute("SELECT 1").fetchone()
        except self._errors as error:
            raise StoreUnavailableError(f"PostgreSQL: {error}") from error

    def close(self) -> None:
        self._pool.close()


def open_store(url: str) -> PlanStore:
    """``postgresql://…`` (or ``postgres://…``) opens PostgreSQL; anything else is a SQLite
    path (``sqlite:///path`` or a plain path)."""
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresStore(url)
    return SqliteStore(url.removeprefix("sqlite://") if url.startswith("sqlite://") else url)
