"""The plan store, run against a real SQLite file and a real PostgreSQL server."""

from __future__ import annotations

import gzip
import json
import sqlite3
import threading
from contextlib import closing

import pytest
import zstandard

from planner_service.plan.api import PlanSummary, SolveJobStatus
from planner_service.plan.types import ComputeDevice
from planner_service.service.store import (
    NewPlan,
    NewSolve,
    PlanBodies,
    StoreUnavailableError,
    UnknownPlanError,
    gzip_plan,
    open_store,
    zstd_plan,
)
from planner_service.service.store.plans import ids_in_range_sql

QUEUED, RUNNING, DONE, FAILED = (
    SolveJobStatus.QUEUED,
    SolveJobStatus.RUNNING,
    SolveJobStatus.DONE,
    SolveJobStatus.FAILED,
)
CPU, CUDA = ComputeDevice.CPU, ComputeDevice.CUDA
SUMMARY = PlanSummary(world_size=2, num_tables=1, objective=1.5, status="optimal")


def _put(
    store,
    plan_id: str,
    request_hash: str = "r" * 64,
    data: bytes = b"{}",
    summary: PlanSummary = SUMMARY,
) -> bool:
    return store.plans.put(
        plan_id=plan_id,
        request_hash=request_hash,
        planner_version="v1",
        request=b'{"req":1}',
        plan=data,
        summary=summary,
    )


def _count_plans(url: str) -> int:
    """Rows in the plans table, read past the store."""
    row = fetch_one(url, "SELECT COUNT(*) FROM plans")
    assert row is not None
    return int(row[0])


def fetch_one(url: str, statement: str, *arguments: object) -> tuple | None:
    """The first row of one statement whose parameters are written ``{0}``, read past the
    store."""
    if url.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(url) as connection:
            return connection.execute(statement.format("%s"), arguments).fetchone()
    with closing(sqlite3.connect(url)) as connection:
        return connection.execute(statement.format("?"), arguments).fetchone()


@pytest.fixture
def store(store_url):
    opened = open_store(store_url)
    yield opened
    opened.close()


def test_plans_are_inserted_once_and_never_changed(store, store_url):
    assert _put(store, "a" * 64, data=b'{"x":1}') is True
    assert _put(store, "a" * 64, data=b'{"x":2}') is False  # same id: the first stays
    stored = store.plans.get("a" * 64)
    assert stored.plan == b'{"x":1}' and stored.request == b'{"req":1}'
    assert store.plans.get("b" * 64) is None
    assert _count_plans(store_url) == 1


def test_plan_for_request_matches_hash_and_planner_version(store):
    _put(store, "a" * 64, request_hash="1" * 64)
    assert store.plans.for_request("1" * 64, "v1") == "a" * 64
    assert store.plans.for_request("1" * 64, "v2") is None
    assert store.plans.for_request("2" * 64, "v1") is None


def test_alias_history_records_every_change(store):
    _put(store, "a" * 64)
    _put(store, "b" * 64)
    first = store.aliases.set("prod", "a" * 64, actor="ci")
    second = store.aliases.set("prod", "b" * 64, actor="alice", comment="new model")
    third = store.aliases.set("prod", "a" * 64, actor="bob", comment="roll back")
    assert (first.version, second.version, third.version) == (1, 2, 3)
    assert store.aliases.get("prod").plan_id == "a" * 64
    history = store.aliases.history("prod")
    assert [(c.version, c.plan_id, c.previous_plan_id, c.actor) for c in history] == [
        (3, "a" * 64, "b" * 64, "bob"),
        (2, "b" * 64, "a" * 64, "alice"),
        (1, "a" * 64, None, "ci"),
    ]
    assert history[0].comment == "roll back"
    assert store.aliases.get("nope") is None and store.aliases.history("nope") == []


def test_alias_to_unknown_plan_is_refused_and_changes_nothing(store):
    _put(store, "a" * 64)
    store.aliases.set("prod", "a" * 64, actor="ci")
    with pytest.raises(UnknownPlanError):
        store.aliases.set("prod", "f" * 64, actor="ci")
    assert store.aliases.get("prod").plan_id == "a" * 64
    assert len(store.aliases.history("prod")) == 1


def test_concurrent_alias_changes_get_consecutive_versions(store):
    for index in range(4):
        _put(store, str(index) * 64)
    errors = []

    def flip(worker: int) -> None:
        try:
            for step in range(10):
                store.aliases.set("hot", str((worker + step) % 4) * 64, actor=f"w{worker}")
        except Exception as error:  # surfaced by the assert below
            errors.append(error)

    threads = [threading.Thread(target=flip, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    versions = [change.version for change in store.aliases.history("hot")]
    assert versions == list(range(40, 0, -1))
    assert store.aliases.get("hot").version == 40


def test_profiles_are_inserted_once_by_id_and_never_changed(store, store_url):
    assert store.profiles.put(profile_id="a" * 64, compute_device=CPU, profile=b'{"x":1}')
    assert not store.profiles.put(profile_id="a" * 64, compute_device=CUDA, profile=b'{"x":2}')
    stored = store.profiles.get("a" * 64)
    assert (stored.profile_id, stored.compute_device, stored.profile) == ("a" * 64, CPU, b'{"x":1}')
    assert stored.created_at.endswith("+00:00")
    assert store.profiles.get("b" * 64) is None
    assert fetch_one(store_url, "SELECT COUNT(*) FROM profiles") == (1,)
    reopened = open_store(store_url)
    try:
        assert reopened.profiles.get("a" * 64) == stored
    finally:
        reopened.close()


def test_data_survives_reopening(store_url):
    first = open_store(store_url)
    _put(first, "c" * 64, data=b"[1]")
    first.close()
    second = open_store(store_url)
    assert second.plans.get("c" * 64).plan == b"[1]"
    second.close()


def test_unreachable_store_is_a_clear_error(tmp_path, postgres):
    with pytest.raises(StoreUnavailableError, match="SQLite"):
        open_store(str(tmp_path))  # a directory, not a database file
    closed_port = postgres.url().replace(f":{postgres.port}/", ":1/")
    with pytest.raises(StoreUnavailableError, match="PostgreSQL"):
        open_store(closed_port)


def test_plans_are_listed_newest_first_in_pages_that_do_not_shift(store):
    ids = [f"{index:x}" * 64 for index in range(1, 6)]
    for index, plan_id in enumerate(ids):
        _put(store, plan_id, summary=SUMMARY.model_copy(update={"world_size": index + 1}))
    first = store.plans.page(limit=2)
    assert [row.plan_id for row in first] == ids[:-3:-1]  # the two newest
    assert first[0].summary == SUMMARY.model_copy(update={"world_size": 5})
    assert first[0].planner_version == "v1" and first[0].created_at >= first[1].created_at
    _put(store, "f" * 64)  # stored meanwhile: ahead of the cursor, so not in later pages
    cursor = (first[-1].created_at, first[-1].plan_id)
    second = store.plans.page(limit=2, before=cursor)
    assert [row.plan_id for row in second] == [ids[2], ids[1]]
    last = store.plans.page(limit=2, before=(second[-1].created_at, second[-1].plan_id))
    assert [row.plan_id for row in last] == [ids[0]]
    assert store.plans.page(limit=10)[0].plan_id == "f" * 64


def test_plans_stored_in_the_same_microsecond_are_ordered_by_id(store):
    for plan_id in ("a" * 64, "b" * 64, "c" * 64):
        _put(store, plan_id)
    with store.database.transaction(write=True) as cursor:  # one timestamp for all three
        cursor.execute("UPDATE plans SET created_at = '2026-01-01T00:00:00.000000+00:00'")
    first = store.plans.page(limit=1)
    assert first[0].plan_id == "c" * 64
    rest = store.plans.page(limit=5, before=(first[0].created_at, first[0].plan_id))
    assert [row.plan_id for row in rest] == ["b" * 64, "a" * 64]


def test_aliases_are_listed_by_name_bytewise_with_their_last_change(store):
    _put(store, "a" * 64)
    _put(store, "b" * 64)
    for name in ("b.x", "B-1", "a_1", "a-1"):
        store.aliases.set(name, "a" * 64, actor="ci")
    store.aliases.set("b.x", "b" * 64, actor="alice", comment="moved")
    listed = store.aliases.page(limit=10)
    assert [alias.name for alias in listed] == ["B-1", "a-1", "a_1", "b.x"]  # bytewise
    moved = listed[-1]
    assert (moved.plan_id, moved.version, moved.actor, moved.comment) == (
        "b" * 64,
        2,
        "alice",
        "moved",
    )
    assert moved.previous_plan_id == "a" * 64
    assert [alias.name for alias in store.aliases.page(limit=2, after="a-1")] == ["a_1", "b.x"]
    assert store.aliases.page(limit=2, after="b.x") == []


_OLD_PLANS_TABLE = (
    "CREATE TABLE plans (plan_id TEXT PRIMARY KEY, request_hash TEXT NOT NULL, "
    "planner_version TEXT NOT NULL, request {blob} NOT NULL, plan {blob} NOT NULL, "
    "created_at TEXT NOT NULL)"
)


def test_a_store_made_before_summaries_gets_them_from_its_plans(store_url):
    """The plans table as the first release made it, with a plan in it: opening the store
    adds the summary columns and fills them from the plan."""
    plan = b'{"world_size": 4, "tables": {"a": {}, "b": {}}, "solver": {"objective": 2.5, "status": "feasible"}}'
    row = ("d" * 64, "r" * 64, "v0", b"{}", plan, "2026-01-01T00:00:00.000000+00:00")
    if store_url.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(store_url) as connection:
            connection.execute(_OLD_PLANS_TABLE.format(blob="BYTEA"))
            connection.execute("INSERT INTO plans VALUES (%s, %s, %s, %s, %s, %s)", row)
    else:
        with closing(sqlite3.connect(store_url)) as connection, connection:
            connection.execute(_OLD_PLANS_TABLE.format(blob="BLOB"))
            connection.execute("INSERT INTO plans VALUES (?, ?, ?, ?, ?, ?)", row)
    opened = open_store(store_url)
    try:
        [listed] = opened.plans.page(limit=5)
        assert listed.summary == PlanSummary(
            world_size=4, num_tables=2, objective=2.5, status="feasible"
        )
        assert listed.planner_version == "v0"
        assert opened.plans.get("d" * 64).plan == plan
        # ... gzip and zstd columns, NULL for this plan until its first fetch encodes and
        # stores it,
        assert _stored(store_url, "d" * 64, "gzip") is None
        assert _stored(store_url, "d" * 64, "zstd") is None
        expected = PlanBodies(plan, gzip_plan(plan), zstd_plan(plan))
        assert opened.plans.bodies("d" * 64) == expected
        assert _stored(store_url, "d" * 64, "gzip") == gzip_plan(plan)
        assert _stored(store_url, "d" * 64, "zstd") == zstd_plan(plan)
        assert opened.plans.bodies("d" * 64) == expected
        # ... and the solves table that async jobs need.
        assert opened.jobs.get("j" * 64) is None
        assert opened.jobs.claim(
            "j" * 64, owner="a", now="1", stale_before="0", max_attempts=3, new=_new_solve()
        )[1]
        # ... and the profiles table that calibrated plans name profiles from.
        assert opened.profiles.get("p" * 64) is None
        assert opened.profiles.put(profile_id="p" * 64, compute_device=CPU, profile=b"{}")
    finally:
        opened.close()


def test_a_store_with_gzip_but_not_zstd_keeps_its_gzip_and_gains_zstd(store, store_url):
    """A store the previous release made (gzip stored, no zstd column yet) is simulated by
    blanking the zstd column: the first fetch encodes zstd and stores it, and keeps the
    gzip bytes it had, even ones this zlib would not make."""
    plan = json.dumps({"tables": {f"t{i}": {"rank": i % 4} for i in range(50)}}).encode()
    _put(store, "c" * 64, data=plan)
    older_gzip = gzip.compress(plan, compresslevel=9, mtime=0)
    assert older_gzip != gzip_plan(plan)
    _execute(store_url, "UPDATE plans SET plan_gzip = {0}, plan_zstd = NULL WHERE plan_id = {0}",
             older_gzip, "c" * 64)  # fmt: skip
    assert store.plans.bodies("c" * 64) == PlanBodies(plan, older_gzip, zstd_plan(plan))
    assert _stored(store_url, "c" * 64, "zstd") == zstd_plan(plan)
    assert _stored(store_url, "c" * 64, "gzip") == older_gzip


def _execute(url: str, statement: str, *arguments: object) -> None:
    """Runs one statement whose parameters are written ``{0}``."""
    if url.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(url) as connection:
            connection.execute(statement.format("%s"), arguments)
    else:
        with closing(sqlite3.connect(url)) as connection, connection:
            connection.execute(statement.format("?"), arguments)


def _stored(url: str, plan_id: str, coding: str) -> bytes | None:
    row = fetch_one(url, f"SELECT plan_{coding} FROM plans WHERE plan_id = {{0}}", plan_id)
    assert row is not None
    return None if row[0] is None else bytes(row[0])


def test_a_plan_is_stored_with_its_gzip_and_zstd_encodings(store, store_url):
    plan = json.dumps({"tables": {f"t{i}": {"rank": i % 4} for i in range(200)}}).encode()
    _put(store, "e" * 64, data=plan)
    gzipped = _stored(store_url, "e" * 64, "gzip")
    assert gzipped is not None and gzip.decompress(gzipped) == plan
    assert len(gzipped) < len(plan) // 4
    zstd = _stored(store_url, "e" * 64, "zstd")
    assert zstd is not None and zstandard.ZstdDecompressor().decompress(zstd) == plan
    assert len(zstd) < len(plan) // 4
    assert store.plans.bodies("e" * 64) == PlanBodies(plan, gzipped, zstd)
    assert store.plans.bodies("f" * 64) is None


def test_gzip_encoding_is_the_same_bytes_every_time():
    """mtime 0 and a fixed level: every replica encodes a plan to the same bytes."""
    plan = b'{"plan_id": "x", "tables": {}}' * 50
    first = gzip_plan(plan)
    assert first == gzip_plan(bytes(plan))
    assert first[4:8] == b"\0\0\0\0"  # RFC 1952 MTIME: none
    assert gzip.decompress(first) == plan


def test_zstd_encoding_is_the_same_bytes_every_time_and_checks_its_content():
    plan = b'{"plan_id": "x", "tables": {}}' * 50
    first = zstd_plan(plan)
    assert first == zstd_plan(bytes(plan))
    assert zstandard.ZstdDecompressor().decompress(first) == plan
    damaged = bytearray(first)
    damaged[-1] ^= 0xFF  # the content checksum (the frame's last four bytes)
    with pytest.raises(zstandard.ZstdError):
        zstandard.ZstdDecompressor().decompress(bytes(damaged))


# --------------------------------------------------------------------------- solves (jobs)


def _new_solve(job_id: str = "j" * 64) -> NewSolve:
    return NewSolve(job_id, "r" * 64, "v1", b'{"req":1}', 5.0)


def _claim(store, owner: str, now: str, stale_before: str, new=None, max_attempts: int = 3):
    return store.jobs.claim(
        "j" * 64, owner=owner, now=now, stale_before=stale_before, max_attempts=max_attempts,
        new=new,
    )  # fmt: skip


def test_a_solve_is_claimed_once_then_taken_over_when_its_lease_lapses(store):
    row, claimed = _claim(store, "a", "2026-01-01T00:00:00", "2025", new=_new_solve())
    assert claimed and (row.status, row.owner, row.attempts) == (QUEUED, "a", 1)
    assert store.jobs.request("j" * 64) == b'{"req":1}'
    # Asked again while its lease is live: not taken, wherever it is asked.
    row, claimed = _claim(store, "b", "2026-01-01T00:00:01", "2025", new=_new_solve())
    assert not claimed and row.owner == "a"
    assert store.jobs.record_progress(
        "j" * 64, "a", running=True, stage="cp-sat", objective=2.0, bound=1.5,
        started_at="2026-01-01T00:00:01", now="2026-01-01T00:00:02",
    )  # fmt: skip
    running = store.jobs.get("j" * 64)
    assert (running.status, running.stage, running.objective, running.lower_bound) == (
        RUNNING, "cp-sat", 2.0, 1.5,
    )  # fmt: skip
    assert store.jobs.to_take("2026-01-01T00:00:02", 10) == []
    assert store.jobs.to_take("2026-01-01T00:00:03", 10) == ["j" * 64]
    # Lapsed: b takes it over; a can no longer record progress on it.
    row, claimed = _claim(store, "b", "2026-01-01T00:01:00", "2026-01-01T00:00:03")
    assert claimed and (row.status, row.owner, row.attempts, row.stage) == (QUEUED, "b", 2, None)
    assert not store.jobs.record_progress(
        "j" * 64, "a", running=True, stage="x", objective=None, bound=None, started_at=None,
        now="2026-01-01T00:01:01",
    )  # fmt: skip
    store.jobs.end(
        "j" * 64, DONE, plan_id="p" * 64, problem=None, progress=("cp-sat", 1.9, 1.6),
        now="2026-01-01T00:01:05",
    )  # fmt: skip
    done = store.jobs.get("j" * 64)
    assert (done.status, done.plan_id, done.objective, done.active) == (
        DONE,
        "p" * 64,
        1.9,
        False,
    )
    assert store.jobs.to_take("9999", 10) == []
    row, claimed = _claim(store, "c", "2026-01-02", "9999", new=_new_solve())
    assert not claimed and row.status is DONE


def test_a_failed_solve_is_claimed_again_and_a_lapsing_one_gives_up(store):
    _claim(store, "a", "2026-01-01T00:00:00", "2025", new=_new_solve())
    store.jobs.end("j" * 64, FAILED, plan_id=None, problem=b'{"status": 503}', now="2026-01-01")
    failed = store.jobs.get("j" * 64)
    assert failed.problem == b'{"status": 503}'
    row, claimed = _claim(store, "b", "2026-01-02", "2025", new=_new_solve())
    assert claimed and (row.status, row.attempts, row.problem) == (QUEUED, 1, None)
    # Its process stops before it ends, again and again: after max_attempts it fails.
    for attempt in (2, 3):
        row, claimed = _claim(store, "c", f"2026-01-0{attempt + 1}", "9999")
        assert claimed and row.attempts == attempt
    row, claimed = _claim(store, "c", "2026-01-05", "9999")
    assert not claimed and row.status is FAILED
    assert json.loads(row.problem)["title"] == "Solve abandoned"


def test_released_solves_lapse_at_once_and_done_solves_are_recorded_as_done(store):
    _claim(store, "a", "2026-01-01T00:00:00", "2025", new=_new_solve())
    store.jobs.renew("a", "2026-01-01T00:05:00")
    assert store.jobs.get("j" * 64).heartbeat_at == "2026-01-01T00:05:00"
    store.jobs.release("a")
    assert store.jobs.to_take("0", 10) == ["j" * 64]  # before any time at all
    done = store.jobs.add_done(_new_solve("k" * 64), "p" * 64, "2026-01-01")
    assert (done.status, done.plan_id, done.attempts) == (DONE, "p" * 64, 0)
    marked = store.jobs.add_done(_new_solve(), "q" * 64, "2026-01-02")
    assert (marked.status, marked.plan_id) == (DONE, "q" * 64)
    again = store.jobs.add_done(_new_solve(), "z" * 64, "2026-01-03")  # done already: kept
    assert (again.plan_id, again.updated_at) == ("q" * 64, "2026-01-02")


def test_a_job_row_holds_its_status_value_and_reads_back_by_column_name(store, store_url):
    _claim(store, "a", "2026-01-01T00:00:00", "2025", new=_new_solve())
    store.jobs.record_progress(
        "j" * 64, "a", running=True, stage="cp-sat", objective=2.0, bound=1.5,
        started_at="2026-01-01T00:00:01", now="2026-01-01T00:00:02",
    )  # fmt: skip
    row = fetch_one(store_url, "SELECT status FROM solves WHERE job_id = {0}", "j" * 64)
    assert row == ("running",)  # the enum's value in SQL ...
    stored = store.jobs.get("j" * 64)
    assert stored.status is RUNNING and stored.active  # ... the enum in the code
    assert stored.model_dump() == {
        "job_id": "j" * 64, "request_hash": "r" * 64, "planner_version": "v1",
        "time_limit_s": 5.0, "status": RUNNING, "stage": "cp-sat", "objective": 2.0,
        "lower_bound": 1.5, "attempts": 1, "owner": "a", "heartbeat_at": "2026-01-01T00:00:02",
        "created_at": "2026-01-01T00:00:00", "started_at": "2026-01-01T00:00:01",
        "updated_at": "2026-01-01T00:00:02", "plan_id": None, "problem": None,
    }  # fmt: skip


def test_plan_ids_by_prefix_are_the_ids_that_start_with_it_in_id_order(store):
    ids = ["0123abcf" + "0" * 56, "0123abcf" + "9" * 56, "0123abd0" + "0" * 56, "f" * 64]
    for plan_id in reversed(ids):
        _put(store, plan_id)
    found = store.plans.ids_starting_with
    assert found("0123abcf", limit=11) == ids[:2]
    assert found("0123abcf9", limit=11) == [ids[1]]
    assert found("0123abc", limit=11) == ids[:2]  # not 0123abd0: the bound is exclusive
    assert found("0123ab", limit=1) == ids[:1]
    assert found("ffffffff", limit=11) == [ids[3]]  # a prefix of f's has no upper bound
    assert found(ids[2], limit=11) == [ids[2]]
    assert found("0123abce", limit=11) == []


def test_the_prefix_query_is_a_range_scan_of_the_primary_key(store, store_url):
    """Resolving a prefix reads the index, not the table: the planner of each database says
    so for the store's own statement (PostgreSQL with sequential scans priced out, as a
    table of millions of plans would price them; on a few rows it would scan them)."""
    for index in range(20):
        _put(store, f"{index:02x}" * 32)
    for bounded in (True, False):
        statement = store.database.sql(ids_in_range_sql(bounded=bounded))
        arguments = ("0a0a0a0a", "0a0a0a0b")[: 2 if bounded else 1] + (11,)
        with store.database.transaction() as cursor:
            if store_url.startswith("postgresql://"):
                cursor.execute("SET LOCAL enable_seqscan = off")
                cursor.execute(f"EXPLAIN {statement}", arguments)
                plan = " ".join(str(row[0]) for row in cursor.fetchall())
                assert "Index Only Scan using plans_pkey" in plan, plan
                assert "Index Cond: " in plan and "plan_id >= '0a0a0a0a'" in plan, plan
            else:
                cursor.execute(f"EXPLAIN QUERY PLAN {statement}", arguments)
                plan = " ".join(str(row[-1]) for row in cursor.fetchall())
                bound = "plan_id>? AND plan_id<?" if bounded else "plan_id>?"
                assert f"USING COVERING INDEX sqlite_autoindex_plans_1 ({bound})" in plan, plan


# --------------------------------------------------------------------------- one planner plan per key


def _put_planned(store, plan_id: str, request_hash: str = "r" * 64, data: bytes = b"{}"):
    return store.plans.put_planned(
        NewPlan(plan_id, request_hash, "v1", b'{"req":1}', data, SUMMARY)
    )


def test_a_key_holds_one_planner_plan_and_a_second_gets_the_first(store, store_url):
    first = _put_planned(store, "a" * 64, data=b'{"a":1}')
    assert (first.plan_id, first.inserted) == ("a" * 64, True)
    # A second solve of the same request (a resumed job, another replica): not stored,
    # answered with the first.
    second = _put_planned(store, "b" * 64, data=b'{"b":1}')
    assert (second.plan_id, second.inserted) == ("a" * 64, False)
    assert store.plans.get("b" * 64) is None and _count_plans(store_url) == 1
    assert store.plans.for_request("r" * 64, "v1") == "a" * 64
    # Another planner version, another request: keys of their own.
    assert _put_planned(store, "c" * 64, request_hash="s" * 64).inserted
    # An imported plan of the key is stored, and answers no request while the key holds
    # a planner plan; an imported one answers a key with none.
    assert _put(store, "d" * 64) is True
    assert store.plans.for_request("r" * 64, "v1") == "a" * 64
    _put(store, "e" * 64, request_hash="t" * 64)
    assert store.plans.for_request("t" * 64, "v1") == "e" * 64


def test_planner_plans_of_one_key_stored_at_once_are_one(store, store_url):
    """Eight writers (threads: the replicas of a shared store) store eight different plans
    for one key at once: one is stored, and every writer is answered with it."""
    answers: list[str] = []
    barrier = threading.Barrier(8)

    def write(index: int) -> None:
        barrier.wait()
        answers.append(_put_planned(store, f"{index:064x}", data=b"{}").plan_id)

    threads = [threading.Thread(target=write, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(answers)) == 1 and len(answers) == 8
    assert _count_plans(store_url) == 1
    assert store.plans.for_request("r" * 64, "v1") == answers[0]


def test_an_older_store_with_two_plans_for_one_key_keeps_the_first(store_url):
    """A store made before ``planner_plans`` (simulated by dropping it), holding two plans
    of one key, as a resumed job stored them, and a job naming the second: opened, the
    first answers the key, the second stays fetchable, and the job names the first."""
    opened = open_store(store_url)
    try:
        _put(opened, "b" * 64, data=b'{"first":1}')  # stored first ...
        _put(opened, "a" * 64, data=b'{"second":1}')  # ... a lower id stored later
        _put(opened, "c" * 64, request_hash="s" * 64)
        opened.jobs.claim(
            "j" * 64, owner="x", now="1", stale_before="0", max_attempts=3, new=_new_solve()
        )
        opened.jobs.end("j" * 64, DONE, plan_id="a" * 64, problem=None, now="2")
        with opened.database.transaction(write=True) as cursor:
            cursor.execute("DROP TABLE planner_plans")
    finally:
        opened.close()
    upgraded = open_store(store_url)
    try:
        assert upgraded.plans.for_request("r" * 64, "v1") == "b" * 64
        assert upgraded.plans.for_request("s" * 64, "v1") == "c" * 64
        assert upgraded.plans.get("a" * 64).plan == b'{"second":1}'  # kept, by id
        assert upgraded.jobs.get("j" * 64).plan_id == "b" * 64
        assert _put_planned(upgraded, "d" * 64).plan_id == "b" * 64
        assert fetch_one(store_url, "SELECT COUNT(*) FROM planner_plans") == (2,)
    finally:
        upgraded.close()
    reopened = open_store(store_url)  # filled once: a later open changes nothing
    try:
        assert fetch_one(store_url, "SELECT COUNT(*) FROM planner_plans") == (2,)
    finally:
        reopened.close()


# --------------------------------------------------------------------------- the job queue


def test_jobs_wait_in_a_bounded_queue_until_a_process_takes_them(store):
    from planner_service.service.store import JobQueueFullError

    for index, job_id in enumerate(("k" * 64, "m" * 64)):
        waiting = store.jobs.enqueue(_new_solve(job_id), now=f"2026-01-0{index + 1}", max_waiting=2)
        assert (waiting.status, waiting.owner, waiting.attempts) == (QUEUED, None, 0)
        assert waiting.waiting
    with pytest.raises(JobQueueFullError) as full:
        store.jobs.enqueue(_new_solve("n" * 64), now="2026-01-03", max_waiting=2)
    assert (full.value.waiting, full.value.time_limits_s) == (2, 10.0)
    assert store.jobs.get("n" * 64) is None
    # One already waiting is answered as it stands, full or not.
    assert store.jobs.enqueue(_new_solve("k" * 64), now="2026-01-04", max_waiting=2).waiting
    # Waiting jobs never lapse into attempts: they are taken in order of arrival, each
    # started once, whatever their age.
    assert store.jobs.to_take("2025", 10) == ["k" * 64, "m" * 64]
    row, claimed = store.jobs.claim(
        "k" * 64, owner="a", now="2026-02-01", stale_before="2026-01-31", max_attempts=1
    )
    assert claimed and (row.owner, row.attempts, row.waiting) == ("a", 1, False)
    assert store.jobs.to_take("2026-01-31", 10) == ["m" * 64]
    assert store.jobs.enqueue(_new_solve("n" * 64), now="2026-02-02", max_waiting=2).waiting


def test_an_imported_plan_reads_back_imported_until_the_planner_makes_it(store):
    """Every read that serves a plan says whether it was imported (its solver report the
    importer's word); the planner making the same plan, byte for byte, verifies it."""
    plan = b'{"imported":1}'
    assert store.plans.put(
        plan_id="f" * 64,
        request_hash="r" * 64,
        planner_version="v1",
        request=b'{"req":1}',
        plan=plan,
        summary=SUMMARY,
        imported=True,
    )
    _put(store, "a" * 64, data=b'{"planned":1}')
    stored, bodies = store.plans.get("f" * 64), store.plans.bodies("f" * 64)
    assert stored is not None and stored.imported
    assert bodies == PlanBodies(plan, gzip_plan(plan), zstd_plan(plan), imported=True)
    planner_made = store.plans.get("a" * 64)
    assert planner_made is not None and not planner_made.imported
    assert not store.plans.bodies("a" * 64).imported
    # The planner solves the request and makes the same bytes: one plan, no longer imported.
    planned = _put_planned(store, "f" * 64, data=plan)
    assert (planned.plan_id, planned.inserted) == ("f" * 64, False)
    assert not store.plans.get("f" * 64).imported
    assert not store.plans.bodies("f" * 64).imported
    assert store.plans.for_request("r" * 64, "v1") == "f" * 64
