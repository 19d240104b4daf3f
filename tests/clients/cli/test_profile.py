"""``shardplan profile put|get`` and ``shardplan plan --profile``, run in process against a
real ``shardplan serve`` on loopback (and a real faulty proxy in front of it for a
tampered profile): what they print, write and exit with, and that a refused profile
stores nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients.http import PlannerClient
from planner_service.plan.canonical import canonical_bytes
from planner_service.plan.codec import parse_plan, parse_profile, parse_request, request_hash
from planner_service.plan.types import profile_id_of
from planner_service.validate.validator import validate_plan
from tests.clients.cli.conftest import TOKEN
from tests.service.test_store import fetch_one
from tests.support.builders import device_profile
from tests.support.servers import FaultyProxy

pytestmark = pytest.mark.timeout(120)

TOKEN_ENV = {"SHARDPLAN_TOKEN": TOKEN}
REQUEST = {
    "topology": {"world_size": 2, "compute_device": "cpu"},
    "tables": [
        {"name": "users", "num_embeddings": 20_000, "embedding_dim": 32},
        {"name": "items", "num_embeddings": 4_000, "embedding_dim": 16},
    ],
    "options": {"time_limit_s": 5.0},
}


def _file(tmp_path: Path, name: str, document: dict | str) -> Path:
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def _stored_profiles(service) -> int:
    return int(fetch_one(service.db, "SELECT COUNT(*) FROM profiles")[0])


def test_put_prints_the_id_and_get_writes_the_canonical_profile(run_cli, service, tmp_path):
    document = device_profile(name="cli-round-trip")
    model = parse_profile(json.dumps(document))
    path = _file(tmp_path, "profile.json", document)
    put = run_cli("profile", "put", path, "--server", service.base, env=TOKEN_ENV)
    assert put.returncode == 0, put.stderr
    assert put.stdout == profile_id_of(model) + "\n"
    again = run_cli("profile", "put", path, "--server", service.base, env=TOKEN_ENV)
    assert (again.returncode, again.stdout) == (0, put.stdout)

    profile_id = put.stdout.strip()
    got = run_cli("profile", "get", profile_id, "--server", service.base)
    assert got.returncode == 0, got.stderr
    assert got.stdout == canonical_bytes(model).decode() + "\n"
    output = tmp_path / "fetched.json"
    written = run_cli("profile", "get", profile_id, "--server", service.base, "-o", output)
    assert (written.returncode, written.stdout) == (0, "")
    assert output.read_bytes() == canonical_bytes(model)


def test_bad_input_exits_2_naming_it_and_stores_nothing(run_cli, service, tmp_path):
    before = _stored_profiles(service)
    text = json.dumps(device_profile(name="cli-nan")).replace('"step_ms": 1.0', '"step_ms": NaN')
    nan = run_cli(
        "profile", "put", _file(tmp_path, "nan.json", text), "--server", service.base,
        env=TOKEN_ENV,
    )  # fmt: skip
    assert nan.returncode == 2
    assert "runtime.step_ms" in nan.stderr and "finite" in nan.stderr
    old = _file(tmp_path, "old.json", device_profile(schema_version="0.1"))
    refused = run_cli("profile", "put", old, "--server", service.base, env=TOKEN_ENV)
    assert refused.returncode == 2 and "schema_version" in refused.stderr
    anonymous = run_cli(
        "profile", "put", _file(tmp_path, "ok.json", device_profile(name="cli-anonymous")),
        "--server", service.base,
    )  # fmt: skip
    assert anonymous.returncode == 2 and "needs a token" in anonymous.stderr
    assert _stored_profiles(service) == before

    unknown = run_cli("profile", "get", "c" * 64, "--server", service.base)
    assert unknown.returncode == 2 and f"no profile {'c' * 64}" in unknown.stderr
    malformed = run_cli("profile", "get", "C" * 64, "--server", service.base)
    assert malformed.returncode == 2 and "PROFILE_ID" in malformed.stderr


def test_a_tampered_profile_exits_5_and_writes_nothing(run_cli, service, tmp_path):
    with PlannerClient(service.base, token=TOKEN) as client:
        profile_id = client.put_profile(device_profile(name="cli-tampered"))
    output = tmp_path / "tampered.json"
    tamper = lambda body: body.replace(b'"step_ms":1.0', b'"step_ms":3.0')  # noqa: E731
    with FaultyProxy(service.base, corrupt=tamper) as proxy:
        result = run_cli("profile", "get", profile_id, "--server", proxy.base, "-o", output)
    assert result.returncode == 5
    assert "integrity check failed, the profile is not used" in result.stderr
    assert not output.exists()


def test_plan_with_profile_is_the_calibrated_plan_here_and_on_the_service(
    run_cli, service, tmp_path
):
    profile = device_profile(name="cli-plan")
    profile_path = _file(tmp_path, "profile.json", profile)
    request_path = _file(tmp_path, "request.json", REQUEST)
    inline = parse_request(
        json.dumps({**REQUEST, "options": {**REQUEST["options"], "cost_model": "calibrated",
                                             "device_profile": profile}})
    )  # fmt: skip
    here = run_cli("plan", request_path, "--profile", profile_path)
    assert here.returncode == 0, here.stderr
    plan = parse_plan(here.stdout)
    assert plan.request_hash == request_hash(inline)
    assert validate_plan(inline, plan) == []

    remote = run_cli(
        "plan", request_path, "--profile", profile_path, "--server", service.base, env=TOKEN_ENV
    )
    assert remote.returncode == 0, remote.stderr
    served = parse_plan(remote.stdout)
    assert served == plan  # the same request, the same deterministic search
    # The service stored it under the request's hash: naming the profile by id finds it.
    with PlannerClient(service.base, token=TOKEN) as client:
        profile_id = client.put_profile(profile)
        by_id = {**REQUEST, "options": {**REQUEST["options"], "cost_model": "calibrated",
                                         "device_profile_id": profile_id}}  # fmt: skip
        assert client.create_plan(by_id) == served


def test_plan_with_a_bad_profile_exits_2_naming_the_field(run_cli, tmp_path):
    request_path = _file(tmp_path, "request.json", REQUEST)
    over = device_profile()
    over["kernels"][0]["fwd_us_per_id"] = 5000.0
    bad = run_cli("plan", request_path, "--profile", _file(tmp_path, "over.json", over))
    assert bad.returncode == 2
    assert "kernels[0].fwd_us_per_id" in bad.stderr and "1000" in bad.stderr
    cuda = _file(tmp_path, "cuda.json", device_profile("cuda"))
    wrong = run_cli("plan", request_path, "--profile", cuda)
    assert wrong.returncode == 2
    assert "options.device_profile.compute_device" in wrong.stderr
