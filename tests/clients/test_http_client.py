"""The HTTP client against a real `shardplan serve` on loopback, directly and through a
real faulty proxy (tests/support/servers.py): normal flows for every method, servers that fail
first and then answer, a server that is down, a corrupted plan, and a restart served from
the cache. Every scenario runs with the blocking and with the asyncio client."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import zstandard

from clients.http import (
    AsyncPlannerClient,
    BadRequest,
    Conflict,
    FetchedPlan,
    Forbidden,
    IntegrityError,
    InvalidPlan,
    NoPlanFound,
    NotFound,
    Overloaded,
    PlannerClient,
    PlannerError,
    PlannerHTTPError,
    PlannerUnavailable,
    RetryPolicy,
    Unauthorized,
)
from clients.http.cache import DiskCache
from clients.http.integrity import sealed_plan, verified_plan
from clients.http.retry import retry_after_s
from planner_service.plan.canonical import canonical_bytes
from planner_service.plan.codec import parse_profile, parse_request, request_hash
from planner_service.plan.errors import InputError
from planner_service.plan.types import ShardingPlan, profile_id_of
from tests.service.test_plan_ids import put_rows
from tests.support import builders
from tests.support.builders import request, table
from tests.support.servers import Fault, FaultyProxy, Seen, free_port, started_service

pytestmark = pytest.mark.timeout(60)

TOKEN = "trainer-token-0123456789"
KINDS = ["sync", "async"]
FAST = {"backoff_s": 0.01, "max_backoff_s": 0.05, "max_retry_after_s": 2.0}


@pytest.fixture(scope="module")
def service(shardplan_exe, tmp_path_factory):
    directory = tmp_path_factory.mktemp("client-service")
    env = {"SHARDPLAN_API_TOKENS": f"trainer:{TOKEN}", "SHARDPLAN_MAX_WORLD_SIZE": "64"}
    server = started_service(shardplan_exe, directory, env)
    yield server
    server.stop()


class AsyncFacade:
    """An AsyncPlannerClient whose methods are called like PlannerClient's: each call is
    awaited on one event loop that lives as long as the client."""

    def __init__(self, base_url: str, **options: Any) -> None:
        self._runner = asyncio.Runner()
        self.client = AsyncPlannerClient(base_url, **options)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.client, name)
        return lambda *args, **kwargs: self._runner.run(method(*args, **kwargs))

    def close(self) -> None:
        self._runner.run(self.client.aclose())
        self._runner.close()


@pytest.fixture(params=KINDS)
def connect(request) -> Iterator[Any]:
    """``connect(base_url, **options)``: a client of the parametrized kind, closed after."""
    opened: list[Any] = []

    def make(base_url: str, **options: Any) -> Any:
        options = {"token": TOKEN, **FAST, **options}
        client = (
            PlannerClient(base_url, **options)
            if request.param == "sync"
            else AsyncFacade(base_url, **options)
        )
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.close()


def small(name: str, world_size: int = 2) -> dict[str, Any]:
    req = request([table(f"{name}1", rows=1000), table(f"{name}2", dim=32)], world_size=world_size)
    return json.loads(req.model_dump_json())


def made_elsewhere(name: str, **plan_fields: Any):
    """A request and a valid plan for it, made without the service: (request, plan)."""
    req = request([table(f"{name}1"), table(f"{name}2", dim=32)], world_size=2)
    tables = {
        f"{name}1": builders.table_wise(req, f"{name}1", 0),
        f"{name}2": builders.row_wise(req, f"{name}2"),
    }
    return req, builders.plan(req, tables, planner_version="offline-9.9", **plan_fields)


def unique(name: str) -> str:
    return f"{name}{random.getrandbits(32):08x}"


# --------------------------------------------------------------------------- normal flows


def test_create_get_request_check_and_validate(connect, service):
    client = connect(service.base)
    document = small(unique("flow"))
    plan = client.create_plan(document)
    assert plan.request_hash == request_hash(parse_request(json.dumps(document)))
    assert client.create_plan(parse_request(json.dumps(document))) == plan  # model or dict
    assert client.get_plan(plan.plan_id) == plan
    assert client.get_request(plan.plan_id) == parse_request(json.dumps(document))
    checked = client.check(document)
    assert (checked.fits, checked.stored, checked.plan_id) == (True, True, plan.plan_id)
    assert len(checked.ranks) == 2 and checked.min_hbm_free_bytes > 0
    assert client.validate(document, plan).valid is True
    broken = json.loads(canonical_bytes(plan))
    builders.move_shard(broken["tables"][document["tables"][0]["name"]], 0, 7)
    verdict = client.validate(document, broken)
    assert verdict.valid is False
    assert "plan_id_mismatch" in [violation.code for violation in verdict.violations]


def test_aliases_set_resolve_move_and_list(connect, service):
    client = connect(service.base)
    first = client.create_plan(small(unique("al")))
    second = client.create_plan(small(unique("al")))
    name = unique("job-")
    record = client.set_alias(name, first.plan_id, comment="first")
    assert (record.version, record.plan_id, record.actor, record.comment) == (
        1,
        first.plan_id,
        "trainer",
        "first",
    )
    resolved = client.resolve(name)
    assert (resolved.plan, resolved.stale, resolved.version) == (first, False, 1)
    client.set_alias(name, second.plan_id)
    moved = client.resolve(name)
    assert (moved.plan_id, moved.version, moved.stale) == (second.plan_id, 2, False)
    names, after = [], None
    while True:
        page = client.list_aliases(limit=1, after=after)
        names += [alias.name for alias in page.aliases]
        if page.next is None:
            break
        after = page.next
    assert name in names and names == sorted(names, key=str.encode)


def test_import_plan_201_200_409_422(connect, service):
    client = connect(service.base)
    req, plan = made_elsewhere(unique("imp"))
    created = client.import_plan(req, plan)
    assert (created.plan, created.created) == (plan, True)
    again = client.import_plan(json.loads(req.model_dump_json()), json.loads(canonical_bytes(plan)))
    assert (again.plan, again.created) == (plan, False)
    assert client.get_plan(plan.plan_id) == plan

    edited = json.loads(canonical_bytes(plan))
    edited["rank_stats"]["hbm_bytes"][0] += 1  # content changed, plan_id kept
    with pytest.raises(Conflict) as conflict:
        client.import_plan(req, edited)
    assert conflict.value.status == 409 and conflict.value.plan_id == plan.plan_id
    assert conflict.value.computed_plan_id != plan.plan_id  # problem members as attributes
    assert plan.plan_id in str(conflict.value)

    lying_req, lying = made_elsewhere(unique("inv"), hbm_bytes=[1, 1])
    with pytest.raises(InvalidPlan) as invalid:
        client.import_plan(lying_req, lying)
    assert invalid.value.status == 422 and invalid.value.title == "Invalid plan"
    assert {violation.code for violation in invalid.value.violations} == {"rank_stats"}
    with pytest.raises(NotFound):
        client.get_plan(lying.plan_id)


def test_an_imported_plan_is_said_unverified_from_the_service_and_from_the_cache(
    connect, service, tmp_path
):
    req, plan = made_elsewhere(unique("unv"))
    client = connect(service.base, cache_dir=tmp_path / "importer")
    assert client.import_plan(req, plan).solver_report_verified is False
    assert client.fetch_plan(plan.plan_id).solver_report_verified is False  # from its cache
    alias = unique("unv-")
    client.set_alias(alias, plan.plan_id)
    cache = tmp_path / "job"
    job = connect(service.base, cache_dir=cache)
    for fetched in (job.fetch_plan(plan.plan_id), job.fetch_plan(plan.plan_id[:12])):
        assert (fetched.plan, fetched.solver_report_verified) == (plan, False)
    assert job.resolve(alias).solver_report_verified is False
    with FaultyProxy(service.base) as proxy:  # a 304 says it too
        assert connect(proxy.base, cache_dir=cache).resolve(alias).solver_report_verified is False
    assert proxy.answered == [304]
    down = connect(f"http://127.0.0.1:{free_port()}", cache_dir=cache, retries=0)
    assert down.fetch_plan(plan.plan_id).solver_report_verified is False
    assert down.resolve(alias, allow_stale_alias=True).solver_report_verified is False
    # The planner's own plan: vouched for, by the service and by the cache.
    own = job.create_plan(small(unique("own")))
    assert job.fetch_plan(own.plan_id).solver_report_verified is True
    assert down.fetch_plan(own.plan_id) == FetchedPlan(plan=own, solver_report_verified=True)


def test_the_cache_marks_a_plan_as_the_service_last_said(tmp_path):
    plan, _ = _sealed_example()
    cache = DiskCache(tmp_path)
    cache.put_plan(plan, solver_report_verified=False)
    assert cache.fetched(plan.plan_id) == FetchedPlan(plan=plan, solver_report_verified=False)
    assert (tmp_path / "plans" / f"{plan.plan_id}.unverified").exists()
    cache.put_plan(plan)  # the planner made the same plan since
    assert cache.fetched(plan.plan_id) == FetchedPlan(plan=plan, solver_report_verified=True)
    assert [path.name for path in (tmp_path / "plans").iterdir()] == [f"{plan.plan_id}.json"]


def test_list_plans_pages_newest_first(connect, service):
    client = connect(service.base)
    plans = []
    for _ in range(3):
        req, plan = made_elsewhere(unique("page"))
        client.import_plan(req, plan)
        plans.append(plan)
    page = client.list_plans(limit=2)
    assert [item.plan_id for item in page.plans] == [plans[2].plan_id, plans[1].plan_id]
    assert page.plans[0].summary.num_tables == 2 and page.plans[0].summary.world_size == 2
    assert page.plans[0].planner_version == "offline-9.9"
    following = client.list_plans(limit=2, after=page.next)
    assert following.plans[0].plan_id == plans[0].plan_id


def test_errors_are_typed_with_the_problem_as_attributes(connect, service):
    client = connect(service.base)
    with pytest.raises(NotFound) as missing:
        client.get_plan("e" * 64)
    assert (missing.value.status, missing.value.title) == (404, "Not found")
    assert "e" * 64 in missing.value.detail and missing.value.type == "about:blank"
    infeasible = {
        "topology": {"world_size": 2, "hbm_bytes": 2**30, "ddr_bytes": 2**30},
        "tables": [{"name": "huge", "num_embeddings": 10**9, "embedding_dim": 1024}],
    }
    with pytest.raises(NoPlanFound) as no_plan:
        client.create_plan(infeasible)
    assert no_plan.value.infeasibility.status == "infeasible"
    assert isinstance(no_plan.value, BadRequest)
    with pytest.raises(BadRequest) as too_wide:  # the service's own limit: 422
        client.create_plan(small(unique("wide"), world_size=128))
    assert too_wide.value.errors[0]["path"] == "topology.world_size"
    with pytest.raises(Unauthorized):
        connect(service.base, token=None).create_plan(small(unique("anon")))
    with pytest.raises(Forbidden):
        connect(service.base, token="not-a-token-of-the-service").set_alias("x", "e" * 64)
    assert issubclass(Forbidden, PlannerHTTPError) and issubclass(PlannerHTTPError, PlannerError)


def test_invalid_arguments_are_refused_before_anything_is_sent(connect, service):
    with FaultyProxy(service.base) as proxy:
        client = connect(proxy.base)
        bad = small("bad")
        bad["tables"][0]["embedding_dim"] = 0
        with pytest.raises(InputError) as refused:
            client.create_plan(bad)
        assert "tables[0].embedding_dim" in str(refused.value)
        with pytest.raises(InputError, match="plan_id = 'nope'"):
            client.get_plan("nope")
        with pytest.raises(InputError, match="alias"):
            client.resolve("../etc")
        assert proxy.seen == []


# --------------------------------------------------------------------------- id prefixes


def test_a_plan_is_fetched_by_a_prefix_of_its_id_and_cached_under_the_whole(
    connect, service, tmp_path
):
    client = connect(service.base, cache_dir=tmp_path)
    plan = client.create_plan(small(unique("prefix")))
    assert client.get_plan(plan.plan_id[:12]) == plan
    assert client.get_request(plan.plan_id[:8]).tables[0].name.startswith("prefix")
    assert [p.name for p in (tmp_path / "plans").iterdir()] == [f"{plan.plan_id}.json"]
    assert [p.name for p in (tmp_path / "requests").iterdir()] == [f"{plan.plan_id}.json"]
    record = client.set_alias(unique("short"), plan.plan_id[:10])
    assert record.plan_id == plan.plan_id


def test_a_prefix_that_names_no_plan_or_several_is_not_found_or_conflict(connect, service):
    client = connect(service.base)
    shared = [f"c0ffee00{index}" + "0" * 55 for index in range(2)]
    put_rows(service, shared)
    with pytest.raises(Conflict) as several:
        client.get_plan("c0ffee00")
    assert several.value.matching_plan_ids == shared and several.value.more_matching is False
    with pytest.raises(NotFound, match="no plan id starts with c0ffee01"):
        client.get_plan("c0ffee01")
    with pytest.raises(InputError, match="plan_id = 'c0ffee0': must be a plan id"):
        client.get_plan("c0ffee0")


def test_a_plan_whose_id_does_not_start_with_the_prefix_is_an_integrity_error(
    connect, service, tmp_path
):
    """The service answered a prefix with another plan (a row filed under the wrong id):
    its content hashes to its own id, which is not the one asked for."""
    client = connect(service.base, cache_dir=tmp_path)
    plan = client.create_plan(small(unique("misfiled")))
    misfiled = f"{int(plan.plan_id[:8], 16) ^ 0xFFFFFFFF:08x}"  # every digit differs
    put_rows(service, [misfiled + "0" * 56], plan=canonical_bytes(plan))
    with pytest.raises(IntegrityError) as refused:
        client.get_plan(misfiled)
    assert str(refused.value).endswith(
        f"asked for a plan whose id starts with {misfiled}, got plan {plan.plan_id}"
    )
    assert (refused.value.expected_plan_id, refused.value.plan_id) == (misfiled, plan.plan_id)
    assert [p.name for p in (tmp_path / "plans").iterdir()] == [f"{plan.plan_id}.json"]


# --------------------------------------------------------------------------- retries


def test_503_with_retry_after_then_502_then_the_answer(connect, service):
    plan = connect(service.base).create_plan(small(unique("retry")))
    faults = [Fault(503, {"Retry-After": "1"}), Fault(502)]
    with FaultyProxy(service.base, faults) as proxy:
        assert connect(proxy.base).get_plan(plan.plan_id) == plan
    assert len(proxy.seen) == 3
    assert proxy.seen[1].at - proxy.seen[0].at >= 1.0  # waited as the service asked


def test_connection_resets_then_the_answer(connect, service):
    document = small(unique("reset"))
    faults = [Fault.connection_reset(), Fault.connection_reset()]
    with FaultyProxy(service.base, faults) as proxy:
        plan = connect(proxy.base).create_plan(document)  # a POST: safe to send again
    assert [seen.method for seen in proxy.seen] == ["POST"] * 3
    assert plan.request_hash == request_hash(parse_request(json.dumps(document)))


def test_429_and_504_are_retried_but_a_4xx_about_the_input_is_not(connect, service):
    document = small(unique("statuses"))
    with FaultyProxy(service.base, [Fault(429), Fault(504)]) as proxy:
        connect(proxy.base).check(document)
    assert len(proxy.seen) == 3
    with FaultyProxy(service.base) as proxy, pytest.raises(BadRequest):
        connect(proxy.base).create_plan(small(unique("wide"), world_size=128))
    assert len(proxy.seen) == 1


def test_a_server_that_is_down_is_unavailable_after_the_retries(connect):
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(PlannerUnavailable) as unavailable:
        connect(down, retries=3).get_plan("a" * 64)
    assert unavailable.value.attempts == 4
    assert isinstance(unavailable.value.last_error, httpx.ConnectError)
    assert unavailable.value.__cause__ is unavailable.value.last_error
    assert "after 4 attempt(s)" in str(unavailable.value)
    with pytest.raises(PlannerError, match="ftp://") as unsupported:  # not retried: a usage error
        connect("ftp://127.0.0.1:21").get_plan("a" * 64)
    assert not isinstance(unsupported.value, PlannerUnavailable)


def test_a_server_that_always_resets_gets_exactly_the_attempts(connect):
    with (
        FaultyProxy(None, [Fault.connection_reset()] * 10) as proxy,
        pytest.raises(PlannerUnavailable) as unavailable,
    ):
        connect(proxy.base, retries=2).list_plans()
    assert unavailable.value.attempts == len(proxy.seen) == 3


def test_retry_after_is_capped_and_overload_ends_unavailable(connect):
    faults = [Fault(503, {"Retry-After": "3600"})] * 5
    with FaultyProxy(None, faults) as proxy:
        client = connect(proxy.base, retries=2, max_retry_after_s=0.05)
        with pytest.raises(PlannerUnavailable) as unavailable:
            client.get_plan("b" * 64)
    assert unavailable.value.attempts == len(proxy.seen) == 3
    last = unavailable.value.last_error
    assert isinstance(last, Overloaded) and last.retry_after_s == 3600


# --------------------------------------------------------------------------- integrity, cache


def _corrupt(body: bytes) -> bytes:
    """A plan that still reads as one, with one rank's HBM bytes changed."""
    return body.replace(b'"world_size":', b'"world_size":1', 1)


def test_a_corrupted_plan_is_refused_and_not_cached(connect, service, tmp_path):
    plan = connect(service.base).create_plan(small(unique("corrupt")))
    with (
        FaultyProxy(service.base, corrupt=_corrupt) as proxy,
        pytest.raises(IntegrityError) as refused,
    ):
        connect(proxy.base, cache_dir=tmp_path).get_plan(plan.plan_id)
    assert refused.value.plan_id == plan.plan_id
    assert "hashes to" in str(refused.value)
    assert not (tmp_path / "plans" / f"{plan.plan_id}.json").exists()
    # Through an honest path, the same cache then holds the real plan.
    assert connect(service.base, cache_dir=tmp_path).get_plan(plan.plan_id) == plan
    assert (tmp_path / "plans" / f"{plan.plan_id}.json").read_bytes() == canonical_bytes(plan)


# --------------------------------------------------------------------------- profiles


def _profile(name: str) -> dict[str, Any]:
    return builders.device_profile(name=unique(name))


def _calibrated(name: str, **options: Any) -> dict[str, Any]:
    document = small(unique(name))
    document["topology"]["compute_device"] = "cpu"
    document["options"].update({"cost_model": "calibrated", "time_limit_s": 5.0, **options})
    return document


def test_put_and_get_profile_and_plan_by_its_id(connect, service):
    client = connect(service.base)
    document = _profile("client")
    model = parse_profile(json.dumps(document))
    profile_id = client.put_profile(document)
    assert profile_id == profile_id_of(model)
    assert client.put_profile(model) == profile_id  # stored already: the same id
    assert client.get_profile(profile_id) == model
    with pytest.raises(NotFound):
        client.get_profile("d" * 64)
    with pytest.raises(InputError, match="profile_id"):
        client.get_profile("D" * 64)
    with pytest.raises(InputError, match=r"runtime\.step_ms"):
        client.put_profile({**document, "runtime": {**document["runtime"], "step_ms": -1.0}})
    with pytest.raises(Unauthorized):
        connect(service.base, token=None).put_profile(_profile("anonymous"))

    by_id = _calibrated("byid", device_profile_id=profile_id)
    plan = client.create_plan(by_id)
    inline = {**by_id, "options": {**by_id["options"], "device_profile": document}}
    assert client.create_plan(inline) == plan


def test_a_tampered_or_truncated_profile_is_an_integrity_error(connect, service):
    profile_id = connect(service.base).put_profile(_profile("tampered"))
    tamper = lambda body: body.replace(b'"step_ms":1.0', b'"step_ms":2.0')  # noqa: E731
    with (
        FaultyProxy(service.base, corrupt=tamper) as proxy,
        pytest.raises(IntegrityError, match="hashes to") as refused,
    ):
        connect(proxy.base).get_profile(profile_id)
    assert refused.value.expected_profile_id == profile_id
    assert refused.value.profile_id not in (None, profile_id)
    with (
        FaultyProxy(service.base, corrupt=lambda body: body[: len(body) // 2]) as proxy,
        pytest.raises(IntegrityError, match="not a readable device profile"),
    ):
        connect(proxy.base).get_profile(profile_id)
    assert connect(service.base).get_profile(profile_id).runtime.step_ms == 1.0


def test_a_truncated_plan_is_an_integrity_error(connect, service):
    plan = connect(service.base).create_plan(small(unique("cut")))
    with (
        FaultyProxy(service.base, corrupt=lambda body: body[: len(body) // 2]) as proxy,
        pytest.raises(IntegrityError, match="not a readable plan"),
    ):
        connect(proxy.base).get_plan(plan.plan_id)


def _fetch_as_sent(
    connect, service, name: str, accept_encoding: str | None = None, **options: Any
) -> tuple[Seen, bytes, bytes]:
    """A plan fetched through a proxy (asking upstream for ``accept_encoding`` when given)
    by a client made with ``options``: the request the proxy saw, the body as the service
    sent it (not decoded) and the plan's canonical bytes."""
    plan = connect(service.base).create_plan(small(unique(name)))
    bodies: list[bytes] = []

    def keep(body: bytes) -> bytes:
        bodies.append(body)
        return body

    with FaultyProxy(
        service.base, corrupt=keep, encoded=True, accept_encoding=accept_encoding
    ) as proxy:
        assert connect(proxy.base, **options).get_plan(plan.plan_id) == plan
    [seen], [body] = proxy.seen, bodies
    return seen, body, canonical_bytes(plan)


def test_the_client_fetches_plans_compressed_and_verifies_the_decoded_bytes(connect, service):
    seen, body, plan_bytes = _fetch_as_sent(connect, service, "zstd")
    assert seen.headers["accept-encoding"] == "zstd, gzip"
    assert zstandard.ZstdDecompressor().decompress(body) == plan_bytes
    # Through a proxy that asks for gzip only, the client decodes gzip.
    _, body, plan_bytes = _fetch_as_sent(connect, service, "gzip", accept_encoding="gzip")
    assert gzip.decompress(body) == plan_bytes


def test_compressed_false_asks_for_identity(connect, service):
    seen, body, plan_bytes = _fetch_as_sent(connect, service, "identity", compressed=False)
    assert seen.headers["accept-encoding"] == "identity"
    assert body == plan_bytes


def _zstd_of(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(write_checksum=True).compress(data)


def _unzstd(data: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompress(data)


@pytest.mark.parametrize(
    ("coding", "damage", "message"),
    [
        # Not gzip at all, though Content-Encoding says so.
        ("gzip", lambda body: b"\x00\x00" + body[2:], "cannot be decoded"),
        # A gzip stream whose deflate data is damaged.
        ("gzip", lambda body: body[:12] + bytes(b ^ 0xFF for b in body[12:40]) + body[40:],
         "decoded"),
        # Sound gzip of other bytes: the plan, changed.
        ("gzip", lambda body: gzip.compress(_corrupt(gzip.decompress(body))), "hashes to"),
        # Not zstd at all (no frame magic).
        ("zstd", lambda body: b"\x00\x00" + body[2:], "cannot be decoded"),
        # A zstd frame whose content checksum does not match.
        ("zstd", lambda body: body[:-1] + bytes([body[-1] ^ 0xFF]), "cannot be decoded"),
        # Sound zstd of other bytes.
        ("zstd", lambda body: _zstd_of(_corrupt(_unzstd(body))), "hashes to"),
    ],
    ids=["not-gzip", "damaged-deflate", "gzip-of-other-bytes", "not-zstd", "zstd-checksum",
         "zstd-of-other-bytes"],
)  # fmt: skip
def test_a_corrupted_compressed_plan_is_an_integrity_error(
    connect, service, tmp_path, coding, damage, message
):
    plan = connect(service.base).create_plan(small(unique(f"{coding}-corrupt")))
    with (
        FaultyProxy(service.base, corrupt=damage, encoded=True, accept_encoding=coding) as proxy,
        pytest.raises(IntegrityError, match=message),
    ):
        connect(proxy.base, cache_dir=tmp_path).get_plan(plan.plan_id)
    assert not (tmp_path / "plans" / f"{plan.plan_id}.json").exists()


def test_a_restart_while_the_service_is_down_is_served_from_the_cache(connect, service, tmp_path):
    online = connect(service.base, cache_dir=tmp_path)
    document = small(unique("restart"))
    plan = online.create_plan(document)
    alias = unique("restart-")
    online.set_alias(alias, plan.plan_id)
    assert online.resolve(alias).stale is False
    assert online.get_request(plan.plan_id) == parse_request(json.dumps(document))

    down = f"http://127.0.0.1:{free_port()}"
    restarted = connect(down, cache_dir=tmp_path, retries=1)
    assert restarted.get_plan(plan.plan_id) == plan
    assert restarted.get_request(plan.plan_id) == parse_request(json.dumps(document))
    with pytest.raises(PlannerUnavailable):
        restarted.resolve(alias)  # an alias can move: not from the cache unless asked
    stale = restarted.resolve(alias, allow_stale_alias=True)
    assert (stale.plan, stale.stale, stale.version) == (plan, True, 1)
    with pytest.raises(PlannerUnavailable):
        restarted.get_plan("c" * 64)  # never fetched: nothing to fall back on


def test_a_damaged_cache_file_is_moved_aside_and_fetched_again(connect, service, tmp_path):
    client = connect(service.base, cache_dir=tmp_path)
    plan = client.create_plan(small(unique("damaged")))
    cached = tmp_path / "plans" / f"{plan.plan_id}.json"
    cached.write_bytes(_corrupt(cached.read_bytes()))
    with FaultyProxy(service.base) as proxy:
        assert connect(proxy.base, cache_dir=tmp_path).get_plan(plan.plan_id) == plan
    assert [seen.path for seen in proxy.seen] == [f"/v1/plans/{plan.plan_id}"]
    assert cached.read_bytes() == canonical_bytes(plan)
    assert cached.with_suffix(".corrupt").exists()


def test_resolve_with_the_plan_cached_revalidates_instead_of_downloading(
    connect, service, tmp_path
):
    client = connect(service.base, cache_dir=tmp_path)
    plan = client.create_plan(small(unique("etag")))
    alias = unique("etag-")
    client.set_alias(alias, plan.plan_id)
    client.resolve(alias)
    with FaultyProxy(service.base) as proxy:
        again = connect(proxy.base, cache_dir=tmp_path).resolve(alias)
    assert (again.plan, again.stale) == (plan, False)
    # Any representation's tag: the service chooses the encoding, each with its own.
    assert proxy.seen[0].headers["if-none-match"] == ", ".join(
        f'"{plan.plan_id}{suffix}"' for suffix in ("", "-zstd", "-gzip")
    )
    assert proxy.answered == [304]


# --------------------------------------------------------------------------- pure parts


def _sealed_example() -> tuple[ShardingPlan, bytes]:
    req = builders.request([table("a", rows=1000), table("b", rows=500)], world_size=2)
    plan = builders.plan(
        req, {"a": builders.table_wise(req, "a", 0), "b": builders.row_wise(req, "b")}
    )
    return plan, canonical_bytes(plan)


def test_sealed_bytes_are_checked_by_their_hash_without_a_parse():
    plan, data = _sealed_example()
    assert sealed_plan(data) == plan
    assert verified_plan(data, source="x", expected_plan_id=plan.plan_id) == plan
    with pytest.raises(IntegrityError, match="asked for plan"):
        verified_plan(data, source="x", expected_plan_id="0" * 64)


@pytest.mark.parametrize("enabled", [True, False])
def test_reading_a_plan_leaves_the_garbage_collector_as_it_was(enabled):
    """The collector is paused while a plan is read, on both paths, and only resumed if it
    was running: a process that turned it off keeps it off."""
    plan, data = _sealed_example()
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        seen: list[bool] = []
        for body in (data, json.dumps(json.loads(data), indent=2).encode()):
            with patch_validate(seen):
                assert verified_plan(body, source="x", expected_plan_id=plan.plan_id) == plan
            assert gc.isenabled() is enabled
        assert seen == [False, False]  # paused while the model was read, each time
    finally:
        (gc.enable if was else gc.disable)()


@contextlib.contextmanager
def patch_validate(seen: list[bool]) -> Iterator[None]:
    """Records, each time a plan model is read, whether the collector was running."""
    original = ShardingPlan.model_validate_json

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.isenabled())
        return original(*args, **kwargs)

    ShardingPlan.model_validate_json = recording  # type: ignore[method-assign]
    try:
        yield
    finally:
        ShardingPlan.model_validate_json = original  # type: ignore[method-assign]


@pytest.mark.parametrize(
    ("change", "verdict"),
    [
        # Content changed, plan_id kept: the hash of the rest is not the id.
        (_corrupt, "hashes to"),
        # The same plan, not canonical (indented): the general path reads and checks it.
        (lambda data: json.dumps(json.loads(data), indent=2).encode(), None),
        # The same plan with its keys in another order: the general path again.
        (lambda data: json.dumps(dict(reversed(json.loads(data).items()))).encode(), None),
        # A duplicate key put in after the plan_id member, keeping the rest canonical: the
        # hash check fails on the bytes, and the general path refuses duplicate keys.
        (lambda data: data.replace(b'"planner_version":', b'"world_size":64,"planner_version":'),
         "twice"),
        # A second plan_id member: not the planner's bytes; the general path refuses it.
        (lambda data: data[:-1] + b',"plan_id":"' + b"0" * 64 + b'"}', "twice"),
    ],
    ids=["changed", "indented", "reordered", "duplicate-key", "second-plan-id"],
)  # fmt: skip
def test_bytes_that_are_not_the_sealed_ones_take_the_general_path(change, verdict):
    plan, data = _sealed_example()
    changed = change(data)
    assert sealed_plan(changed) is None
    if verdict is None:
        assert verified_plan(changed, source="x", expected_plan_id=plan.plan_id) == plan
    else:
        with pytest.raises(IntegrityError, match=verdict):
            verified_plan(changed, source="x", expected_plan_id=plan.plan_id)


def test_backoff_is_full_jitter_under_a_cap_and_retry_after_wins():
    policy = RetryPolicy(
        retries=8, backoff_s=0.5, max_backoff_s=4.0, max_retry_after_s=30.0, rng=random.Random(7)
    )
    for retry in range(1, 9):
        ceiling = min(4.0, 0.5 * 2 ** (retry - 1))
        delays = [policy.delay_s(retry) for _ in range(200)]
        assert all(0 <= delay <= ceiling for delay in delays)
        assert max(delays) > ceiling * 0.9 and min(delays) < ceiling * 0.1  # spread, not fixed
    assert 5.0 <= policy.delay_s(1, retry_after_s=5.0) <= 5.5
    assert 30.0 <= policy.delay_s(1, retry_after_s=3600.0) <= 30.5
    with pytest.raises(ValueError, match="retries = -1"):
        RetryPolicy(retries=-1)


def _with_retry_after(value: str) -> httpx.Response:
    return httpx.Response(503, headers={"Retry-After": value})


def test_retry_after_reads_seconds_and_dates():
    assert retry_after_s(_with_retry_after("7")) == 7.0
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    assert 100 <= retry_after_s(_with_retry_after(later)) <= 120
    past = format_datetime(datetime.now(UTC) - timedelta(days=1), usegmt=True)
    assert retry_after_s(_with_retry_after(past)) == 0.0
    assert retry_after_s(_with_retry_after("soon")) is None
    assert retry_after_s(httpx.Response(503)) is None


def test_clients_package_exports_the_client_lazily():
    import subprocess
    import sys

    script = (
        "import sys, clients, clients.cli; assert 'clients.http' not in sys.modules; "
        "from clients import PlannerClient, PlannerUnavailable; "
        "print(PlannerClient.__module__, PlannerUnavailable.__module__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["clients.http.client", "clients.http.errors"]


def test_cache_dir_layout_is_documented_names(connect, service, tmp_path: Path):
    client = connect(service.base, cache_dir=tmp_path)
    plan = client.create_plan(small(unique("layout")))
    client.get_request(plan.plan_id)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["aliases", "plans", "requests"]
    assert (tmp_path / "requests" / f"{plan.plan_id}.json").exists()
