"""Hostile input under load: /healthz latency while the worst requests of issue 18 are in
flight, on a real ``shardplan serve`` (one HTTP worker, SQLite).

    .venv/bin/python -m benchmarks.hostile_bench [--world-size 65536] [--duration 20]

Ten clients (in a second process) send these, each as soon as its previous one was
answered, for ``--duration`` seconds:

- 4x ``POST /v1/validate`` of a plan and request of ``--world-size`` ranks (about 11 MB:
  within every limit, the heaviest thing a caller may ask for);
- 3x ``GET /v1/plans/{id}/view`` of the same plan, stored beforehand;
- 1x ``POST /v1/check`` with ``embedding_dim`` 10^8 (once held a solver process for good);
- 1x a body nested 1,000 deep (once a RecursionError, a 500);
- 1x ``POST /v1/validate`` of a 2-rank plan and request with ``world_size`` set to 10^7
  in both (about 2 KB; once 50 s on the event loop and 1.75 GB).

Meanwhile a third process GETs ``/healthz`` every 20 ms. The table gives /healthz
latency (p50, p99, max) idle and under that load, and the status codes the hostile
clients got. Nothing here is asserted; the numbers go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from planner_service import PLANNER_VERSION
from planner_service.plan.api import PlanSummary
from planner_service.plan.canonical import canonical_bytes
from planner_service.plan.codec import parse_request, request_hash
from planner_service.service.store import open_store
from tests.support import builders
from tests.support.builders import request, table
from tests.support.servers import Service

SHARDPLAN = Path(sys.executable).parent / "shardplan"
PROBE_INTERVAL_S = 0.02
REQUEST_TIMEOUT_S = 120  # a request still unanswered then counts as a ReadTimeout


def wide_documents(world_size: int) -> tuple[bytes, bytes, str]:
    """A request of ``world_size`` ranks (8 per host), its plan's bytes, and the plan_id."""
    req = request(
        [table("t0", rows=1_000_000, dim=64), table("t1", rows=50_000, dim=128)],
        world_size=world_size,
        topology={"local_world_size": min(8, world_size)},
    )
    plan = builders.plan(
        req, {"t0": builders.table_wise(req, "t0", 0), "t1": builders.row_wise(req, "t1")}
    )
    return canonical_bytes(req), canonical_bytes(plan), plan.plan_id


def store_plan(database: str, world_size: int) -> tuple[bytes, str]:
    """Put the wide plan in the store the server will use; returns the validate body."""
    req_bytes, plan_bytes, plan_id = wide_documents(world_size)
    store = open_store(database)
    req = json.loads(req_bytes)
    store.plans.put(
        plan_id=plan_id,
        request_hash=request_hash(parse_request(req_bytes)),
        planner_version=PLANNER_VERSION,
        request=req_bytes,
        plan=plan_bytes,
        summary=PlanSummary.of_stored(plan_bytes),
    )
    store.close()
    body = json.dumps({"request": req, "plan": json.loads(plan_bytes)}).encode()
    return body, plan_id


def hostile_clients(wide_body: bytes, plan_id: str) -> list[tuple[str, str, str, bytes | None]]:
    """(label, method, path, body) for each of the ten clients."""
    small_request, small_plan, _ = wide_documents(2)
    huge = json.dumps(
        {
            "request": {**json.loads(small_request), "topology": {"world_size": 10**7}},
            "plan": {**json.loads(small_plan), "world_size": 10**7},
        }
    ).encode()
    wide_dim = json.dumps(
        {"topology": {"world_size": 2}, "tables": [table("t", dim=10**8)]}
    ).encode()
    deep = b'{"topology": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    return [
        *[("validate wide plan", "POST", "/v1/validate", wide_body)] * 4,
        *[("view wide plan", "GET", f"/v1/plans/{plan_id}/view", None)] * 3,
        ("check embedding_dim 1e8", "POST", "/v1/check", wide_dim),
        ("nested 1000 deep", "POST", "/v1/plans", deep),
        ("validate world_size 1e7", "POST", "/v1/validate", huge),
    ]


# --------------------------------------------------------------------------- processes


def load(base: str, clients: list[Any], duration_s: float, results: Any) -> None:
    """Child process: every client re-sends its request until ``duration_s`` is over."""
    results.put(asyncio.run(_load(base, clients, duration_s)))


async def _load(base: str, clients: list[Any], duration_s: float) -> dict[str, Any]:
    statuses: Counter[str] = Counter()
    seconds: dict[str, list[float]] = {}
    stop = time.monotonic() + duration_s
    async with httpx.AsyncClient(base_url=base, timeout=REQUEST_TIMEOUT_S) as http:

        async def client(label: str, method: str, path: str, body: bytes | None) -> None:
            while time.monotonic() < stop:
                began = time.perf_counter()
                try:
                    response = await http.request(method, path, content=body)
                    outcome = str(response.status_code)
                except httpx.HTTPError as error:  # a timeout or a dropped connection
                    outcome = type(error).__name__
                seconds.setdefault(label, []).append(time.perf_counter() - began)
                statuses[f"{label}: {outcome}"] += 1

        await asyncio.gather(*(client(*c) for c in clients))
    return {"statuses": dict(statuses), "seconds": seconds}


def probe(base: str, duration_s: float, results: Any) -> None:
    """Child process: GET /healthz every PROBE_INTERVAL_S; latencies in seconds."""
    latencies, failures = [], 0
    stop = time.monotonic() + duration_s
    with httpx.Client(base_url=base, timeout=REQUEST_TIMEOUT_S) as http:
        while time.monotonic() < stop:
            began = time.perf_counter()
            try:
                ok = http.get("/healthz").status_code == 200
            except httpx.HTTPError:  # counted, with the time it took to fail
                ok = False
            latencies.append(time.perf_counter() - began)
            failures += not ok
            time.sleep(PROBE_INTERVAL_S)
    results.put({"latencies": latencies, "failures": failures})


def measure(base: str, clients: list[Any] | None, duration_s: float) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    prober = context.Process(target=probe, args=(base, duration_s, results))
    loader = (
        context.Process(target=load, args=(base, clients, duration_s, results)) if clients else None
    )
    for process in (loader, prober):
        if process is not None:
            process.start()
    outcome: dict[str, Any] = {}
    for _ in range(2 if loader else 1):
        outcome.update(results.get(timeout=duration_s + 2 * REQUEST_TIMEOUT_S + 60))
    for process in (loader, prober):
        if process is not None:
            process.join()
    return outcome


# --------------------------------------------------------------------------- report


def percentiles(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p99 = ordered[int(0.99 * (len(ordered) - 1))]
    return (
        f"{1000 * statistics.median(ordered):8.1f} {1000 * p99:8.1f} "
        f"{1000 * ordered[-1]:8.1f} {len(ordered):6d}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=65_536)
    parser.add_argument("--duration", type=float, default=20.0)
    args = parser.parse_args()
    print(f"# {platform.node()}: {os.cpu_count()} CPUs, {platform.python_version()}, "
          f"world_size {args.world_size}, {args.duration:g} s per phase", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory() as directory:
        database = str(Path(directory) / "plans.db")
        wide_body, plan_id = store_plan(database, args.world_size)
        print(f"# validate body {len(wide_body) / 2**20:.1f} MiB, plan {plan_id[:12]}", flush=True)
        server = Service(SHARDPLAN, Path(directory) / "log", db=database).start()
        try:
            idle = measure(server.base, None, args.duration)
            busy = measure(server.base, hostile_clients(wide_body, plan_id), args.duration)
        finally:
            server.stop()
    print(f"{'/healthz':28s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s} {'count':>6s}")
    print(f"{'idle':28s} {percentiles(idle['latencies'])}")
    print(f"{'10 hostile clients':28s} {percentiles(busy['latencies'])}")
    print(f"healthz failures: {idle['failures'] + busy['failures']}")
    print(f"{'hostile request: status':40s} {'count':>6s} {'median s':>9s}")
    for key, count in sorted(busy["statuses"].items()):
        label = key.split(": ")[0]
        median = statistics.median(busy["seconds"][label])
        print(f"{key:40s} {count:6d} {median:9.2f}")


if __name__ == "__main__":
    main()
