"""The store's tables, and how a store made by an older release is brought up to date
when it is opened (tables and columns added, summaries filled in), so that every store opens
as it is: a table added later (``profiles``) is created by its ``CREATE TABLE IF NOT
EXISTS`` the first time a store made before it is opened.

``planner_plans`` holds the one planner-made plan of each (request hash, planner version):
its primary key is what keeps a key from holding two (``Plans.put_planned``). A store made
before it gets it filled from its plans when it is opened: the first plan stored for each
key (the one ``POST`` has been answering with); later plans of the same key stay stored and
fetchable by id and alias, but answer no request, and jobs that named them name the first.

One schema for both databases: TEXT timestamps (ISO 8601, UTC) and binary plan bytes;
``BLOB`` is spelled per database (``BYTEA`` on PostgreSQL).
"""

from __future__ import annotations

import logging

from planner_service.plan.api import PlanSummary, SolveJobStatus
from planner_service.service.store.database import Cursor, Dialect

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
CREATE TABLE IF NOT EXISTS planner_plans (
    request_hash TEXT NOT NULL,
    planner_version TEXT NOT NULL,
    plan_id TEXT NOT NULL,
    PRIMARY KEY (request_hash, planner_version)
);
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
CREATE TABLE IF NOT EXISTS profiles (
    profile_id TEXT PRIMARY KEY,
    compute_device TEXT NOT NULL,
    profile BLOB NOT NULL,
    created_at TEXT NOT NULL
);
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
# and ``plan_zstd`` are filled the first time such a plan is fetched (``Plans.bodies``).
# ``imported`` is 1 for plans stored by PUT /v1/plans/{plan_id}, whose solver report nothing
# here verified (NULL: made by the planner, or imported before the column existed).
_LATER_COLUMNS = {"plan_gzip": "BLOB", "plan_zstd": "BLOB", "imported": "INTEGER"}
log = logging.getLogger("shardplan.store")


def create_schema(cursor: Cursor, dialect: Dialect) -> None:
    """Create what is missing of the schema, in the caller's transaction, and bring the
    plans of an older store up to date."""
    cursor.execute(dialect.tables_query)
    tables = {str(row[0]) for row in cursor.fetchall()}
    for statement in _SCHEMA.replace("BLOB", dialect.blob_type).split(";"):
        if statement.strip():
            cursor.execute(statement)
    _add_later_columns(cursor, dialect)
    _backfill_summaries(cursor, dialect)
    if "planner_plans" not in tables:
        _fill_planner_plans(cursor, dialect)


def summary_values(summary: PlanSummary) -> tuple[int, int, float, str]:
    """A plan's summary columns, in their order."""
    return summary.world_size, summary.num_tables, summary.objective, summary.status.value


def _add_later_columns(cursor: Cursor, dialect: Dialect) -> None:
    """Give a store made before plan summaries and encodings existed their columns."""
    cursor.execute(dialect.columns_query)
    present = {str(row[0]) for row in cursor.fetchall()}
    for name, column_type in (_SUMMARY_COLUMNS | _LATER_COLUMNS).items():
        if name not in present:
            column_type = column_type.replace("BLOB", dialect.blob_type)
            cursor.execute(f"ALTER TABLE plans ADD COLUMN {name} {column_type}")


def _backfill_summaries(cursor: Cursor, dialect: Dialect) -> None:
    """Fill the summaries of plans stored before summaries existed from the plans
    themselves, a batch at a time (once: new plans come with one)."""
    select = dialect.sql("SELECT plan_id, plan FROM plans WHERE world_size IS NULL LIMIT ?")
    update = dialect.sql(
        "UPDATE plans SET world_size = ?, num_tables = ?, objective = ?, status = ? "
        "WHERE plan_id = ?"
    )
    while True:
        cursor.execute(select, (_BACKFILL_BATCH,))
        rows = cursor.fetchall()
        if not rows:
            return
        for plan_id, data in rows:
            summary = PlanSummary.of_stored(bytes(data))
            cursor.execute(update, (*summary_values(summary), plan_id))


def _fill_planner_plans(cursor: Cursor, dialect: Dialect) -> None:
    """A store made before ``planner_plans``: each key's planner plan is the first plan
    stored for it that was not imported (oldest, then lowest id: what ``POST`` answered),
    and the done jobs of the
    key name it. Later plans of a key (restarts and replicas could store several) stay."""
    cursor.execute(
        "INSERT INTO planner_plans (request_hash, planner_version, plan_id) "
        "SELECT request_hash, planner_version, plan_id FROM (SELECT request_hash, "
        "planner_version, plan_id, ROW_NUMBER() OVER (PARTITION BY request_hash, "
        "planner_version ORDER BY created_at, plan_id) AS n FROM plans WHERE imported IS NULL) "
        "AS ranked WHERE n = 1"
    )
    cursor.execute(
        "SELECT COUNT(*) FROM plans AS p WHERE NOT EXISTS (SELECT 1 FROM planner_plans AS k "
        "WHERE k.plan_id = p.plan_id)"
    )
    (later,) = cursor.fetchone()
    cursor.execute(
        dialect.sql(
            "UPDATE solves SET plan_id = (SELECT k.plan_id FROM planner_plans AS k WHERE "
            "k.request_hash = solves.request_hash AND k.planner_version = "
            "solves.planner_version) WHERE status = ? AND EXISTS (SELECT 1 FROM planner_plans "
            "AS k WHERE k.request_hash = solves.request_hash AND k.planner_version = "
            "solves.planner_version AND k.plan_id <> solves.plan_id)"
        ),
        (SolveJobStatus.DONE.value,),
    )
    if later:
        log.warning(
            "store upgrade: %d plan(s) shared a request and planner version with an earlier "
            "plan; the earliest of each answers its request, the others stay stored "
            "(fetchable by id and alias) and %d job(s) now name the earliest",
            later,
            cursor.rowcount,
        )
