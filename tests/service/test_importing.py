"""Imported plans (PUT /v1/plans/{plan_id}, ``service/importing.py``) over real HTTP on
SQLite and PostgreSQL: every answer that serves one says its solver report is unverified
(issue 36, item 7); its migration is recomputed from the previous plan it names, which must
be stored or inline, as POST /v1/validate recomputes one, and a plan inside a request is
held to the service's limits (item 8).
"""

from __future__ import annotations

import json

import httpx
import pytest

from planner_service import PLANNER_VERSION
from planner_service.plan.canonical import canonical_bytes
from planner_service.plan.codec import parse_request, request_hash
from planner_service.solve.deadline import Deadline
from planner_service.solve.pipeline import solve
from tests.conftest import BACKENDS
from tests.service.test_api import made_elsewhere, resealed, running_service
from tests.support import builders
from tests.support.builders import request, table

MAX_TABLES = 20
MAX_WORLD_SIZE = 64
UNVERIFIED = "x-shardplan-solver-report"
NOT_VERIFIED_TEXT = "not verified by this service"


@pytest.fixture(scope="module", params=BACKENDS)
def client(request, shardplan_exe, tmp_path_factory):
    """A client of a service on each store, with small limits to go over."""
    limits = {
        "SHARDPLAN_MAX_TABLES": str(MAX_TABLES),
        "SHARDPLAN_MAX_WORLD_SIZE": str(MAX_WORLD_SIZE),
    }
    for server in running_service(request, shardplan_exe, tmp_path_factory, **limits):
        with httpx.Client(base_url=server.base, timeout=60) as http:
            yield http


def lopsided(name: str) -> tuple[dict, dict, str]:
    """Issue 36's forgery: every table on rank 0, claimed optimal with gap 0 under this
    planner's version. Valid (its figures are what its shards cost), but not the planner's."""
    req = request([table(f"{name}1"), table(f"{name}2", dim=32)], world_size=2)
    tables = {t.name: builders.table_wise(req, t.name, 0) for t in req.tables}
    plan = builders.plan(req, tables, planner_version=PLANNER_VERSION)
    return json.loads(req.model_dump_json()), json.loads(canonical_bytes(plan)), plan.plan_id


def put(http: httpx.Client, req: dict, plan: dict) -> httpx.Response:
    return http.put(f"/v1/plans/{plan['plan_id']}", json={"request": req, "plan": plan})


def assert_unverified(response: httpx.Response) -> None:
    assert response.headers.get(UNVERIFIED) == "unverified", (response.status_code, response.url)


# --------------------------------------------------------------------------- item 7


def test_an_imported_plan_is_said_unverified_wherever_it_is_served(client):
    req, plan, plan_id = lopsided("unv")
    assert put(client, req, plan).status_code == 201
    for path in (f"/v1/plans/{plan_id}", f"/v1/plans/{plan_id[:12]}"):  # fast path, route
        fetched = client.get(path)
        assert fetched.status_code == 200
        assert_unverified(fetched)
        assert_unverified(client.head(path))
        assert_unverified(client.get(path, headers={"accept-encoding": "gzip"}))
        etag = fetched.headers["etag"]
        not_modified = client.get(path, headers={"if-none-match": etag})
        assert not_modified.status_code == 304
        assert_unverified(not_modified)
    assert client.put("/v1/aliases/unv", json={"plan_id": plan_id}).is_success
    assert_unverified(client.get("/v1/aliases/unv"))
    assert_unverified(client.head("/v1/aliases/unv"))
    page = client.get(f"/v1/plans/{plan_id}/view")
    assert_unverified(page)
    assert page.text.count(NOT_VERIFIED_TEXT) == 2  # at a glance, and in the solver report
    for baseline in (plan_id, "alias:unv"):
        checked = client.post("/v1/check", params={"baseline": baseline}, json=req)
        assert checked.status_code == 200, checked.text
        assert checked.json()["baseline"]["imported"] is True
        # The check's own plan is the planner's, not the imported one.
        assert checked.json()["plan_id"] != plan_id and checked.json()["stored"] is False


def test_a_plan_the_planner_made_is_not_said_unverified(client):
    req = json.loads(
        request([table("own1"), table("own2", dim=32)], world_size=2).model_dump_json()
    )
    posted = client.post("/v1/plans", json=req)
    assert posted.status_code == 201
    plan_id = posted.headers["x-shardplan-plan-id"]
    assert UNVERIFIED not in client.get(f"/v1/plans/{plan_id}").headers
    assert UNVERIFIED not in client.get(f"/v1/plans/{plan_id[:12]}").headers
    page = client.get(f"/v1/plans/{plan_id}/view")
    assert UNVERIFIED not in page.headers and NOT_VERIFIED_TEXT not in page.text
    checked = client.post("/v1/check", params={"baseline": plan_id}, json=req).json()
    assert "imported" not in checked["baseline"]


def test_an_imported_plan_the_planner_then_makes_is_its_own(client):
    """Imported first (an offline `shardplan plan` of the same version: the same bytes),
    then solved here: the planner's own report, no longer the importer's word."""
    req = request([table("again1"), table("again2", dim=32)], world_size=2)
    outcome = solve(req, deadline=Deadline.never())
    assert outcome.plan is not None
    plan = json.loads(canonical_bytes(outcome.plan))
    req_json = json.loads(req.model_dump_json())
    assert_unverified(put(client, req_json, plan))
    assert_unverified(client.get(f"/v1/plans/{plan['plan_id']}"))
    posted = client.post("/v1/plans", json=req_json)
    assert posted.is_success and posted.headers["x-shardplan-plan-id"] == plan["plan_id"]
    assert UNVERIFIED not in client.get(f"/v1/plans/{plan['plan_id']}").headers
    page = client.get(f"/v1/plans/{plan['plan_id']}/view")
    assert NOT_VERIFIED_TEXT not in page.text
    listed = client.get("/v1/plans", params={"limit": 500}).json()["plans"]
    assert not any(row.get("imported") for row in listed if row["plan_id"] == plan["plan_id"])


# --------------------------------------------------------------------------- item 8


def replanned(client: httpx.Client, name: str) -> tuple[dict, dict, dict]:
    """A plan stored here (``previous``), and a request that re-plans from it by id with
    the plan the planner makes for it (its migration from ``previous``): JSON data."""
    first = request([table(f"{name}1", rows=4000), table(f"{name}2", dim=32)], world_size=2)
    posted = client.post("/v1/plans", json=json.loads(first.model_dump_json()))
    assert posted.status_code == 201
    previous = posted.json()
    grown = request(
        [table(f"{name}1", rows=4000), table(f"{name}2", dim=32), table(f"{name}3", rows=9000)],
        world_size=2,
        options={"previous_plan": previous, "max_moved_bytes": 2**30},
    )
    outcome = solve(grown, deadline=Deadline.never())
    assert outcome.plan is not None and outcome.plan.migration is not None
    by_id = json.loads(grown.model_dump_json())
    by_id["options"].pop("previous_plan")
    by_id["options"]["previous_plan_id"] = previous["plan_id"]
    return previous, by_id, json.loads(canonical_bytes(outcome.plan))


def forged_migration(plan: dict) -> tuple[dict, str]:
    """``plan`` claiming a migration that adds up but is not its moves."""
    migration = {
        **plan["migration"],
        "moved_bytes": 4096,
        "tables_moved": 1,
        "ranks": [
            {"rank": 0, "sent_bytes": 4096, "received_bytes": 0},
            {"rank": 1, "sent_bytes": 0, "received_bytes": 4096},
        ],
    }
    assert migration != plan["migration"]
    return resealed(plan, migration=migration)


def test_an_imported_migration_is_recomputed_from_the_stored_previous_plan(client):
    previous, req, plan = replanned(client, "mig")
    forged, _ = forged_migration(plan)
    refused = put(client, req, forged)
    assert refused.status_code == 422, refused.text
    messages = [v["message"] for v in refused.json()["violations"] if v["code"] == "migration"]
    assert any("migration.moved_bytes is 4096" in message for message in messages), messages
    assert client.get(f"/v1/plans/{forged['plan_id']}").status_code == 404
    # The same forgery with the previous plan inline: recomputed from that one.
    inline = {**req, "options": {**req["options"], "previous_plan": previous}}
    assert put(client, inline, forged).status_code == 422
    # The planner's own migration passes either way; the request is stored whole.
    assert put(client, req, plan).status_code == 201
    assert put(client, inline, plan).status_code == 200
    stored = parse_request(client.get(f"/v1/plans/{plan['plan_id']}/request").content)
    assert stored.options.previous_plan is not None
    assert stored.options.previous_plan.plan_id == previous["plan_id"]


def from_unknown_plan(client: httpx.Client, name: str, unknown: str) -> tuple[dict, dict]:
    """A request re-planning from plan ``unknown``, which is not stored, and a plan for it
    whose migration claims moves from that plan: JSON data."""
    _, req, plan = replanned(client, name)
    req["options"]["previous_plan_id"] = unknown
    migration = {**plan["migration"], "previous_plan_id": unknown}
    forged, _ = resealed(
        plan, migration=migration, request_hash=request_hash(parse_request(json.dumps(req)))
    )
    return req, forged


def assert_422_naming_unknown_previous(refused: httpx.Response, unknown: str) -> None:
    assert refused.status_code == 422, refused.text
    errors = refused.json()["errors"]
    assert [(e["path"], e["value"]) for e in errors] == [
        ("request.options.previous_plan_id", repr(unknown))
    ]
    assert "no plan with plan_id" in errors[0]["message"]


def test_a_migration_from_a_plan_not_stored_is_422_naming_the_field(client):
    unknown = "e" * 64
    req, forged = from_unknown_plan(client, "gone", unknown)
    assert_422_naming_unknown_previous(put(client, req, forged), unknown)
    # A migration whose request re-plans from nothing, or from another plan: violations.
    del req["options"]["previous_plan_id"]
    del req["options"]["max_moved_bytes"]
    orphan, _ = resealed(forged, request_hash=request_hash(parse_request(json.dumps(req))))
    response = put(client, req, orphan)
    assert response.status_code == 422
    assert "migration" in [v["code"] for v in response.json()["violations"]]


def _previous_over(field: str, value: object) -> dict:
    """A valid inline previous plan with ``field`` set to ``value``, resealed."""
    req, plan, _ = made_elsewhere("prev")
    forged, _ = resealed(plan, **{field: value})
    return {**req, "options": {"previous_plan": forged}}


@pytest.mark.parametrize("route", ["/v1/plans", "/v1/check", "/v1/validate", "PUT"])
def test_an_inline_previous_plan_is_held_to_the_services_limits(client, route):
    wide = _previous_over("world_size", 131_072)
    many = {**wide, "options": {"previous_plan": {"tables": {f"t{i}": 0 for i in range(21)}}}}
    for document, path, says in (
        (wide, "options.previous_plan.world_size", f"at most {MAX_WORLD_SIZE}"),
        (many, "options.previous_plan.tables", f"at most {MAX_TABLES} tables"),
    ):
        if route in ("/v1/plans", "/v1/check"):
            response = client.post(route, json=document)
        else:
            _, plan, plan_id = made_elsewhere("prev")
            body = {"request": document, "plan": plan}
            url = f"/v1/plans/{plan_id}" if route == "PUT" else route
            response = client.request("PUT" if route == "PUT" else "POST", url, json=body)
            path = f"request.{path}"
        assert response.status_code == 422, (route, path, response.text[:300])
        named = [e for e in response.json()["errors"] if e["path"] == path]
        assert named and says in named[0]["message"], response.json()["errors"]
    plan = made_elsewhere("many")[1]
    plan["tables"] = {f"t{i}": plan["tables"]["many1"] for i in range(21)}
    response = client.put(f"/v1/plans/{plan['plan_id']}", json={"request": {}, "plan": plan})
    assert [e["path"] for e in response.json()["errors"]] == ["plan.tables"]


def validate(client: httpx.Client, req: dict, plan: dict) -> httpx.Response:
    return client.post("/v1/validate", json={"request": req, "plan": plan})


def test_validate_recomputes_a_migration_from_the_stored_previous_plan(client):
    previous, req, plan = replanned(client, "vmig")
    forged, _ = forged_migration(plan)
    checked = validate(client, req, forged)
    assert checked.status_code == 200, checked.text
    assert checked.json()["valid"] is False
    messages = [v["message"] for v in checked.json()["violations"] if v["code"] == "migration"]
    assert any("migration.moved_bytes is 4096" in message for message in messages), messages
    inline = {**req, "options": {**req["options"], "previous_plan": previous}}
    assert validate(client, inline, forged).json()["valid"] is False
    for document in (req, inline):  # the planner's own migration, by id and inline
        assert validate(client, document, plan).json() == {"valid": True, "violations": []}


def test_validate_against_a_previous_plan_not_stored_is_422_naming_the_field(client):
    unknown = "d" * 64
    req, forged = from_unknown_plan(client, "vgone", unknown)
    assert_422_naming_unknown_previous(validate(client, req, forged), unknown)
