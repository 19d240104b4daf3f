"""Stored device profiles (``shardplan calibrate``'s coefficients): inserted once by
``profile_id`` (the sha256 of their canonical JSON, ``plan.types.profile_id_of``) as those
canonical bytes, never updated or deleted, so a profile named by id in a plan request is
the one that was measured.

The store keeps bytes and does not read them: the route checks a profile and computes its
address before ``put``, as it does for plans.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner_service.plan.types import ComputeDevice
from planner_service.service.store.database import Database, now


@dataclass(frozen=True)
class StoredProfile:
    profile_id: str
    compute_device: ComputeDevice
    profile: bytes  # canonical JSON
    created_at: str


class Profiles:
    """The ``profiles`` table's operations."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def put(self, *, profile_id: str, compute_device: ComputeDevice, profile: bytes) -> bool:
        """Insert a profile once; True when this call stored it, False when it already was
        (the same id, so the same bytes). Returns after the commit."""
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                self.database.sql(
                    "INSERT INTO profiles (profile_id, compute_device, profile, created_at) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (profile_id) DO NOTHING"
                ),
                (profile_id, compute_device.value, profile, now()),
            )
            return bool(cursor.rowcount == 1)

    def get(self, profile_id: str) -> StoredProfile | None:
        with self.database.transaction() as cursor:
            cursor.execute(
                self.database.sql(
                    "SELECT profile_id, compute_device, profile, created_at FROM profiles "
                    "WHERE profile_id = ?"
                ),
                (profile_id,),
            )
            row = cursor.fetchone()
        if row is None:
            return None
        stored_id, device, data, created_at = row
        return StoredProfile(stored_id, ComputeDevice(device), bytes(data), created_at)
