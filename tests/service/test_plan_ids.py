"""Plans named by a prefix of their id, over real HTTP: a ``shardplan serve`` on loopback on
each store (SQLite and PostgreSQL). A unique prefix answers as the whole id does but is
revalidated; an unknown one is a 404, an ambiguous one a 409 listing the plans, a malformed
one a 422; alias updates take a prefix too. Plans that share a prefix are rows put into the
service's database beside it (two real plans share 8 hex digits once in 4 billion)."""

from __future__ import annotations

import json

import httpx
import pytest

from planner_service.plan.api import PlanSummary
from planner_service.service.store import open_store
from tests.conftest import BACKENDS
from tests.service.test_api import running_service, small_request

ACCEPTED = "must be a plan id (64 lowercase hex digits) or a unique prefix of one (8 to 64 digits)"
IDENTITY = {"Accept-Encoding": "identity"}


@pytest.fixture(scope="module", params=BACKENDS)
def service(request, shardplan_exe, tmp_path_factory):
    yield from running_service(request, shardplan_exe, tmp_path_factory)


@pytest.fixture(scope="module")
def client(service):
    with httpx.Client(base_url=service.base, timeout=60) as http:
        yield http


@pytest.fixture(scope="module")
def stored(client) -> str:
    created = client.post("/v1/plans", json=small_request("prefix"))
    assert created.status_code == 201, created.text
    return created.headers["x-shardplan-plan-id"]


def put_rows(service, plan_ids: list[str], plan: bytes = b"{}") -> None:
    """Rows in the service's own database with these ids, each holding ``plan``."""
    store = open_store(service.db)
    summary = PlanSummary(world_size=1, num_tables=1, objective=1.0, status="optimal")
    try:
        for plan_id in plan_ids:
            store.plans.put(
                plan_id=plan_id, request_hash="0" * 64, planner_version="test",
                request=b"{}", plan=plan, summary=summary,
            )  # fmt: skip
    finally:
        store.close()


def test_a_unique_prefix_answers_the_plan_and_names_it(client, stored):
    whole = client.get(f"/v1/plans/{stored}", headers=IDENTITY)
    short = client.get(f"/v1/plans/{stored[:12]}", headers=IDENTITY)
    assert short.status_code == 200
    assert short.content == whole.content
    assert short.headers["etag"] == whole.headers["etag"] == f'"{stored}"'
    assert short.headers["x-shardplan-plan-id"] == stored
    assert short.headers["content-location"] == f"/v1/plans/{stored}"
    # A plan stored later may share the prefix: revalidate, never cache it forever.
    assert short.headers["cache-control"] == "no-cache"
    assert whole.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert "content-location" not in whole.headers

    for asked in (stored[:8], stored[:63]):
        assert client.get(f"/v1/plans/{asked}", headers=IDENTITY).content == whole.content
    zstd = client.get(f"/v1/plans/{stored[:8]}", headers={"Accept-Encoding": "zstd"})
    assert zstd.headers["etag"] == f'"{stored}-zstd"' and zstd.content == whole.content
    again = client.get(
        f"/v1/plans/{stored[:8]}", headers={**IDENTITY, "If-None-Match": f'"{stored}"'}
    )
    assert (again.status_code, again.content) == (304, b"")
    assert again.headers["x-shardplan-plan-id"] == stored
    head = client.head(f"/v1/plans/{stored[:8]}", headers=IDENTITY)
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-length"] == str(len(whole.content))


def test_a_prefix_names_the_plans_request_and_page(client, stored):
    request = client.get(f"/v1/plans/{stored[:10]}/request")
    assert request.status_code == 200
    assert request.content == client.get(f"/v1/plans/{stored}/request").content
    assert request.headers["content-location"] == f"/v1/plans/{stored}/request"
    assert request.headers["cache-control"] == "no-cache"
    page = client.get(f"/v1/plans/{stored[:10]}/view")
    assert page.status_code == 200 and stored in page.text
    assert page.headers["x-shardplan-plan-id"] == stored


def test_an_unknown_prefix_is_404_saying_so(client, stored):
    unknown = next(p for p in ("00000000", "ffffffff") if not stored.startswith(p))
    for route in ("", "/request", "/view"):
        missing = client.get(f"/v1/plans/{unknown}{route}")
        assert missing.status_code == 404
        assert missing.json()["detail"] == f"no plan id starts with {unknown} here"
    whole = client.get(f"/v1/plans/{'e' * 64}")  # a whole id: the route's own answer
    assert whole.json()["detail"] == f"no plan with plan_id {'e' * 64} is stored here"


@pytest.mark.parametrize("asked", ["0123abc", "0123ABCD", "0123abcg", "0" * 65])
def test_a_malformed_id_is_422_naming_the_field_value_and_what_is_accepted(client, asked):
    refused = client.get(f"/v1/plans/{asked}")
    assert refused.status_code == 422
    problem = refused.json()
    assert problem["detail"] == f"path plan_id = {asked!r}: {ACCEPTED}"
    assert problem["errors"] == [
        {"path": "plan_id", "in": "path", "message": ACCEPTED, "value": repr(asked)}
    ]


def test_an_ambiguous_prefix_is_409_listing_the_plans(service, client):
    few = [f"5eed0001{index}" + "0" * 55 for index in range(3)]
    many = [f"5eed0002{index:056x}" for index in range(12)]
    put_rows(service, few + many)
    ambiguous = client.get("/v1/plans/5eed0001")
    assert ambiguous.status_code == 409
    problem = ambiguous.json()
    assert problem["title"] == "Ambiguous plan id prefix"
    assert (problem["prefix"], problem["matching_plan_ids"], problem["more_matching"]) == (
        "5eed0001",
        few,
        False,
    )
    assert problem["detail"].startswith("plan id prefix 5eed0001 is ambiguous: 3 stored plans")
    assert problem["detail"].endswith("; give more digits of the one you mean")
    listed = client.get("/v1/plans/5eed0002/view").json()
    assert (listed["matching_plan_ids"], listed["more_matching"]) == (many[:10], True)
    assert "more than 10 stored plans start with it" in listed["detail"]
    # More digits name one of them.
    assert client.head(f"/v1/plans/{few[1][:9]}").headers["x-shardplan-plan-id"] == few[1]


def test_an_alias_is_pointed_by_prefix_and_records_the_whole_id(service, client, stored):
    moved = client.put("/v1/aliases/by-prefix", json={"plan_id": stored[:12]})
    assert moved.status_code == 201, moved.text
    assert moved.json()["plan_id"] == stored
    assert client.get("/v1/aliases/by-prefix/history").json()["changes"][0]["plan_id"] == stored

    put_rows(service, [f"a11a5000{index:056x}" for index in range(2)])
    ambiguous = client.put("/v1/aliases/by-prefix", json={"plan_id": "a11a5000"})
    assert ambiguous.status_code == 409 and len(ambiguous.json()["matching_plan_ids"]) == 2
    unknown = client.put("/v1/aliases/by-prefix", json={"plan_id": "a11a6000"})
    assert unknown.status_code == 422
    assert unknown.json()["detail"] == (
        "body: plan_id = 'a11a6000': no plan id starts with a11a6000 here"
    )
    short = client.put("/v1/aliases/by-prefix", json={"plan_id": "a11a"})
    assert short.status_code == 422
    assert short.json()["detail"] == f"body: plan_id = 'a11a': {ACCEPTED}"
    history = client.get("/v1/aliases/by-prefix/history").json()["changes"]
    assert [change["plan_id"] for change in history] == [stored]  # refusals changed nothing


def test_put_takes_only_a_whole_id(client, stored):
    """PUT names a plan not stored yet by its content address: a prefix addresses nothing."""
    body = json.dumps({"request": {}, "plan": {}})
    refused = client.put(f"/v1/plans/{stored[:12]}", content=body)
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["path"] == "plan_id"


def test_get_and_head_are_operations_with_their_own_ids_and_docs_log_no_warning(service, client):
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    operations = spec["paths"]["/v1/plans/{plan_id}"]
    assert operations["get"]["operationId"] != operations["head"]["operationId"]
    ids = [op["operationId"] for path in spec["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids))
    [parameter] = operations["get"]["parameters"]
    assert parameter["schema"]["pattern"] == "^[0-9a-f]{8,64}$"
    assert "Duplicate Operation ID" not in service.log()
