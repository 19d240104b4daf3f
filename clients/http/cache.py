"""Plans kept on disk by the client (``cache_dir=``), so that a job restarting while the
service is down starts from the same plan.

Layout: ``plans/<plan_id>.json`` (the plan's canonical bytes), ``plans/<plan_id>.unverified``
(empty: the service said the plan's solver report is unverified, an imported plan;
``fetched.py``), ``requests/<plan_id>.json`` (the request it was made for),
``aliases/<name>.json`` (the plan an alias last resolved to, its version and when). Every
file is written whole or not at all (a temporary file in the same folder, fsynced, then
renamed over the name), so a job killed mid-write leaves either the old file or none.
Every read is checked again: a plan must hash to the id it is filed under, and a request
to its plan's ``request_hash``. A file that fails is moved aside (``*.corrupt``) and
treated as absent, so the next fetch replaces it.

Plans never change, so a cached plan is as good as the service's. What the service says
of a plan's solver report can (an imported plan the planner then makes is its own): the
mark follows the last answer that served the plan, and is written before the plan, so a
plan is never read back as verified when the service said otherwise. An alias can move, so
its entry is only a record of the last answer (see ``PlannerClient.resolve``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from clients.http.fetched import FetchedPlan
from clients.http.integrity import PLAN_ID, content_address
from planner_service.plan.canonical import canonical_bytes
from planner_service.plan.codec import parse_plan, parse_request, request_hash
from planner_service.plan.types import PlanRequest, ShardingPlan

log = logging.getLogger("shardplan.client")
T = TypeVar("T")


@dataclass(frozen=True)
class CachedAlias:
    plan_id: str
    version: int | None
    resolved_at: str  # ISO 8601, UTC: when the service last said so


class DiskCache:
    """Verified plans, their requests and alias answers under ``directory``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        for folder in ("plans", "requests", "aliases"):
            (self.directory / folder).mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------------ plans

    def plan(self, plan_id: str) -> ShardingPlan | None:
        """The cached plan filed under ``plan_id``, if there is one and it is intact."""
        path = self._path("plans", plan_id)

        def damage(plan: ShardingPlan) -> str | None:
            intact = content_address(plan) == plan.plan_id == plan_id
            return None if intact else f"its content does not hash to {plan_id}"

        return self._load(path, lambda data: parse_plan(data, source=str(path)), damage)

    def fetched(self, plan_id: str) -> FetchedPlan | None:
        """The cached plan filed under ``plan_id`` with what the service last said of its
        solver report."""
        plan = self.plan(plan_id)
        if plan is None:
            return None
        verified = not self._unverified_mark(plan_id).exists()
        return FetchedPlan(plan=plan, solver_report_verified=verified)

    def put_plan(self, plan: ShardingPlan, *, solver_report_verified: bool = True) -> None:
        """File a verified plan under its id (once: plans never change), marked unverified
        when the service said its solver report is."""
        mark = self._unverified_mark(plan.plan_id)
        if not solver_report_verified:
            if not mark.exists():
                write_atomically(mark, b"")
        else:
            mark.unlink(missing_ok=True)
        path = self._path("plans", plan.plan_id)
        if not path.exists():
            write_atomically(path, canonical_bytes(plan))

    def request(self, plan: ShardingPlan) -> PlanRequest | None:
        """The cached request ``plan`` was made for, if intact (its hash is the plan's)."""
        path = self._path("requests", plan.plan_id)

        def damage(request: PlanRequest) -> str | None:
            intact = request_hash(request) == plan.request_hash
            return None if intact else f"its hash is not the plan's {plan.request_hash}"

        return self._load(path, lambda data: parse_request(data, source=str(path)), damage)

    def put_request(self, plan: ShardingPlan, request: PlanRequest) -> None:
        write_atomically(self._path("requests", plan.plan_id), canonical_bytes(request))

    # ------------------------------------------------------------------------ aliases

    def alias(self, name: str) -> CachedAlias | None:
        return self._load(self._path("aliases", name), _alias_record, lambda record: None)

    def put_alias(self, name: str, plan_id: str, version: int | None) -> CachedAlias:
        now = utc_now()
        record = CachedAlias(plan_id, version, now)
        document = {"plan_id": plan_id, "version": version, "resolved_at": now}
        write_atomically(self._path("aliases", name), canonical_bytes(document))
        return record

    # ------------------------------------------------------------------------ files

    def _path(self, folder: str, name: str) -> Path:
        return self.directory / folder / f"{name}.json"  # names are checked by the caller

    def _unverified_mark(self, plan_id: str) -> Path:
        return self._path("plans", plan_id).with_suffix(".unverified")

    def _load(
        self, path: Path, read: Callable[[bytes], T], damage: Callable[[T], str | None]
    ) -> T | None:
        """``read`` of the file at ``path``; None when there is none, or when it cannot be
        read or ``damage`` finds something wrong with it (then it is moved aside)."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            value = read(data)
        except ValueError as error:  # InputError, JSONDecodeError, a bad record
            self._discard(path, f"unreadable: {error}")
            return None
        problem = damage(value)
        if problem is not None:
            self._discard(path, problem)
            return None
        return value

    @staticmethod
    def _discard(path: Path, why: str) -> None:
        log.warning("cached %s is unusable: %s; moved aside, it will be fetched again", path, why)
        with contextlib.suppress(OSError):
            os.replace(path, path.with_suffix(".corrupt"))


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _alias_record(data: bytes) -> CachedAlias:
    record = json.loads(data)
    if not (
        isinstance(record, dict)
        and isinstance(record.get("plan_id"), str)
        and PLAN_ID.fullmatch(record["plan_id"])  # it names a file: nothing else
        and isinstance(record.get("version"), int | None)
        and isinstance(record.get("resolved_at"), str)
    ):
        raise ValueError("not an alias record")
    return CachedAlias(record["plan_id"], record["version"], record["resolved_at"])


def write_atomically(path: Path, data: bytes, mode: int | None = None) -> None:
    """``data`` at ``path``, whole or not at all, and durable once this returns; readable
    by this user only (the temporary file's 0o600), or with permission bits ``mode``."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "wb") as file:
            if mode is not None:
                os.fchmod(file.fileno(), mode)
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX); not possible everywhere, so best effort."""
    with contextlib.suppress(OSError):
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
