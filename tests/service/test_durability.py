"""What users of the service depend on beyond single routes: plans survive a killed
server, and several HTTP workers share one store. (The plan page in a real browser:
test_pages_browser.py.)"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from planner_service.plan.canonical import plan_id_of
from planner_service.plan.codec import parse_plan
from tests.conftest import BACKENDS, database_url
from tests.support.servers import Service

# Slow lane: its subject is processes (started, killed, signalled) or multi-process runs.
pytestmark = pytest.mark.slow


def tiny_request(index: int) -> dict:
    return {
        "topology": {"world_size": 2},
        "tables": [
            {"name": f"a{index}", "num_embeddings": 1000 + index, "embedding_dim": 16},
            {"name": f"b{index}", "num_embeddings": 500 + index, "embedding_dim": 32},
        ],
        "options": {"time_limit_s": 0.01},  # warm start only: many solves per second
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkill_mid_burst_loses_no_acknowledged_plan(backend, request, shardplan_exe, tmp_path):
    postgres = request.getfixturevalue("postgres") if backend == "postgres" else None
    db = database_url(backend, postgres, tmp_path)
    env = {"SHARDPLAN_SOLVE_WORKERS": "2", "SHARDPLAN_SOLVE_QUEUE": "64"}
    server = Service(shardplan_exe, tmp_path / "log", db=db, env=env).start()
    acknowledged: dict[int, tuple[str, bytes]] = {}
    sent: set[int] = set()
    lock = threading.Lock()
    counter = iter(range(10**6))
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(base_url=server.base, timeout=30) as http:
            while not stop.is_set():
                with lock:
                    index = next(counter)
                    sent.add(index)
                try:
                    response = http.post("/v1/plans", json=tiny_request(index))
                except httpx.TransportError:
                    return  # the server is gone
                if response.status_code == 201:
                    with lock:
                        acknowledged[index] = (
                            response.headers["x-shardplan-plan-id"],
                            response.content,
                        )

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while len(acknowledged) < 40:
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.01)
    server.kill()  # SIGKILL, mid-burst: requests are in flight
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    assert len(sent) > len(acknowledged)  # some POSTs were cut off

    restarted = Service(shardplan_exe, tmp_path / "log2", db=db).start()
    try:
        with httpx.Client(base_url=restarted.base, timeout=30) as http:
            for plan_id, body in acknowledged.values():
                fetched = http.get(f"/v1/plans/{plan_id}")
                assert fetched.status_code == 200, plan_id
                assert fetched.content == body
            # Whatever else was stored when the kill hit is whole: every request sent is
            # either absent (solved again now: 201) or served intact (200).
            for index in sorted(sent - set(acknowledged)):
                again = http.post("/v1/plans", json=tiny_request(index))
                assert again.status_code in (200, 201), again.text
                assert plan_id_of(json.loads(again.content)) == again.headers["x-shardplan-plan-id"]
                parse_plan(again.content)
    finally:
        restarted.stop()


def test_several_http_workers_share_the_store_and_sum_their_metrics(shardplan_exe, tmp_path):
    server = Service(shardplan_exe, tmp_path / "log", db=str(tmp_path / "p.db"), workers=2).start()
    try:
        with httpx.Client(base_url=server.base, timeout=60) as http:
            plan_ids = set()
            for index in range(6):
                created = http.post("/v1/plans", json=tiny_request(index))
                assert created.status_code == 201
                plan_ids.add(created.headers["x-shardplan-plan-id"])
            for _ in range(5):  # new connections: both workers answer, from one store
                for plan_id in plan_ids:
                    with httpx.Client(base_url=server.base, timeout=60) as fresh:
                        assert fresh.get(f"/v1/plans/{plan_id}").status_code == 200
            text = http.get("/metrics").text
        line = (
            'shardplan_http_requests_total{method="GET",route="/v1/plans/{plan_id}",status="200"}'
        )
        assert f"{line} 30.0" in text, text
    finally:
        server.stop()
