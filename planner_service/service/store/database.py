"""What every part of the store runs its SQL on: a database (a backend's connections and
transactions), the dialect it speaks, and rows read by column name.

The SQL is written once, SQLite's way (``?`` parameters, ``BLOB``); a ``Dialect`` says how
the other database spells what differs, so plans, aliases and jobs share one text of each
statement across both backends.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol


class StoreUnavailableError(RuntimeError):
    """The database cannot be reached or refused the operation."""


class Cursor(Protocol):
    """The DB-API cursor both drivers give (sqlite3's and psycopg's)."""

    @property
    def rowcount(self) -> int: ...

    @property
    def description(self) -> Any: ...

    def execute(self, sql: str, parameters: Any = ..., /) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


@dataclass(frozen=True)
class Dialect:
    """How one database spells what the shared SQL leaves open."""

    placeholder: str
    blob_type: str
    columns_query: str  # the names of the columns of ``plans``, one per row
    tables_query: str  # the names of the store's tables, one per row
    bytewise: str  # the collation that orders text by its bytes ("": the default does)
    for_update: str  # locks the rows a SELECT reads inside a write transaction
    # serialises the write transactions that take one key (an alias's changes, the job
    # queue's admissions); None: the write lock does already
    key_lock: str | None

    def sql(self, text: str) -> str:
        """``text`` with its ``?`` parameters in this dialect's placeholder."""
        return text.replace("?", self.placeholder)


class Database(ABC):
    """One backend's connections: transactions on them, a liveness check, and closing."""

    dialect: Dialect

    @abstractmethod
    def transaction(self, *, write: bool = False) -> AbstractContextManager[Cursor]:
        """A cursor inside one transaction, committed on normal exit, rolled back on error;
        ``write`` transactions take the write lock up front where the database has one."""

    @abstractmethod
    def close(self) -> None: ...

    def ping(self) -> None:
        """Raise StoreUnavailableError unless the database answers a query."""
        with self.transaction() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()

    def sql(self, text: str) -> str:
        return self.dialect.sql(text)


def named(cursor: Cursor, row: Sequence[Any]) -> dict[str, Any]:
    """A row by its column names, as the cursor's last query named them."""
    names = [column[0] for column in cursor.description]
    return dict(zip(names, row, strict=True))


def now() -> str:
    """The time stamps the store writes: ISO 8601, UTC, to the microsecond (so text order
    is time order)."""
    return datetime.now(UTC).isoformat(timespec="microseconds")
