"""The planner service over real HTTP: a `shardplan serve` subprocess on loopback, backed by
a real SQLite file and by a real PostgreSQL server (every test in this module runs on
both). Each status code the API documents is provoked here."""

from __future__ import annotations

import base64
import gzip
import json
import threading
import time

import httpx
import pytest
import zstandard

from planner_service import PLANNER_VERSION
from planner_service.plan.canonical import canonical_bytes, plan_id_of
from planner_service.plan.codec import parse_plan, parse_request
from planner_service.plan.compact import expand_plan
from planner_service.validate.validator import validate_plan
from tests.conftest import BACKENDS, database_url
from tests.support import builders
from tests.support.builders import request, table
from tests.support.servers import Service

TOKEN = "ci-token-0123456789abcdef"


def running_service(request_fixture, exe, tmp_path_factory, **env: str):
    """Body of the module fixtures below: a service on the fixture's backend, stopped after."""
    backend = request_fixture.param
    postgres = request_fixture.getfixturevalue("postgres") if backend == "postgres" else None
    directory = tmp_path_factory.mktemp(f"service-{backend}")
    db = database_url(backend, postgres, directory)
    server = Service(exe, directory / "server.log", db=db, env=env).start()
    yield server
    server.stop()


@pytest.fixture(scope="module", params=BACKENDS)
def service(request, shardplan_exe, tmp_path_factory):
    yield from running_service(
        request,
        shardplan_exe,
        tmp_path_factory,
        SHARDPLAN_MAX_TABLES="50",
        SHARDPLAN_MAX_WORLD_SIZE="4096",
        SHARDPLAN_MAX_TIME_LIMIT_S="30",
        SHARDPLAN_MAX_BODY_BYTES="200000",
    )


@pytest.fixture
def client(service):
    with httpx.Client(base_url=service.base, timeout=60) as http:
        yield http


@pytest.fixture(scope="module", params=BACKENDS)
def uncached(request, shardplan_exe, tmp_path_factory):
    """No plan cache: every fetch goes through the route and the store, none through the
    fast path that answers fetches of cached plans."""
    yield from running_service(request, shardplan_exe, tmp_path_factory, SHARDPLAN_CACHE_BYTES="0")


def small_request(name: str = "a", world_size: int = 2, **fields):
    return json.loads(
        request(
            [table(f"{name}1", rows=1000), table(f"{name}2", rows=5000, dim=32)],
            world_size=world_size,
            **fields,
        ).model_dump_json()
    )


def infeasible_request():
    """One table of 1e9 x 1024 fp32 (4 TB) on two ranks with 1 GiB HBM and DDR each."""
    return {
        "topology": {"world_size": 2, "hbm_bytes": 2**30, "ddr_bytes": 2**30},
        "tables": [{"name": "huge", "num_embeddings": 10**9, "embedding_dim": 1024}],
    }


# --------------------------------------------------------------------------- plans


def test_post_solves_stores_and_then_answers_from_the_store(client):
    document = small_request("post")
    created = client.post("/v1/plans", json=document)
    assert created.status_code == 201, created.text
    plan = parse_plan(created.content)
    assert created.headers["location"] == f"/v1/plans/{plan.plan_id}"
    assert created.headers["etag"] == f'"{plan.plan_id}"'
    assert created.headers["x-shardplan-cache"] == "miss"
    assert float(created.headers["x-shardplan-solve-seconds"]) >= 0
    assert validate_plan(parse_request(json.dumps(document)), plan) == []

    again = client.post("/v1/plans", json=document)
    assert again.status_code == 200
    assert again.headers["x-shardplan-cache"] == "hit"
    assert again.content == created.content

    # Same request, tables in another order: same request_hash, so the same stored plan.
    reordered = {**document, "tables": document["tables"][::-1]}
    assert client.post("/v1/plans", json=reordered).content == created.content


def test_a_plan_of_runs_is_stored_and_served_in_fewer_bytes_than_its_shard_lists(client):
    req, plan, plan_id = made_elsewhere("runs")
    listed = json.loads(canonical_bytes(expand_plan(parse_plan(json.dumps(plan)))))
    assert plan["schema_version"] == "2.0" and listed["schema_version"] == "1.1"
    served = []
    for document in (plan, listed):
        stored = client.put(
            f"/v1/plans/{document['plan_id']}", json={"request": req, "plan": document}
        )
        assert stored.status_code == 201, stored.text
        fetched = client.get(
            f"/v1/plans/{document['plan_id']}", headers={"Accept-Encoding": "identity"}
        )
        assert fetched.headers["etag"] == f'"{document["plan_id"]}"'
        assert fetched.content == canonical_bytes(document)
        assert int(fetched.headers["content-length"]) == len(fetched.content)
        served.append(len(fetched.content))
    assert served[0] < served[1]
    assert plan_id_of(plan) == plan_id


def test_get_plan_is_immutable_and_revalidates_with_etag(client):
    created = client.post("/v1/plans", json=small_request("get"))
    plan_id = created.headers["x-shardplan-plan-id"]
    # httpx asks for gzip by default; this client takes identity (no header: see below).
    fetched = client.get(f"/v1/plans/{plan_id}", headers={"Accept-Encoding": "identity"})
    assert fetched.status_code == 200
    assert "content-encoding" not in fetched.headers
    assert fetched.content == created.content
    assert fetched.headers["etag"] == f'"{plan_id}"'
    assert fetched.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert fetched.headers["content-type"] == "application/json"
    assert plan_id_of(json.loads(fetched.content)) == plan_id
    for tag in (f'"{plan_id}"', f'W/"{plan_id}"', f'"{"0" * 64}", "{plan_id}"', "*"):
        revalidated = client.get(
            f"/v1/plans/{plan_id}", headers={"If-None-Match": tag, "Accept-Encoding": "identity"}
        )
        assert revalidated.status_code == 304, tag
        assert revalidated.content == b""
        assert revalidated.headers["etag"] == f'"{plan_id}"'
    other = client.get(f"/v1/plans/{plan_id}", headers={"If-None-Match": f'"{"0" * 64}"'})
    assert other.status_code == 200

    stored_request = client.get(f"/v1/plans/{plan_id}/request")
    assert stored_request.status_code == 200
    assert parse_request(stored_request.content).tables[0].name == "get1"


def _raw_get(service, path: str, headers: dict[str, str]) -> tuple[httpx.Response, bytes]:
    """GET without httpx's own Accept-Encoding: the response and its body as sent (not
    decoded)."""
    with httpx.Client(base_url=service.base, timeout=60) as http:
        request = http.build_request("GET", path)
        del request.headers["accept-encoding"]
        request.headers.update(headers)
        response = http.send(request, stream=True)
        try:
            return response, b"".join(response.iter_raw())
        finally:
            response.close()


@pytest.mark.parametrize(
    ("accept_encoding", "expected"),
    [
        (None, "identity"),
        ("", "identity"),
        ("identity", "identity"),
        ("gzip", "gzip"),
        ("GZip", "gzip"),
        ("x-gzip", "gzip"),
        ("*", "zstd"),
        ("gzip, deflate, br", "gzip"),
        ("br", "identity"),  # unknown to this service: identity is still acceptable
        ("zstd", "zstd"),
        ("ZStd", "zstd"),
        ("br, zstd", "zstd"),
        ("gzip, zstd", "zstd"),  # weighed alike: the smaller
        ("zstd;q=0.5, gzip", "gzip"),
        ("zstd, gzip;q=0.9", "zstd"),
        ("zstd;q=0, gzip", "gzip"),
        ("zstd;q=0.5, identity", "identity"),
        ("gzip;q=0", "identity"),
        ("gzip;q=0.5, identity", "identity"),
        ("gzip;q=1.0, identity;q=0.5", "gzip"),
        ("gzip;Q=0.001", "gzip"),
        ("gzip;q=0.5", "gzip"),  # identity, not named, is the last resort
        ("*;q=0.5, gzip;q=0.3", "zstd"),  # * weighs zstd and identity alike: the smaller
        ("*;q=0.5, zstd;q=0.3, gzip;q=0.3", "identity"),
        ("gzip;q=2", "identity"),  # not a qvalue: the entry is ignored
        ("identity;q=0, gzip", "gzip"),
        ("identity;q=0, zstd;q=0, gzip", "gzip"),
        ("*;q=0, gzip", "gzip"),
        ("*;q=0, zstd", "zstd"),
        ("*;q=0, identity", "identity"),
        ("identity;q=0", None),
        ("identity;q=0, br", None),
        ("*;q=0", None),
        ("gzip;q=0, identity;q=0", None),
        ("gzip;q=0, zstd;q=0, identity;q=0", None),
    ],
)
def test_plan_is_served_in_the_negotiated_encoding(
    service, client, uncached, accept_encoding, expected
):
    created = client.post("/v1/plans", json=small_request("enc"))
    plan_id = created.headers["x-shardplan-plan-id"]
    identity = client.get(f"/v1/plans/{plan_id}", headers={"Accept-Encoding": "identity"})
    headers = {} if accept_encoding is None else {"Accept-Encoding": accept_encoding}
    response, body = _raw_get(service, f"/v1/plans/{plan_id}", headers)
    # The plan is cached here (the fast path answers); without a cache the route and the
    # store answer, and must give the same response.
    assert httpx.post(f"{uncached.base}/v1/plans", json=small_request("enc")).content == (
        created.content
    )
    from_route, route_body = _raw_get(uncached, f"/v1/plans/{plan_id}", headers)
    assert _sent(from_route, route_body) == _sent(response, body)
    assert response.headers["vary"] == "Accept-Encoding"
    if expected is None:
        assert response.status_code == 406
        assert "accepts none of identity, zstd, gzip" in json.loads(body)["detail"]
        return
    assert response.status_code == 200
    assert response.headers["cache-control"] == "public, max-age=31536000, immutable"
    if expected != "identity":
        assert response.headers["content-encoding"] == expected
        assert response.headers["etag"] == f'"{plan_id}-{expected}"'
        assert DECODE[expected](body) == identity.content == created.content
        assert len(body) < len(identity.content)
    else:
        assert "content-encoding" not in response.headers
        assert response.headers["etag"] == f'"{plan_id}"'
        assert body == created.content


DECODE = {"gzip": gzip.decompress, "zstd": zstandard.ZstdDecompressor().decompress}


def _sent(response: httpx.Response, body: bytes) -> tuple[int, dict[str, str], bytes]:
    """What a response said, less the headers that vary by the moment and the server."""
    headers = {k: v for k, v in response.headers.items() if k not in ("date", "server")}
    return response.status_code, headers, body


def test_head_gives_get_headers_without_a_body(service, client, uncached):
    created = client.post("/v1/plans", json=small_request("head"))
    plan_id = created.headers["x-shardplan-plan-id"]
    httpx.post(f"{uncached.base}/v1/plans", json=small_request("head")).raise_for_status()
    for server in (service, uncached):  # the fast path and the route
        for accept in ("identity", "gzip", "zstd"):
            headers = {"Accept-Encoding": accept}
            got, body = _raw_get(server, f"/v1/plans/{plan_id}", headers)
            with httpx.Client(base_url=server.base, timeout=60) as http:
                head = http.head(f"/v1/plans/{plan_id}", headers=headers)
            assert head.status_code == 200 and head.content == b""
            assert _sent(head, b"") == _sent(got, b""), (server.base, accept)
            assert int(head.headers["content-length"]) == len(body) > 0
            revalidated = httpx.head(
                f"{server.base}/v1/plans/{plan_id}",
                headers={**headers, "If-None-Match": got.headers["etag"]},
            )
            assert revalidated.status_code == 304
        assert httpx.head(f"{server.base}/v1/plans/{'e' * 64}").status_code == 404


def test_fetches_answered_before_routing_are_counted(client):
    created = client.post("/v1/plans", json=small_request("fastmetrics"))
    plan_id = created.headers["x-shardplan-plan-id"]

    def count(status: str) -> float:
        text = client.get("/metrics").text
        line = (
            'shardplan_http_requests_total{method="GET",route="/v1/plans/{plan_id}",'
            f'status="{status}"}}'
        )
        found = [row for row in text.splitlines() if row.startswith(line)]
        return float(found[0].split()[-1]) if found else 0.0

    ok, not_modified = count("200"), count("304")
    for _ in range(3):
        assert client.get(f"/v1/plans/{plan_id}").status_code == 200
    etag = client.get(f"/v1/plans/{plan_id}").headers["etag"]
    assert client.get(f"/v1/plans/{plan_id}", headers={"If-None-Match": etag}).status_code == 304
    assert (count("200") - ok, count("304") - not_modified) == (4, 1)


def test_each_representation_revalidates_with_its_own_etag(service, client):
    created = client.post("/v1/plans", json=small_request("etags"))
    plan_id = created.headers["x-shardplan-plan-id"]
    path = f"/v1/plans/{plan_id}"
    tags = {
        "identity": f'"{plan_id}"',
        "gzip": f'"{plan_id}-gzip"',
        "zstd": f'"{plan_id}-zstd"',
    }
    for encoding, tag in tags.items():
        for sent in (tag, f"W/{tag}", f'"{"0" * 64}", {tag}', "*"):
            answer, body = _raw_get(
                service, path, {"Accept-Encoding": encoding, "If-None-Match": sent}
            )
            assert answer.status_code == 304, (encoding, sent)
            assert body == b""
            assert answer.headers["etag"] == tag
            assert answer.headers["vary"] == "Accept-Encoding"
        for other in (t for e, t in tags.items() if e != encoding):
            answer, _ = _raw_get(
                service, path, {"Accept-Encoding": encoding, "If-None-Match": other}
            )
            assert answer.status_code == 200, (encoding, other)
            assert answer.headers["etag"] == tag


def test_unknown_and_malformed_plan_ids(client):
    missing = client.get(f"/v1/plans/{'e' * 64}")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"
    assert missing.json()["detail"] == f"no plan with plan_id {'e' * 64} is stored here"
    for path in (f"/v1/plans/{'e' * 64}/request", f"/v1/plans/{'e' * 64}/view"):
        assert client.get(path).status_code == 404
    malformed = client.get("/v1/plans/not-a-hash")
    assert malformed.status_code == 422
    error = malformed.json()["errors"][0]
    assert error["path"] == "plan_id" and error["in"] == "path" and "not-a-hash" in error["value"]
    assert error["message"].startswith("must be a plan id (64 lowercase hex digits)")


def test_invalid_requests_name_the_field(client):
    document = small_request("bad")
    document["tables"][1]["embedding_dim"] = 0
    response = client.post("/v1/plans", json=document)
    assert response.status_code == 422
    problem = response.json()
    assert problem["title"] == "Invalid input"
    assert any(
        e["path"] == "tables[1].embedding_dim" and e["value"] == "0" for e in problem["errors"]
    ), problem
    not_json = client.post("/v1/plans", content=b"{nope", headers={"content-type": "text/plain"})
    assert not_json.status_code == 422 and "not valid JSON" in not_json.json()["detail"]
    empty = client.post("/v1/plans", content=b"")
    assert empty.status_code == 422


def test_a_table_twice_in_a_separate_group_is_422(client):
    document = small_request("dup")
    document["constraints"] = {"separate": [["dup1", "dup1"]]}
    response = client.post("/v1/plans", json=document)
    assert response.status_code == 422
    [error] = response.json()["errors"]
    assert error["path"] == "constraints.separate[0]" and "'dup1' twice" in error["message"]


def test_service_limits_are_422_naming_field_value_and_limit(client):
    too_many = small_request("many")
    too_many["tables"] = [table(f"t{i}") for i in range(51)]
    response = client.post("/v1/plans", json=too_many)
    assert response.status_code == 422
    assert response.json()["errors"] == [
        {
            "path": "tables",
            "message": "this service plans at most 50 tables per request "
            "(SHARDPLAN_MAX_TABLES); got 51",
        }
    ]
    wide = small_request("wide", world_size=8192)
    error = client.post("/v1/plans", json=wide).json()["errors"][0]
    assert error["path"] == "topology.world_size" and error["value"] == "8192"
    assert "at most 4096" in error["message"]
    slow = small_request("slow", options={"time_limit_s": 31.0})
    error = client.post("/v1/check", json=slow).json()["errors"][0]
    assert error["path"] == "options.time_limit_s" and "at most 30 s" in error["message"]


def test_body_over_the_limit_is_413_before_it_is_read(client):
    huge = b'{"pad": "' + b"x" * 300_000 + b'"}'
    response = client.post("/v1/plans", content=huge)
    assert response.status_code == 413
    assert response.headers["content-type"] == "application/problem+json"
    assert "at most 200000 bytes (SHARDPLAN_MAX_BODY_BYTES)" in response.json()["detail"]

    def chunked():  # no Content-Length: counted as it arrives
        for _ in range(30):
            yield b"x" * 10_000

    streamed = client.post("/v1/plans", content=chunked())
    assert streamed.status_code == 413


def test_infeasible_request_is_422_with_the_explanation(client):
    response = client.post("/v1/plans", json=infeasible_request())
    assert response.status_code == 422
    problem = response.json()
    assert problem["title"] == "No plan exists"
    infeasibility = problem["infeasibility"]
    assert infeasibility["status"] == "infeasible"
    assert any("huge" in reason.get("tables", []) for reason in infeasibility["reasons"]), problem
    assert "huge" in problem["detail"]


def test_wrong_method_and_unknown_route_are_problem_json(client):
    assert client.delete(f"/v1/plans/{'a' * 64}").status_code == 405
    unknown = client.get("/v2/everything")
    assert unknown.status_code == 404
    assert unknown.headers["content-type"] == "application/problem+json"


# --------------------------------------------------------------------------- import, lists


def made_elsewhere(name: str, planner_version: str = "offline-9.9", **plan_fields):
    """A request and a valid plan for it made without this service: (request, plan) as
    JSON data, and the plan's id."""
    req = request([table(f"{name}1"), table(f"{name}2", dim=32)], world_size=2)
    tables = {
        f"{name}1": builders.table_wise(req, f"{name}1", 0),
        f"{name}2": builders.row_wise(req, f"{name}2"),
    }
    plan = builders.plan(req, tables, planner_version=planner_version, **plan_fields)
    return json.loads(req.model_dump_json()), json.loads(canonical_bytes(plan)), plan.plan_id


def test_put_stores_a_plan_made_elsewhere_once_under_its_own_planner_version(client):
    req, plan, plan_id = made_elsewhere("imp")
    created = client.put(f"/v1/plans/{plan_id}", json={"request": req, "plan": plan})
    assert created.status_code == 201, created.text
    assert created.headers["location"] == f"/v1/plans/{plan_id}"
    assert created.headers["x-shardplan-plan-id"] == plan_id
    assert created.content == canonical_bytes(plan)
    again = client.put(f"/v1/plans/{plan_id}", json={"request": req, "plan": plan})
    assert again.status_code == 200 and again.content == created.content
    assert client.get(f"/v1/plans/{plan_id}").content == created.content
    stored_request = client.get(f"/v1/plans/{plan_id}/request").content
    assert parse_request(stored_request) == parse_request(json.dumps(req))
    # Made by another planner version: not this planner's answer, so a POST solves.
    posted = client.post("/v1/plans", json=req)
    assert posted.status_code == 201 and posted.headers["x-shardplan-cache"] == "miss"
    assert posted.headers["x-shardplan-plan-id"] != plan_id
    assert parse_plan(posted.content).planner_version == PLANNER_VERSION


def test_put_at_another_address_is_409_naming_the_ids(client):
    req, plan, plan_id = made_elsewhere("conf")
    elsewhere = "0" * 64
    moved = client.put(f"/v1/plans/{elsewhere}", json={"request": req, "plan": plan})
    assert moved.status_code == 409
    assert moved.headers["content-type"] == "application/problem+json"
    problem = moved.json()
    assert problem["title"] == "Plan id mismatch"
    assert (problem["path_plan_id"], problem["plan_id"], problem["computed_plan_id"]) == (
        elsewhere,
        plan_id,
        plan_id,
    )
    assert elsewhere in problem["detail"] and plan_id in problem["detail"]
    # Edited after it was sealed: its content no longer hashes to the id it claims.
    edited = json.loads(json.dumps(plan))
    edited["rank_stats"]["hbm_bytes"][0] += 1
    changed = client.put(f"/v1/plans/{plan_id}", json={"request": req, "plan": edited})
    assert changed.status_code == 409
    assert changed.json()["plan_id"] == plan_id
    assert changed.json()["computed_plan_id"] == plan_id_of(edited) != plan_id
    assert client.get(f"/v1/plans/{plan_id}").status_code == 404  # nothing stored


def test_put_of_a_plan_that_breaks_its_request_is_422_listing_violations(client):
    req, plan, plan_id = made_elsewhere("inv", hbm_bytes=[1, 1])  # rank_stats that lie
    response = client.put(f"/v1/plans/{plan_id}", json={"request": req, "plan": plan})
    assert response.status_code == 422
    problem = response.json()
    assert problem["title"] == "Invalid plan"
    assert {violation["code"] for violation in problem["violations"]} == {"rank_stats"}
    assert "nothing was stored" in problem["detail"]
    assert problem["violations"][0]["message"] in problem["detail"]
    # A plan made for another request: its request_hash says so.
    other, _, _ = made_elsewhere("inv2")
    _, good_plan, good_id = made_elsewhere("inv")
    mismatch = client.put(f"/v1/plans/{good_id}", json={"request": other, "plan": good_plan})
    assert mismatch.status_code == 422
    assert "request_hash_mismatch" in [v["code"] for v in mismatch.json()["violations"]]
    assert client.get(f"/v1/plans/{plan_id}").status_code == 404
    assert client.get(f"/v1/plans/{good_id}").status_code == 404
    bad_body = client.put(f"/v1/plans/{good_id}", json={"plan": good_plan})
    assert bad_body.status_code == 422 and bad_body.json()["title"] == "Invalid input"


def test_plans_are_listed_newest_first_page_by_page(client):
    made = [made_elsewhere(f"list{index}") for index in range(3)]
    for req, plan, plan_id in made:
        assert (
            client.put(f"/v1/plans/{plan_id}", json={"request": req, "plan": plan}).status_code
            == 201
        )
    first = client.get("/v1/plans", params={"limit": 2})
    assert first.status_code == 200
    page = first.json()
    assert [item["plan_id"] for item in page["plans"]] == [made[2][2], made[1][2]]
    newest = page["plans"][0]
    assert newest["planner_version"] == "offline-9.9"
    assert newest["summary"] == {
        "world_size": 2,
        "num_tables": 2,
        "objective": made[2][1]["solver"]["objective"],
        "status": "optimal",
    }
    seen = [item["plan_id"] for item in page["plans"]]
    while page["next"] is not None:
        page = client.get("/v1/plans", params={"limit": 2, "after": page["next"]}).json()
        assert len(page["plans"]) <= 2
        seen += [item["plan_id"] for item in page["plans"]]
    assert len(seen) == len(set(seen)) and made[0][2] in seen
    assert seen.index(made[0][2]) == 2  # right after the two newest
    assert len(client.get("/v1/plans").json()["plans"]) == min(len(seen), 50)


@pytest.mark.parametrize(
    ("route", "params", "parameter"),
    [
        ("/v1/plans", {"limit": "0"}, "limit"),
        ("/v1/plans", {"limit": "501"}, "limit"),
        ("/v1/plans", {"limit": "ten"}, "limit"),
        ("/v1/plans", {"after": "not a cursor!"}, "after"),
        ("/v1/plans", {"after": "Zm9v"}, "after"),  # base64 of "foo": one field of two
        ("/v1/aliases", {"after": "%%%"}, "after"),
        ("/v1/aliases", {"limit": "-1"}, "limit"),
    ],
)
def test_bad_list_parameters_are_422_naming_the_parameter(client, route, params, parameter):
    response = client.get(route, params=params)
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    [error] = response.json()["errors"]
    assert (error["path"], error["in"]) == (parameter, "query")
    assert params[parameter] in error["value"]


def test_aliases_are_listed_by_name_with_their_last_change(client):
    plan_id = client.post("/v1/plans", json=small_request("alist")).headers["x-shardplan-plan-id"]
    for name in ("list-b", "list-a"):
        client.put(f"/v1/aliases/{name}", json={"plan_id": plan_id, "comment": f"for {name}"})
    names, after = [], None
    records = {}
    while True:
        params = {"limit": 1, **({"after": after} if after else {})}
        page = client.get("/v1/aliases", params=params).json()
        assert len(page["aliases"]) <= 1
        for record in page["aliases"]:
            names.append(record["name"])
            records[record["name"]] = record
        after = page["next"]
        if after is None:
            break
    assert names == sorted(names, key=str.encode) and len(names) == len(set(names))
    assert names.index("list-a") + 1 == names.index("list-b")
    record = records["list-a"]
    assert (record["plan_id"], record["comment"], record["version"]) == (plan_id, "for list-a", 1)
    assert record["actor"] == "anonymous" and record["changed_at"].endswith("+00:00")


# --------------------------------------------------------------------------- aliases


def test_alias_lifecycle_with_history_and_rollback(client):
    first = client.post("/v1/plans", json=small_request("al1")).headers["x-shardplan-plan-id"]
    second = client.post("/v1/plans", json=small_request("al2")).headers["x-shardplan-plan-id"]
    created = client.put("/v1/aliases/ranking-prod", json={"plan_id": first})
    assert created.status_code == 201
    assert created.json()["version"] == 1 and created.json()["actor"] == "anonymous"
    moved = client.put("/v1/aliases/ranking-prod", json={"plan_id": second, "comment": "v2"})
    assert moved.status_code == 200 and moved.json()["previous_plan_id"] == first

    current = client.get("/v1/aliases/ranking-prod")
    assert current.status_code == 200
    assert current.headers["x-shardplan-plan-id"] == second
    assert current.headers["cache-control"] == "no-cache"
    assert current.content == client.get(f"/v1/plans/{second}").content
    # httpx asks for zstd (among others): the tag is the zstd representation's; each
    # representation has its own.
    assert current.headers["content-encoding"] == "zstd"
    assert current.headers["etag"] == f'"{second}-zstd"'
    tags = (("zstd", f'"{second}-zstd"'), ("gzip", f'"{second}-gzip"'), ("identity", f'"{second}"'))
    for accept, tag in tags:
        unchanged = client.get(
            "/v1/aliases/ranking-prod", headers={"If-None-Match": tag, "Accept-Encoding": accept}
        )
        assert unchanged.status_code == 304, accept
        assert unchanged.headers["etag"] == tag
        assert unchanged.headers["x-shardplan-plan-id"] == second
        assert unchanged.headers["cache-control"] == "no-cache"
    mismatched = client.get(
        "/v1/aliases/ranking-prod",
        headers={"If-None-Match": f'"{second}-gzip"', "Accept-Encoding": "zstd"},
    )
    assert mismatched.status_code == 200 and mismatched.content == current.content

    rollback = client.put(
        "/v1/aliases/ranking-prod", json={"plan_id": first, "comment": "roll back"}
    )
    assert rollback.status_code == 200
    assert client.get("/v1/aliases/ranking-prod").headers["x-shardplan-plan-id"] == first
    history = client.get("/v1/aliases/ranking-prod/history").json()
    assert [(c["version"], c["plan_id"], c["comment"]) for c in history["changes"]] == [
        (3, first, "roll back"),
        (2, second, "v2"),
        (1, first, None),
    ]


def test_alias_errors(client):
    assert client.get("/v1/aliases/never-set").status_code == 404
    assert client.get("/v1/aliases/never-set/history").status_code == 404
    unknown = client.put("/v1/aliases/x", json={"plan_id": "d" * 64})
    assert unknown.status_code == 422
    assert unknown.json()["errors"][0]["path"] == "plan_id"
    assert "no plan with this id" in unknown.json()["detail"]
    assert client.get("/v1/aliases/x").status_code == 404  # nothing was created
    bad_body = client.put("/v1/aliases/x", json={"plan_id": "d" * 64, "extra": 1})
    assert bad_body.status_code == 422
    assert any(e["path"] == "extra" for e in bad_body.json()["errors"])
    bad_id = client.put("/v1/aliases/x", json={"plan_id": "short"})
    assert bad_id.status_code == 422 and bad_id.json()["errors"][0]["path"] == "plan_id"
    bad_name = client.put("/v1/aliases/-starts-with-dash", json={"plan_id": "d" * 64})
    assert bad_name.status_code == 422 and bad_name.json()["errors"][0]["path"] == "name"


# --------------------------------------------------------------------------- check, validate


def test_check_reports_headroom_and_stores_nothing(client):
    document = small_request("chk")
    fits = client.post("/v1/check", json=document)
    assert fits.status_code == 200
    result = fits.json()
    assert result["fits"] is True and result["stored"] is False
    assert len(result["ranks"]) == 2
    for rank in result["ranks"]:
        assert rank["hbm_free_bytes"] == rank["hbm_usable_bytes"] - rank["hbm_used_bytes"] > 0
    assert result["min_hbm_free_bytes"] == min(r["hbm_free_bytes"] for r in result["ranks"])
    # The report shardplan check prints (tests/clients/cli/test_fetch.py compares the two).
    assert (result["verdict"], result["world_size"], result["tables"]) == ("fits", 2, 2)
    assert result["headroom"]["least"]["free_bytes"] == result["min_hbm_free_bytes"]
    assert client.get(f"/v1/plans/{result['plan_id']}").status_code == 404  # not stored
    # POST /v1/plans then stores exactly the plan the check described.
    assert (
        client.post("/v1/plans", json=document).headers["x-shardplan-plan-id"]
        == (result["plan_id"])
    )
    assert client.post("/v1/check", json=document).json()["stored"] is True

    no_fit = client.post("/v1/check", json=infeasible_request())
    assert no_fit.status_code == 200
    assert no_fit.json()["fits"] is False
    assert no_fit.json()["infeasibility"]["status"] == "infeasible"
    assert no_fit.json()["verdict"] == "no_plan" and no_fit.json()["binding"]["message"]


def _validate_documents():
    req = request([table("a"), table("b")], world_size=2)
    plan = builders.plan(
        req, {"a": builders.table_wise(req, "a", 0), "b": builders.row_wise(req, "b")}
    )
    return json.loads(req.model_dump_json()), json.loads(canonical_bytes(plan))


def test_validate_valid_and_invalid(client):
    req, plan = _validate_documents()
    ok = client.post("/v1/validate", json={"request": req, "plan": plan})
    assert ok.status_code == 200
    assert ok.json() == {"valid": True, "violations": []}
    builders.move_shard(plan["tables"]["a"], 0, 7)
    bad = client.post("/v1/validate", json={"request": req, "plan": plan}).json()
    assert bad["valid"] is False
    codes = [v["code"] for v in bad["violations"]]
    assert codes == [
        "plan_id_mismatch",
        "rank_out_of_range",  # a 2.0 table's ranks are its shards' (no ranks_mismatch)
        "rank_stats",  # rank 0 lost a's shard (and the objective, the critical path)
        "solver_report",
        "solver_report",
    ]
    assert bad["violations"][1]["table"] == "a" and bad["violations"][1]["rank"] == 7


@pytest.mark.parametrize(
    ("body", "path", "text"),
    [
        (b"{oops", "", "not valid JSON"),
        (b'{"request": {}}', "", 'exactly the keys "request" and "plan"'),
        (None, "request.tables[0].num_embeddings", "greater than or equal to 1"),
    ],
)
def test_validate_bad_input_is_problem_json(client, body, path, text):
    if body is None:
        req, plan = _validate_documents()
        req["tables"][0]["num_embeddings"] = 0
        body = json.dumps({"request": req, "plan": plan}).encode()
    response = client.post(
        "/v1/validate", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == 422 and problem["title"] == "Invalid input"
    assert any(e["path"] == path and text in e["message"] for e in problem["errors"]), problem


# --------------------------------------------------------------------------- operations


def test_health_readiness_metrics_and_openapi(client, service):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    expected = "SqliteStore" if "postgresql" not in service.db else "PostgresStore"
    assert ready.json() == {"status": "ready", "store": expected}

    client.post("/v1/plans", json=small_request("met"))
    client.post("/v1/plans", json=small_request("met"))
    client.get(f"/v1/plans/{'e' * 64}")
    text = client.get("/metrics").text
    assert 'shardplan_http_requests_total{method="POST",route="/v1/plans",status="201"}' in text
    assert 'route="/v1/plans/{plan_id}",status="404"' in text
    assert 'shardplan_http_request_duration_seconds_bucket{le="0.001",method="POST"' in text
    assert 'shardplan_solve_duration_seconds_count{outcome="plan"}' in text
    assert 'shardplan_plan_cache_total{result="request"}' in text
    assert "shardplan_solve_queue_depth 0.0" in text

    spec = client.get("/openapi.json").json()
    assert {
        "/v1/plans",
        "/v1/plans/{plan_id}",
        "/v1/plans/{plan_id}/view",
        "/v1/aliases",
        "/v1/aliases/{name}",
        "/v1/aliases/{name}/history",
        "/v1/profiles/{profile_id}",
        "/v1/check",
        "/v1/validate",
        "/healthz",
        "/readyz",
        "/metrics",
    } <= set(spec["paths"])


# --------------------------------------------------------------------------- auth


@pytest.fixture(scope="module", params=BACKENDS)
def secured(request, shardplan_exe, tmp_path_factory):
    yield from running_service(
        request, shardplan_exe, tmp_path_factory, SHARDPLAN_API_TOKENS=f"ci:{TOKEN}"
    )


def test_writes_need_a_bearer_token(secured):
    with httpx.Client(base_url=secured.base, timeout=60) as http:
        document = small_request("auth")
        missing = http.post("/v1/plans", json=document)
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"].startswith("Bearer")
        wrong = http.post("/v1/plans", json=document, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 403
        good = {"Authorization": f"Bearer {TOKEN}"}
        created = http.post("/v1/plans", json=document, headers=good)
        assert created.status_code == 201
        plan_id = created.headers["x-shardplan-plan-id"]
        assert http.put("/v1/aliases/p", json={"plan_id": plan_id}).status_code == 401
        changed = http.put("/v1/aliases/p", json={"plan_id": plan_id}, headers=good)
        assert changed.status_code == 201 and changed.json()["actor"] == "ci"
        req, plan, imported_id = made_elsewhere("auth-import")
        body = {"request": req, "plan": plan}
        assert http.put(f"/v1/plans/{imported_id}", json=body).status_code == 401
        wrong_put = http.put(
            f"/v1/plans/{imported_id}", json=body, headers={"Authorization": "Bearer nope"}
        )
        assert wrong_put.status_code == 403
        assert http.put(f"/v1/plans/{imported_id}", json=body, headers=good).status_code == 201
        # An async solve is a write too; reading its job is a read.
        async_missing = http.post("/v1/plans", json=document, headers={"Prefer": "respond-async"})
        assert async_missing.status_code == 401
        accepted = http.post(
            "/v1/plans", json=document, headers={**good, "Prefer": "respond-async"}
        )
        assert accepted.status_code == 202 and accepted.json()["plan_id"] == plan_id
        assert http.get(accepted.headers["location"]).json()["status"] == "done"
        # Reads stay open by default.
        assert http.get(f"/v1/plans/{plan_id}").status_code == 200
        assert http.get("/v1/aliases/p").status_code == 200
        assert http.get("/v1/plans").json()["plans"][0]["plan_id"] == imported_id
        assert http.get("/v1/aliases").json()["aliases"][0]["name"] == "p"


@pytest.fixture(scope="module", params=BACKENDS)
def read_protected(request, shardplan_exe, tmp_path_factory):
    yield from running_service(
        request,
        shardplan_exe,
        tmp_path_factory,
        SHARDPLAN_API_TOKENS=TOKEN,
        SHARDPLAN_PROTECT_READS="1",
    )


def test_protected_reads_need_a_token_too(read_protected):
    with httpx.Client(base_url=read_protected.base, timeout=60) as http:
        good = {"Authorization": f"Bearer {TOKEN}"}
        plan_id = http.post("/v1/plans", json=small_request("pr"), headers=good).headers[
            "x-shardplan-plan-id"
        ]
        assert http.get(f"/v1/plans/{plan_id}").status_code == 401
        assert http.head(f"/v1/plans/{plan_id}").status_code == 401
        wrong = {"Authorization": "Bearer not-the-token-at-all"}
        assert http.get(f"/v1/plans/{plan_id}", headers=wrong).status_code == 403
        assert http.get(f"/v1/plans/{plan_id}", headers=good).status_code == 200
        assert http.post("/v1/check", json=small_request("pr")).status_code == 401
        assert http.get("/v1/plans").status_code == 401
        assert http.get("/v1/aliases").status_code == 401
        accepted = http.post(
            "/v1/plans", json=small_request("pr"), headers={**good, "Prefer": "respond-async"}
        )
        job = accepted.headers["location"]
        assert http.get(job).status_code == http.get(f"{job}/events").status_code == 401
        assert http.get(job, headers=good).json()["plan_id"] == plan_id
        assert http.get("/v1/plans", headers=good).json()["plans"][0]["plan_id"] == plan_id
        assert http.get("/healthz").status_code == 200  # probes stay open


# --------------------------------------------------------------------------- overload


def slow_request(seed: int) -> dict:
    """150 tables on 32 ranks that CP-SAT cannot close: it runs to its time limit."""
    tables = [
        {
            "name": f"t{i}",
            "num_embeddings": 1000 + (i * 7919 + seed * 104729) % 5_000_000,
            "embedding_dim": [16, 32, 64, 128][i % 4],
            "pooling_factors": [1.0 + (i * 31 % 17)],
        }
        for i in range(150)
    ]
    return {
        "topology": {"world_size": 32, "local_world_size": 8},
        "tables": tables,
        "options": {"time_limit_s": 10.0, "seed": seed},
    }


@pytest.fixture(scope="module", params=BACKENDS)
def single_solver(request, shardplan_exe, tmp_path_factory):
    yield from running_service(request, shardplan_exe, tmp_path_factory, SHARDPLAN_SOLVE_QUEUE="0")


@pytest.mark.alone
def test_full_pool_is_503_with_retry_after_and_identical_requests_share_a_solve(single_solver):
    with httpx.Client(base_url=single_solver.base, timeout=120) as http:
        results: dict[str, httpx.Response] = {}

        def post(key: str, document: dict) -> None:
            results[key] = http.post("/v1/plans", json=document)

        first = threading.Thread(target=post, args=("first", slow_request(1)))
        twin = threading.Thread(target=post, args=("twin", slow_request(1)))
        # A warm solver process, so that the first solve starts as soon as it is admitted.
        assert http.post("/v1/plans", json=small_request("warm")).status_code in (200, 201)
        posted = time.monotonic()
        first.start()
        deadline = time.monotonic() + 30
        while "shardplan_solve_queue_depth 1.0" not in http.get("/metrics").text:
            assert time.monotonic() < deadline and first.is_alive()
            time.sleep(0.02)
        twin.start()  # the identical request joins the solve in flight: not turned away
        busy = http.post("/v1/plans", json=slow_request(2))
        assert busy.status_code == 503
        # Not before the running solve's time limit is spent, nor after its hard deadline
        # (time limit + the default 10 s grace).
        retry_after_s = int(busy.headers["retry-after"])
        time_limit_s = slow_request(1)["options"]["time_limit_s"]
        assert time_limit_s - (time.monotonic() - posted) <= retry_after_s <= time_limit_s + 10
        assert "queue of 0 is full" in busy.json()["detail"]
        assert f"retry in {retry_after_s} s" in busy.json()["detail"]
        first.join(timeout=120)
        twin.join(timeout=120)
        assert results["first"].status_code == 201
        assert results["twin"].status_code == 200
        assert results["twin"].content == results["first"].content
        assert "shardplan_solve_rejected_total 1.0" in http.get("/metrics").text
        # Once the pool is free again the turned-away request goes through.
        assert http.post("/v1/plans", json=slow_request(2)).status_code == 201


def test_store_down_is_503_and_readyz_says_so(postgres, shardplan_exe, tmp_path):
    from tests.support.servers import PostgresServer

    database = PostgresServer().start()
    try:
        server = Service(shardplan_exe, tmp_path / "log", db=database.new_database()).start()
        try:
            with httpx.Client(base_url=server.base, timeout=60) as http:
                plan_id = http.post("/v1/plans", json=small_request("down")).headers[
                    "x-shardplan-plan-id"
                ]
                database.stop()
                not_ready = http.get("/readyz")
                assert not_ready.status_code == 503
                assert not_ready.headers["retry-after"] == "5"
                assert "PostgreSQL" in not_ready.json()["detail"]
                refused = http.post("/v1/plans", json=small_request("down2"))
                assert refused.status_code == 503
                # Stored plans already in memory are still served: they cannot change.
                assert http.get(f"/v1/plans/{plan_id}").status_code == 200
                database.start()
                assert http.get("/readyz").status_code == 200
                assert http.post("/v1/plans", json=small_request("down2")).status_code == 201
        finally:
            server.stop()
    finally:
        database.destroy()


# --------------------------------------------------------------------------- hostile text, imports
# Issue 36, items 5, 7 and 8: what PostgreSQL cannot store (a NUL) was its 503 and SQLite's
# 200; the parts of an imported plan that nothing checked; an imported plan's solver report
# standing in for this planner's answer.


def resealed(plan: dict, **changes) -> tuple[dict, str]:
    """``plan`` (JSON data) with ``changes`` applied and its content address made again, as
    a forger would: only what the service checks beyond the address can refuse it."""
    forged = {**json.loads(json.dumps(plan)), **changes}
    forged["plan_id"] = plan_id_of(forged)
    return forged, forged["plan_id"]


def cursor_of(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()


def assert_422_naming(response: httpx.Response, path: str) -> None:
    assert response.status_code == 422, (path, response.status_code, response.text[:400])
    assert any(error["path"] == path for error in response.json()["errors"]), response.text


@pytest.mark.parametrize("text", ["2026\0\nx", "2026\u202e\nx", "a\n\x01b"])
def test_cursors_that_no_store_can_compare_are_422_naming_after(client, text):
    for route in ("/v1/plans", "/v1/aliases"):
        response = client.get(route, params={"after": cursor_of(text)})
        assert_422_naming(response, "after")


@pytest.mark.parametrize("comment", ["a\u0000b", "a\u202eb", "bell\u0007"])
def test_alias_comments_with_control_characters_are_422_naming_comment(client, comment):
    req, plan, plan_id = made_elsewhere("cmt")
    assert client.put(f"/v1/plans/{plan_id}", json={"request": req, "plan": plan}).is_success
    response = client.put("/v1/aliases/commented", json={"plan_id": plan_id, "comment": comment})
    assert_422_naming(response, "comment")
    kept = client.put("/v1/aliases/commented", json={"plan_id": plan_id, "comment": "two\nlines"})
    assert kept.is_success and kept.json()["comment"] == "two\nlines"


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        ({"planner_version": "offline-9.9\u0000"}, "plan.planner_version"),
        ({"planner_version": "offline\u202e9.9"}, "plan.planner_version"),
        ({"planner_version": " offline-9.9"}, "plan.planner_version"),
        ({"schema_version": "01.01"}, "plan.schema_version"),
        ({"schema_version": "1.0"}, "plan.solver.stop_reason"),
    ],
)
def test_imported_plans_with_unkept_text_or_versions_are_422_naming_the_field(
    client, changes, path
):
    req, plan, _ = made_elsewhere("ver", explicit=True)  # schema 1.1, as its edits need
    plan["solver"]["stop_reason"] = "optimal"
    forged, forged_id = resealed(plan, **changes)
    response = client.put(f"/v1/plans/{forged_id}", json={"request": req, "plan": forged})
    assert_422_naming(response, path)
    assert client.get(f"/v1/plans/{forged_id}").status_code == 404


MIGRATION = {
    "previous_plan_id": "e" * 64,
    "moved_bytes": 0,
    "tables_moved": 0,
    "ranks": [],
    "max_moved_bytes": None,
    "move_cost_ms_per_gib": None,
}


@pytest.mark.parametrize(
    ("migration", "path"),
    [
        (
            {"ranks": [{"rank": 100000, "sent_bytes": 0, "received_bytes": 0}]},
            "plan.migration.ranks[0].rank",
        ),
        ({"tables_moved": 99, "moved_bytes": 7}, "plan.migration.moved_bytes"),
    ],
)
def test_imported_migrations_that_do_not_add_up_are_422(client, migration, path):
    req, plan, _ = made_elsewhere("mig", explicit=True)
    plan["schema_version"] = "1.2"
    plan["solver"]["stop_reason"] = "optimal"
    forged, forged_id = resealed(plan, migration={**MIGRATION, **migration})
    response = client.put(f"/v1/plans/{forged_id}", json={"request": req, "plan": forged})
    assert response.status_code == 422, response.text
    problem = response.json()
    named = [error["path"] for error in problem.get("errors", [])]
    named += ["migration" for v in problem.get("violations", []) if v["code"] == "migration"]
    assert path in named or (path.startswith("request") and "migration" in named), problem


def test_numbers_and_sizes_of_a_request_are_strict(client):
    req = small_request("strict")
    priced = {**req, "options": {"previous_plan_id": "e" * 64, "move_cost_ms_per_gib": "5"}}
    assert_422_naming(client.post("/v1/plans", json=priced), "options.move_cost_ms_per_gib")
    for spacing in ("\u00a0", "\u2009", "\n"):
        spaced = {**req, "topology": {**req["topology"], "hbm_bytes": f"16{spacing}GiB"}}
        assert_422_naming(client.post("/v1/plans", json=spaced), "topology.hbm_bytes")
    spaced = {**req, "topology": {**req["topology"], "hbm_bytes": " 16 GiB "}}
    assert client.post("/v1/plans", json=spaced).is_success


def test_an_imported_plan_never_stands_in_for_this_planners_answer(client):
    """Every table on rank 0, claimed optimal with gap 0 under this planner's version: the
    validator recomputes the objective (so the claim is consistent), but the bound cannot be
    checked. A POST solves; the listing, the fetch and /v1/check say the report is the
    importer's word."""
    req = request([table("lopsided1"), table("lopsided2", dim=32)], world_size=2)
    tables = {name: builders.table_wise(req, name, 0) for name in ("lopsided1", "lopsided2")}
    plan = builders.plan(req, tables, planner_version=PLANNER_VERSION)
    req_json = json.loads(req.model_dump_json())
    put = client.put(
        f"/v1/plans/{plan.plan_id}",
        json={"request": req_json, "plan": json.loads(canonical_bytes(plan))},
    )
    assert put.status_code == 201, put.text
    assert put.headers["x-shardplan-solver-report"] == "unverified"
    posted = client.post("/v1/plans", json=req_json)
    assert posted.status_code == 201 and posted.headers["x-shardplan-cache"] == "miss"
    assert posted.headers["x-shardplan-plan-id"] != plan.plan_id
    assert "x-shardplan-solver-report" not in posted.headers
    checked = client.post("/v1/check", json=req_json).json()
    assert checked["plan_id"] == posted.headers["x-shardplan-plan-id"]
    listed = {
        row["plan_id"]: row
        for row in client.get("/v1/plans", params={"limit": 200}).json()["plans"]
    }
    assert listed[plan.plan_id]["imported"] is True
    assert "imported" not in listed[posted.headers["x-shardplan-plan-id"]]
