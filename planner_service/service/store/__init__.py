"""The plan store: plans, aliases, async solve jobs and device profiles, in SQLite or
PostgreSQL, with one text of SQL for both.

- ``plan_store.py``: ``PlanStore``, the object the service holds, composing
- ``plans.py`` (immutable plans by content address, one planner plan per request and
  planner version), ``aliases.py`` (names for plans, with
  their history), ``jobs.py`` (the leased, bounded queue of async solves) and ``profiles.py``
  (immutable device profiles by content address);
- ``encodings.py``: the gzip and zstd bytes each plan is stored with;
- ``schema.py``: the tables, and bringing an older store up to date when it is opened;
- ``database.py``: what those run their SQL on (transactions, the dialect, rows by name);
- ``sqlite.py`` (default: one file, zero set-up) and ``postgres.py`` (production: a
  connection pool, replicas sharing one database): the backends.

``open_store`` picks the backend from the database URL.
"""

from __future__ import annotations

from planner_service.service.store.aliases import AliasChange, UnknownPlanError
from planner_service.service.store.database import StoreUnavailableError
from planner_service.service.store.encodings import PlanBodies, gzip_plan, zstd_plan
from planner_service.service.store.jobs import JobQueueFullError, NewSolve, StoredSolve
from planner_service.service.store.plan_store import PlanStore
from planner_service.service.store.plans import NewPlan, PlannedPlan, StoredPlan
from planner_service.service.store.postgres import PostgresStore
from planner_service.service.store.profiles import StoredProfile
from planner_service.service.store.sqlite import SqliteStore

__all__ = [
    "AliasChange",
    "JobQueueFullError",
    "NewPlan",
    "NewSolve",
    "PlanBodies",
    "PlanStore",
    "PlannedPlan",
    "PostgresStore",
    "SqliteStore",
    "StoreUnavailableError",
    "StoredPlan",
    "StoredProfile",
    "StoredSolve",
    "UnknownPlanError",
    "gzip_plan",
    "open_store",
    "zstd_plan",
]


def open_store(url: str) -> PlanStore:
    """``postgresql://…`` (or ``postgres://…``) opens PostgreSQL; anything else is a SQLite
    path (``sqlite:///path`` or a plain path)."""
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresStore(url)
    return SqliteStore(url.removeprefix("sqlite://") if url.startswith("sqlite://") else url)
