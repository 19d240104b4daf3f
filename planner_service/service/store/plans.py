"""Stored plans: inserted once by ``plan_id`` (their content address) with the request and
a summary (world size, tables, objective, status: what a list shows) beside them, never
deleted, and their bytes never changed. A plan the planner made is also its key's one
planner plan (``planner_plans``: one per request hash and planner version,
``put_planned``). An imported plan (PUT) is marked ``imported``; the mark goes only when
the planner makes the same plan, byte for byte.

``Plans.put`` returns only after the commit, so a plan the API reports as stored is
durable. Lists are pages in a fixed order with a keyset cursor (the last row's sort key),
so a page costs the same however deep it is and rows stored meanwhile neither repeat nor
shift it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from planner_service.plan.api import PlanListing, PlanSummary
from planner_service.plan.plan_ids import id_range
from planner_service.service.store.database import Cursor, Database, named, now
from planner_service.service.store.encodings import PlanBodies, gzip_plan, zstd_plan
from planner_service.service.store.schema import summary_values


@dataclass(frozen=True)
class NewPlan:
    """A plan to store, its request, its key (``request_hash``, ``planner_version``), its
    summary and its encodings (made when it is stored, unless given)."""

    plan_id: str
    request_hash: str
    planner_version: str
    request: bytes
    plan: bytes
    summary: PlanSummary
    bodies: PlanBodies | None = None


@dataclass(frozen=True)
class PlannedPlan:
    """What ``Plans.put_planned`` leaves: the planner plan its key holds, and whether this
    call stored it (False: another solve's plan, stored first, is the answer)."""

    plan_id: str
    inserted: bool


@dataclass(frozen=True)
class StoredPlan:
    """A stored plan and its request; ``imported``: stored by PUT (its solver report is the
    importer's word)."""

    plan_id: str
    plan: bytes
    request: bytes
    created_at: str
    imported: bool = False


class Plans:
    """The ``plans`` table's operations."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def put_planned(self, new: NewPlan) -> PlannedPlan:
        """Store a plan the planner made, unless the key (``request_hash``,
        ``planner_version``) holds a planner plan already: one key never holds two
        (``planner_plans``' primary key, taken first in the same transaction, so a second
        writer waits and then finds the first's). Returns the plan the key holds after
        this, which every caller answers with. Returns after the commit."""
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                self.database.sql(
                    "INSERT INTO planner_plans (request_hash, planner_version, plan_id) "
                    "VALUES (?, ?, ?) ON CONFLICT (request_hash, planner_version) DO NOTHING"
                ),
                (new.request_hash, new.planner_version, new.plan_id),
            )
            if cursor.rowcount != 1:
                held = _planner_plan(self.database, cursor, new.request_hash, new.planner_version)
                assert held is not None
                return PlannedPlan(plan_id=held, inserted=False)
            inserted = self._insert(cursor, new)
            if not inserted:
                _made_here(self.database, cursor, new.plan_id)
        return PlannedPlan(plan_id=new.plan_id, inserted=inserted)

    def put(
        self,
        *,
        plan_id: str,
        request_hash: str,
        planner_version: str,
        request: bytes,
        plan: bytes,
        summary: PlanSummary,
        bodies: PlanBodies | None = None,
        imported: bool = False,
    ) -> bool:
        """Insert a plan once, with its encodings (``bodies``, made here unless given);
        True when this call stored it, False when it already was. ``for_request`` finds
        it by ``request_hash`` and ``planner_version`` unless it was ``imported`` (made
        elsewhere: its report unverified, never this planner's answer). Returns after the
        commit."""
        new = NewPlan(plan_id, request_hash, planner_version, request, plan, summary, bodies)
        with self.database.transaction(write=True) as cursor:
            return self._insert(cursor, new, imported=imported)

    def _insert(self, cursor: Cursor, new: NewPlan, *, imported: bool = False) -> bool:
        encoded = PlanBodies.of(new.plan) if new.bodies is None else new.bodies
        assert encoded.identity == new.plan
        cursor.execute(
            self.database.sql(
                "INSERT INTO plans (plan_id, request_hash, planner_version, request, plan, "
                "created_at, world_size, num_tables, objective, status, plan_gzip, "
                "plan_zstd, imported) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (plan_id) DO NOTHING"
            ),
            (new.plan_id, new.request_hash, new.planner_version, new.request, new.plan, now(),
             *summary_values(new.summary), encoded.gzip, encoded.zstd,
             1 if imported else None),
        )  # fmt: skip
        return bool(cursor.rowcount == 1)

    def page(self, *, limit: int, before: Sequence[str] | None = None) -> list[PlanListing]:
        """Up to ``limit`` plans, newest first (by ``created_at``, then ``plan_id``), only
        those after ``before`` in that order (a ``(created_at, plan_id)`` already listed)."""
        where = ""
        arguments: tuple[str, ...] = ()
        if before is not None:
            where = "WHERE created_at < ? OR (created_at = ? AND plan_id < ?) "
            arguments = (before[0], before[0], before[1])
        with self.database.transaction() as cursor:
            cursor.execute(
                self.database.sql(
                    "SELECT plan_id, planner_version, created_at, world_size, num_tables, "
                    f"objective, status, imported FROM plans {where}"
                    "ORDER BY created_at DESC, plan_id DESC LIMIT ?"
                ),
                (*arguments, limit),
            )
            rows = [named(cursor, row) for row in cursor.fetchall()]
        return [_listing(row) for row in rows]

    def get(self, plan_id: str) -> StoredPlan | None:
        with self.database.transaction() as cursor:
            cursor.execute(
                self.database.sql(
                    "SELECT plan_id, plan, request, created_at, imported FROM plans "
                    "WHERE plan_id = ?"
                ),
                (plan_id,),
            )
            row = cursor.fetchone()
        if row is None:
            return None
        stored_id, plan, request, created_at, imported = row
        return StoredPlan(stored_id, bytes(plan), bytes(request), created_at, bool(imported))

    def bodies(self, plan_id: str) -> PlanBodies | None:
        """A plan's identity, gzip and zstd bytes, and whether it was imported. A plan
        stored before an encoding's column existed gets that encoding now, stored once for
        every later fetch (by any replica; one that raced this one keeps its own bytes)."""
        with self.database.transaction() as cursor:
            cursor.execute(
                self.database.sql(
                    "SELECT plan, plan_gzip, plan_zstd, imported FROM plans WHERE plan_id = ?"
                ),
                (plan_id,),
            )
            row = cursor.fetchone()
        if row is None:
            return None
        data, gzipped, zstd, imported = row
        if gzipped is not None and zstd is not None:
            return PlanBodies(bytes(data), bytes(gzipped), bytes(zstd), bool(imported))
        encoded = self._encode(
            plan_id, bytes(data), missing_gzip=gzipped is None, missing_zstd=zstd is None
        )
        return replace(encoded, imported=bool(imported))

    def _encode(
        self, plan_id: str, data: bytes, *, missing_gzip: bool, missing_zstd: bool
    ) -> PlanBodies:
        """Store the encodings a plan lacks, keeping any another replica stored first."""
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                self.database.sql(
                    "UPDATE plans SET plan_gzip = COALESCE(plan_gzip, ?), "
                    "plan_zstd = COALESCE(plan_zstd, ?) WHERE plan_id = ?"
                ),
                (gzip_plan(data) if missing_gzip else None,
                 zstd_plan(data) if missing_zstd else None, plan_id),
            )  # fmt: skip
            cursor.execute(
                self.database.sql("SELECT plan_gzip, plan_zstd FROM plans WHERE plan_id = ?"),
                (plan_id,),
            )
            gzipped, zstd = cursor.fetchone()
        return PlanBodies(data, bytes(gzipped), bytes(zstd))

    def ids_starting_with(self, prefix: str, *, limit: int) -> list[str]:
        """Up to ``limit`` stored plan ids that start with ``prefix`` (lowercase hex), in
        id order: a range scan of the primary key's index (``plan_ids.id_range``), not a
        scan of the table, so resolving a short id costs the same however many plans are
        stored."""
        low, high = id_range(prefix)
        bounds = (low,) if high is None else (low, high)
        with self.database.transaction() as cursor:
            cursor.execute(
                self.database.sql(ids_in_range_sql(bounded=high is not None)), (*bounds, limit)
            )
            return [str(row[0]) for row in cursor.fetchall()]

    def for_request(self, request_hash: str, planner_version: str) -> str | None:
        """The plan_id this planner version already made for this request, if any: the
        planner's plan (``put_planned``), else the first one stored before that table
        existed. An imported plan claims the version but its report is unverified, so it
        never stands in for a solve."""
        with self.database.transaction() as cursor:
            planned = _planner_plan(self.database, cursor, request_hash, planner_version)
            if planned is not None:
                return planned
            cursor.execute(
                self.database.sql(
                    "SELECT plan_id FROM plans WHERE request_hash = ? AND planner_version = ? "
                    "AND imported IS NULL ORDER BY created_at LIMIT 1"
                ),
                (request_hash, planner_version),
            )
            row = cursor.fetchone()
        return None if row is None else str(row[0])


def _made_here(database: Database, cursor: Cursor, plan_id: str) -> None:
    """The planner made a plan stored already: byte for byte the plan an importer stored,
    so its solver report is this planner's own, no longer only the importer's word."""
    cursor.execute(
        database.sql("UPDATE plans SET imported = NULL WHERE plan_id = ? AND imported = 1"),
        (plan_id,),
    )


def _planner_plan(
    database: Database, cursor: Cursor, request_hash: str, planner_version: str
) -> str | None:
    cursor.execute(
        database.sql(
            "SELECT plan_id FROM planner_plans WHERE request_hash = ? AND planner_version = ?"
        ),
        (request_hash, planner_version),
    )
    row = cursor.fetchone()
    return None if row is None else str(row[0])


def ids_in_range_sql(*, bounded: bool) -> str:
    """The query of ``Plans.ids_starting_with``: ids from a lower bound, below an upper one
    when ``bounded``, at most a limit (the tests EXPLAIN it on both databases)."""
    below = "AND plan_id < ? " if bounded else ""
    return f"SELECT plan_id FROM plans WHERE plan_id >= ? {below}ORDER BY plan_id LIMIT ?"


def _listing(row: dict[str, Any]) -> PlanListing:
    summary = PlanSummary(
        world_size=row["world_size"],
        num_tables=row["num_tables"],
        objective=row["objective"],
        status=row["status"],
    )
    return PlanListing(
        plan_id=row["plan_id"],
        planner_version=row["planner_version"],
        created_at=row["created_at"],
        summary=summary,
        imported=True if row["imported"] else None,
    )
