"""Aliases: names that point at stored plans, the one mutable thing in the store. Every
change is appended to ``alias_history`` in the same transaction as the alias itself, so
the history is how an alias is rolled back."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from planner_service.service.store.database import Cursor, Database, named, now

_CHANGE_COLUMNS = "name, version, plan_id, previous_plan_id, actor, comment, changed_at"


class UnknownPlanError(LookupError):
    """An alias was pointed at a plan the store does not hold."""


class AliasChange(BaseModel):
    """One change of an alias: who pointed it where, when, and where it pointed before."""

    model_config = ConfigDict(frozen=True)

    name: str
    version: int
    plan_id: str
    previous_plan_id: str | None
    actor: str
    comment: str | None
    changed_at: str


class Aliases:
    """The ``aliases`` and ``alias_history`` tables' operations."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def set(
        self, name: str, plan_id: str, *, actor: str, comment: str | None = None
    ) -> AliasChange:
        """Point ``name`` at ``plan_id`` and record the change; UnknownPlanError when the
        plan is not stored."""
        with self.database.transaction(write=True) as cursor:
            self._lock(cursor, name)
            cursor.execute(self.database.sql("SELECT 1 FROM plans WHERE plan_id = ?"), (plan_id,))
            if cursor.fetchone() is None:
                raise UnknownPlanError(plan_id)
            change = self._next_change(cursor, name, plan_id, actor=actor, comment=comment)
            self._record(cursor, change)
        return change

    def page(self, *, limit: int, after: str | None = None) -> list[AliasChange]:
        """Up to ``limit`` aliases by name in bytewise order (the same on both databases),
        only names after ``after``; each as the change that set it last."""
        bytewise = self.database.dialect.bytewise
        where = ""
        arguments: tuple[str, ...] = ()
        if after is not None:
            where, arguments = f"WHERE a.name{bytewise} > ? ", (after,)
        columns = ", ".join(f"h.{column} AS {column}" for column in _CHANGE_COLUMNS.split(", "))
        with self.database.transaction() as cursor:
            cursor.execute(
                self.database.sql(
                    f"SELECT {columns} FROM aliases a JOIN alias_history h "
                    f"ON h.name = a.name AND h.version = a.version {where}"
                    f"ORDER BY a.name{bytewise} LIMIT ?"
                ),
                (*arguments, limit),
            )
            return [AliasChange(**named(cursor, row)) for row in cursor.fetchall()]

    def get(self, name: str) -> AliasChange | None:
        """The alias's current target, as its latest change."""
        history = self.history(name, limit=1)
        return history[0] if history else None

    def history(self, name: str, *, limit: int = 100) -> list[AliasChange]:
        """Changes of ``name``, newest first."""
        with self.database.transaction() as cursor:
            cursor.execute(
                self.database.sql(
                    f"SELECT {_CHANGE_COLUMNS} FROM alias_history WHERE name = ? "
                    "ORDER BY version DESC LIMIT ?"
                ),
                (name, limit),
            )
            return [AliasChange(**named(cursor, row)) for row in cursor.fetchall()]

    def _lock(self, cursor: Cursor, name: str) -> None:
        """Serialise concurrent changes of one alias (where the transaction's write lock
        does not already: SQLite's BEGIN IMMEDIATE does)."""
        if self.database.dialect.key_lock is not None:
            cursor.execute(self.database.dialect.key_lock, (name,))

    def _next_change(
        self, cursor: Cursor, name: str, plan_id: str, *, actor: str, comment: str | None
    ) -> AliasChange:
        """The change that points ``name`` at ``plan_id``: the alias's next version."""
        cursor.execute(
            self.database.sql("SELECT plan_id, version FROM aliases WHERE name = ?"), (name,)
        )
        row = cursor.fetchone()
        previous, version = (None, 1) if row is None else (str(row[0]), int(row[1]) + 1)
        return AliasChange(
            name=name,
            version=version,
            plan_id=plan_id,
            previous_plan_id=previous,
            actor=actor,
            comment=comment,
            changed_at=now(),
        )

    def _record(self, cursor: Cursor, change: AliasChange) -> None:
        """Append the change to the history and point the alias as it says."""
        cursor.execute(
            self.database.sql(
                f"INSERT INTO alias_history ({_CHANGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
            ),
            (change.name, change.version, change.plan_id, change.previous_plan_id,
             change.actor, change.comment, change.changed_at),
        )  # fmt: skip
        cursor.execute(
            self.database.sql(
                "INSERT INTO aliases (name, plan_id, version, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET plan_id = excluded.plan_id, "
                "version = excluded.version, updated_at = excluded.updated_at"
            ),
            (change.name, change.plan_id, change.version, change.changed_at),
        )
