"""The SQLite backend (the default): one file under ``./var/``, WAL journal,
``synchronous=FULL``, so a committed plan survives a killed process and a power cut; zero
set-up. A connection per thread; write transactions take the database's one write lock up
front (``BEGIN IMMEDIATE``), which also serialises alias changes and job claims."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from planner_service.service.store.database import Database, Dialect, StoreUnavailableError
from planner_service.service.store.plan_store import PlanStore
from planner_service.service.store.schema import create_schema

SQLITE = Dialect(
    placeholder="?",
    blob_type="BLOB",
    columns_query="SELECT name FROM pragma_table_info('plans')",
    tables_query="SELECT name FROM sqlite_master WHERE type = 'table'",
    bytewise="",  # SQLite's default collation orders text by its bytes
    for_update="",  # BEGIN IMMEDIATE has locked the whole database already
    key_lock=None,
)


class SqliteDatabase(Database):
    """One SQLite file; a connection per thread; WAL + synchronous=FULL."""

    dialect = SQLITE

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        with self.transaction(write=True) as cursor:
            create_schema(cursor, self.dialect)

    def _connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._connect()
            self._local.connection = connection
            with self._lock:
                self._connections.append(connection)
        return connection

    def _connect(self) -> sqlite3.Connection:
        try:
            connection = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=30
            )
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=FULL")
            connection.execute("PRAGMA foreign_keys=ON")
        except sqlite3.Error as error:
            raise StoreUnavailableError(f"SQLite {self.path}: {error}") from error
        return connection

    @contextmanager
    def transaction(self, *, write: bool = False) -> Iterator[sqlite3.Cursor]:
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


class SqliteStore(PlanStore):
    """The plan store in one SQLite file."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(SqliteDatabase(path))
