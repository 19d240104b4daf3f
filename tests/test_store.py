"""The plan store, run against a real SQLite file and a real PostgreSQL server."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing

import pytest

from planner_service.service.store import StoreUnavailableError, UnknownPlanError, open_store


def _put(store, plan_id: str, request_hash: str = "r" * 64, data: bytes = b"{}") -> bool:
    return store.put_plan(
        plan_id=plan_id,
        request_hash=request_hash,
        planner_version="v1",
        request=b'{"req":1}',
        plan=data,
    )


def _count_plans(url: str) -> int:
    """Rows in the plans table, read past the store."""
    if url.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(url) as connection:
            row = connection.execute("SELECT COUNT(*) FROM plans").fetchone()
    else:
        with closing(sqlite3.connect(url)) as connection:
            row = connection.execute("SELECT COUNT(*) FROM plans").fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def store(store_url):
    opened = open_store(store_url)
    yield opened
    opened.close()


def test_plans_are_inserted_once_and_never_changed(store, store_url):
    assert _put(store, "a" * 64, data=b'{"x":1}') is True
    assert _put(store, "a" * 64, data=b'{"x":2}') is False  # same id: the first stays
    stored = store.get_plan("a" * 64)
    assert stored.plan == b'{"x":1}' and stored.request == b'{"req":1}'
    assert store.get_plan("b" * 64) is None
    assert _count_plans(store_url) == 1


def test_plan_for_request_matches_hash_and_planner_version(store):
    _put(store, "a" * 64, request_hash="1" * 64)
    assert store.plan_for_request("1" * 64, "v1") == "a" * 64
    assert store.plan_for_request("1" * 64, "v2") is None
    assert store.plan_for_request("2" * 64, "v1") is None


def test_alias_history_records_every_change(store):
    _put(store, "a" * 64)
    _put(store, "b" * 64)
    first = store.set_alias("prod", "a" * 64, actor="ci")
    second = store.set_alias("prod", "b" * 64, actor="alice", comment="new model")
    third = store.set_alias("prod", "a" * 64, actor="bob", comment="roll back")
    assert (first.version, second.version, third.version) == (1, 2, 3)
    assert store.get_alias("prod").plan_id == "a" * 64
    history = store.alias_history("prod")
    assert [(c.version, c.plan_id, c.previous_plan_id, c.actor) for c in history] == [
        (3, "a" * 64, "b" * 64, "bob"),
        (2, "b" * 64, "a" * 64, "alice"),
        (1, "a" * 64, None, "ci"),
    ]
    assert history[0].comment == "roll back"
    assert store.get_alias("nope") is None and store.alias_history("nope") == []


def test_alias_to_unknown_plan_is_refused_and_changes_nothing(store):
    _put(store, "a" * 64)
    store.set_alias("prod", "a" * 64, actor="ci")
    with pytest.raises(UnknownPlanError):
        store.set_alias("prod", "f" * 64, actor="ci")
    assert store.get_alias("prod").plan_id == "a" * 64
    assert len(store.alias_history("prod")) == 1


def test_concurrent_alias_changes_get_consecutive_versions(store):
    for index in range(4):
        _put(store, str(index) * 64)
    errors = []

    def flip(worker: int) -> None:
        try:
            for step in range(10):
                store.set_alias("hot", str((worker + step) % 4) * 64, actor=f"w{worker}")
        except Exception as error:  # surfaced by the assert below
            errors.append(error)

    threads = [threading.Thread(target=flip, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    versions = [change.version for change in store.alias_history("hot")]
    assert versions == list(range(40, 0, -1))
    assert store.get_alias("hot").version == 40


def test_data_survives_reopening(store_url):
    first = open_store(store_url)
    _put(first, "c" * 64, data=b"[1]")
    first.close()
    second = open_store(store_url)
    assert second.get_plan("c" * 64).plan == b"[1]"
    second.close()


def test_unreachable_store_is_a_clear_error(tmp_path, postgres):
    with pytest.raises(StoreUnavailableError, match="SQLite"):
        open_store(str(tmp_path))  # a directory, not a database file
    closed_port = postgres.url().replace(f":{postgres.port}/", ":1/")
    with pytest.raises(StoreUnavailableError, match="PostgreSQL"):
        open_store(closed_port)
