"""The PostgreSQL backend (production): ``SHARDPLAN_DATABASE_URL=postgresql://…``, psycopg 3
with a connection pool; several service replicas can share one database. psycopg is
imported only when a PostgreSQL store is opened."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from planner_service.service.store.database import Database, Dialect, StoreUnavailableError
from planner_service.service.store.plan_store import PlanStore
from planner_service.service.store.schema import create_schema

POSTGRES = Dialect(
    placeholder="%s",
    blob_type="BYTEA",
    columns_query=(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = 'plans'"
    ),
    tables_query=(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
    ),
    bytewise=' COLLATE "C"',
    for_update=" FOR UPDATE",
    key_lock="SELECT pg_advisory_xact_lock(hashtext(%s))",
)
_SCHEMA_LOCK = 0x5348415244  # pg_advisory_xact_lock key: replicas create the schema once


class PostgresDatabase(Database):
    """PostgreSQL through a psycopg 3 connection pool."""

    dialect = POSTGRES

    def __init__(self, url: str, *, max_connections: int = 8) -> None:
        import psycopg
        from psycopg_pool import ConnectionPool

        self._errors = (psycopg.Error, TimeoutError)
        self.url = url
        try:
            self._create_schema()
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

    def _create_schema(self) -> None:
        """On one direct connection, before the pool: it fails at once when the server
        refuses, where a pool would retry until its timeout. Once across replicas starting
        together (a transaction-scoped advisory lock)."""
        import psycopg

        with (
            psycopg.connect(self.url, connect_timeout=10) as connection,
            connection.transaction(),
            connection.cursor() as cursor,
        ):
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            create_schema(cursor, self.dialect)

    @contextmanager
    def transaction(self, *, write: bool = False) -> Iterator[Any]:
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


class PostgresStore(PlanStore):
    """The plan store in a PostgreSQL database."""

    def __init__(self, url: str, *, max_connections: int = 8) -> None:
        super().__init__(PostgresDatabase(url, max_connections=max_connections))
