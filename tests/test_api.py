"""The HTTP API that exists so far: liveness and plan validation, over real HTTP."""

from __future__ import annotations

import json
import socket
import subprocess
import time

import httpx
import pytest

from planner_service.codec import plan_bytes
from tests import builders
from tests.builders import request, table


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(shardplan_exe, tmp_path_factory):
    port = _free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [str(shardplan_exe), "serve", "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{base}/healthz", timeout=1)
            break
        except httpx.TransportError:
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "server did not start in 30 s"
            time.sleep(0.1)
    yield base
    process.terminate()
    process.wait(timeout=10)
    log.close()


def _documents():
    req = request([table("a"), table("b")], world_size=2)
    plan = builders.plan(
        req, {"a": builders.table_wise(req, "a", 0), "b": builders.row_wise(req, "b")}
    )
    return json.loads(req.model_dump_json()), json.loads(plan_bytes(plan))


def test_healthz(server):
    response = httpx.get(f"{server}/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_validate_valid_and_invalid(server):
    req, plan = _documents()
    ok = httpx.post(f"{server}/v1/validate", json={"request": req, "plan": plan})
    assert ok.status_code == 200
    assert ok.json() == {"valid": True, "violations": []}
    plan["tables"]["a"]["shards"][0]["rank"] = 7
    bad = httpx.post(f"{server}/v1/validate", json={"request": req, "plan": plan}).json()
    assert bad["valid"] is False
    codes = [v["code"] for v in bad["violations"]]
    assert codes == ["plan_id_mismatch", "rank_out_of_range", "ranks_mismatch"]
    assert bad["violations"][1]["table"] == "a" and bad["violations"][1]["rank"] == 7


@pytest.mark.parametrize(
    ("body", "path", "text"),
    [
        (b"{oops", "", "not valid JSON"),
        (b'{"request": {}}', "", 'exactly the keys "request" and "plan"'),
        (None, "tables[0].num_embeddings", "greater than or equal to 1"),
    ],
)
def test_validate_bad_input_is_problem_json(server, body, path, text):
    if body is None:
        req, plan = _documents()
        req["tables"][0]["num_embeddings"] = 0
        body = json.dumps({"request": req, "plan": plan}).encode()
    response = httpx.post(
        f"{server}/v1/validate", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == 422 and problem["title"] == "Invalid input"
    assert any(e["path"] == path and text in e["message"] for e in problem["errors"]), problem


def test_openapi_lists_routes(server):
    spec = httpx.get(f"{server}/openapi.json").json()
    assert {"/healthz", "/v1/validate"} <= set(spec["paths"])
