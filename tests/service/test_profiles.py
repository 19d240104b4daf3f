"""Device profiles in the service, over real HTTP: a `shardplan serve` subprocess on
loopback backed by a real SQLite file and by a real PostgreSQL server (every test runs on
both). PUT and GET /v1/profiles/{profile_id}; plan requests that name a stored profile by
``options.device_profile_id``; and every refusal, which names its field and stores
nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from planner_service.plan.canonical import canonical_bytes, sha256_hex
from planner_service.plan.codec import parse_plan, parse_profile, parse_request, request_hash
from planner_service.plan.types import profile_id_of
from planner_service.validate.validator import validate_plan
from tests.conftest import BACKENDS
from tests.service.test_api import running_service
from tests.service.test_store import fetch_one
from tests.support import builders
from tests.support.builders import device_profile, table

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module", params=BACKENDS)
def service(request, shardplan_exe, tmp_path_factory):
    yield from running_service(request, shardplan_exe, tmp_path_factory)


@pytest.fixture
def client(service) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service.base, timeout=60) as http:
        yield http


def _profile_id(document: dict) -> str:
    return profile_id_of(parse_profile(json.dumps(document)))


def _put(client: httpx.Client, document: dict, profile_id: str | None = None) -> httpx.Response:
    profile_id = profile_id or _profile_id(document)
    return client.put(f"/v1/profiles/{profile_id}", content=json.dumps(document), headers=JSON)


def _counts(service) -> tuple[int, ...]:
    """Rows in each table a refusal could change, read past the service."""
    tables = ("profiles", "plans", "solves")
    return tuple(fetch_one(service.db, f"SELECT COUNT(*) FROM {name}")[0] for name in tables)


def _calibrated_request(name: str, device: str = "cpu", **options) -> dict:
    """A small cpu request priced by the calibrated model, its options as given."""
    req = builders.request(
        [table(f"{name}1", rows=1000), table(f"{name}2", rows=5000, dim=32)],
        world_size=2,
        topology={"compute_device": device},
    )
    document = json.loads(req.model_dump_json())
    document["options"].update({"cost_model": "calibrated", "time_limit_s": 5.0, **options})
    return document


def _names(response: httpx.Response, path: str) -> list[dict[str, str]]:
    """The 422's errors that name ``path``, after checking it is one."""
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    named = [error for error in problem["errors"] if error["path"] == path]
    assert named, problem
    return named


# --------------------------------------------------------------------------- PUT and GET


def test_put_stores_the_canonical_bytes_once_and_get_returns_them(client, service):
    document = device_profile(name="round-trip")
    profile_id = _profile_id(document)
    canonical = canonical_bytes(parse_profile(json.dumps(document)))
    assert sha256_hex(canonical) == profile_id
    # Sent indented and in another key order: stored and served canonical.
    body = json.dumps(dict(reversed(document.items())), indent=2)
    created = client.put(f"/v1/profiles/{profile_id}", content=body, headers=JSON)
    assert created.status_code == 201, created.text
    assert created.headers["location"] == f"/v1/profiles/{profile_id}"
    assert created.headers["etag"] == f'"{profile_id}"'
    assert created.content == canonical
    before = _counts(service)

    again = client.put(f"/v1/profiles/{profile_id}", content=body, headers=JSON)
    assert again.status_code == 200
    assert again.content == canonical
    assert _counts(service) == before

    fetched = client.get(f"/v1/profiles/{profile_id}")
    assert fetched.status_code == 200
    assert fetched.content == canonical
    assert fetched.headers["etag"] == f'"{profile_id}"'
    assert fetched.headers["content-type"] == "application/json"
    assert fetched.headers["cache-control"] == "public, max-age=31536000, immutable"
    revalidated = client.get(
        f"/v1/profiles/{profile_id}", headers={"If-None-Match": f'"{profile_id}"'}
    )
    assert revalidated.status_code == 304 and revalidated.content == b""
    other = client.get(f"/v1/profiles/{profile_id}", headers={"If-None-Match": f'"{"0" * 64}"'})
    assert other.status_code == 200 and other.content == canonical

    missing = client.get(f"/v1/profiles/{'e' * 64}")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"
    assert "e" * 64 in missing.json()["detail"]


def _with(document: dict, path: tuple, value_text: str) -> str:
    """``document`` as JSON text with the number at ``path`` written as ``value_text``
    (``NaN``, ``1e999``: JSON that ``json.dumps`` would not write)."""
    marker = "__value__"
    changed = json.loads(json.dumps(document))
    node = changed
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = marker
    return json.dumps(changed).replace(f'"{marker}"', value_text)


BAD_NUMBERS = [
    # (what, path in the document, the number as written, the path the 422 names)
    ("NaN", ("runtime", "step_ms"), "NaN", "runtime.step_ms"),
    ("infinite", ("kernels", 0, "fwd_us_per_id"), "1e999", "kernels[0].fwd_us_per_id"),
    ("negative", ("collectives", 0, "latency_ms"), "-0.5", "collectives[0].latency_ms"),
    ("over its bound", ("kernels", 1, "bwd_ns_per_byte"), "1001", "kernels[1].bwd_ns_per_byte"),
    ("cpu_count 0", ("machine", "cpu_count"), "0", "machine.cpu_count"),
    ("fit samples 0", ("runtime", "fit", "samples"), "0", "runtime.fit.samples"),
]


def test_every_refused_profile_names_its_field_and_stores_nothing(client, service):
    valid = device_profile(name="refusals")
    bodies = [(what, _with(valid, path, text), named) for what, path, text, named in BAD_NUMBERS]
    bodies += [
        (
            "unknown schema_version",
            json.dumps({**valid, "schema_version": "9.0"}),
            "schema_version",
        ),
        ("no dense kernel", json.dumps({**valid, "kernels": valid["kernels"][:1]}), "kernels"),
        (
            "a cuda kernel on cpu",
            json.dumps(device_profile("cuda", compute_device="cpu")),
            "kernels",
        ),
        ("duplicate key", json.dumps(valid)[:-1] + ', "name": "twice"}', ""),
        ("unknown field", json.dumps({**valid, "colour": "red"}), "colour"),
    ]
    before = _counts(service)
    for what, body, path in bodies:
        response = client.put(f"/v1/profiles/{'a' * 64}", content=body, headers=JSON)
        named = _names(response, path)
        assert all("message" in error for error in named), (what, named)
        if path:
            assert all("value" in error for error in named), (what, named)
        assert _counts(service) == before, what


def test_a_profile_put_at_another_id_is_refused_naming_both_ids(client, service):
    document = device_profile(name="misplaced")
    actual = _profile_id(document)
    before = _counts(service)
    response = _put(client, document, "b" * 64)
    [named] = _names(response, "profile_id")
    assert named["value"] == repr("b" * 64)
    assert "b" * 64 in named["message"] and actual in named["message"]
    malformed = client.put("/v1/profiles/ABC", content=json.dumps(document), headers=JSON)
    assert malformed.status_code == 422
    assert malformed.json()["errors"][0]["path"] == "profile_id"
    assert client.get("/v1/profiles/ABC").status_code == 422
    assert client.get(f"/v1/profiles/{actual}").status_code == 404
    assert _counts(service) == before


# --------------------------------------------------------------------------- planning by id


def test_a_plan_by_profile_id_is_the_plan_with_the_profile_inline(client, service):
    profile = device_profile(name="by-id")
    profile_id = _profile_id(profile)
    assert _put(client, profile).status_code == 201
    by_id = _calibrated_request("byid", device_profile_id=profile_id)
    inline = _calibrated_request("byid", device_profile=profile)
    assert request_hash(parse_request(json.dumps(by_id))) == request_hash(
        parse_request(json.dumps(inline))
    )

    created = client.post("/v1/plans", json=by_id)
    assert created.status_code == 201, created.text
    plan = parse_plan(created.content)
    assert validate_plan(parse_request(json.dumps(inline)), plan) == []
    answered = client.post("/v1/plans", json=inline)
    assert answered.status_code == 200
    assert answered.headers["x-shardplan-cache"] == "hit"
    assert answered.content == created.content

    # The request stored beside the plan carries the profile itself, and hashes to the plan's.
    stored = parse_request(client.get(f"/v1/plans/{plan.plan_id}/request").content)
    assert stored.options.device_profile is not None
    assert profile_id_of(stored.options.device_profile) == profile_id
    assert request_hash(stored) == plan.request_hash

    job = client.post("/v1/plans", json=by_id, headers={"Prefer": "respond-async"})
    assert job.status_code == 202, job.text
    assert job.json()["status"] == "done" and job.json()["plan_id"] == plan.plan_id
    checked = client.post("/v1/check", json=by_id)
    assert checked.status_code == 200, checked.text
    assert checked.json()["stored"] is True


def test_an_unknown_profile_id_or_a_profile_of_another_device_is_refused(client, service):
    cuda = device_profile("cuda", name="gpu")
    assert _put(client, cuda).status_code == 201
    unknown = _calibrated_request("unknown", device_profile_id="c" * 64)
    wrong = _calibrated_request("wrong", device_profile_id=_profile_id(cuda))
    before = _counts(service)
    for headers in ({}, {"Prefer": "respond-async"}):
        refused = client.post("/v1/plans", json=unknown, headers=headers)
        [named] = _names(refused, "options.device_profile_id")
        assert "c" * 64 in named["value"] and "PUT it" in named["message"]
        refused = client.post("/v1/plans", json=wrong, headers=headers)
        [named] = _names(refused, "options.device_profile.compute_device")
        assert "cuda" in named["value"] and "cpu" in named["message"]
    _names(client.post("/v1/check", json=unknown), "options.device_profile_id")
    _names(client.post("/v1/check", json=wrong), "options.device_profile.compute_device")
    inline = _calibrated_request("inline", device_profile=cuda)
    _names(client.post("/v1/plans", json=inline), "options.device_profile.compute_device")
    assert _counts(service) == before
