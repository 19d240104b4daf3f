"""A soak: two replicas of ``shardplan serve`` on one PostgreSQL under mixed traffic for
minutes, one of them SIGKILLed and restarted midway.

    .venv/bin/python -m benchmarks.soak_bench [--duration 300] [--short] [--workers 2]

It starts its own PostgreSQL (``tests.support.servers.PostgresServer``, as the suite does:
Debian's ``postgresql`` binaries), a fresh database, and two replicas (``--workers`` HTTP
workers each, one solver process per worker) on it. After seeding a few plans and an
alias, a load process runs these clients for ``--duration`` seconds (``--short``: 40), each
sending to a replica chosen per request, and trying the other replica once when the chosen
one does not answer at all (as a load balancer would):

- 4 fetchers: ``GET /v1/plans/{id}`` in each encoding, ``/request``, the plan list, the
  alias;
- 1 planner: ``POST /v1/plans`` of a fresh request (a real solve) every half second;
- 1 async submitter: ``POST /v1/plans`` with ``Prefer: respond-async``, then the job polled
  until it ends;
- 1 importer: ``PUT /v1/plans/{id}`` of a fresh hand-built plan every half second;
- 2 hostile clients: distinct 256 KiB ``Accept-Encoding`` headers, a body cut off by a
  disconnect, a list cursor holding a NUL, a body nested 1,000 deep, a malformed id.

A probe process GETs ``/healthz`` on both replicas every 50 ms. At half time replica B is
SIGKILLed (its whole process group: workers and solvers) and started again on its port.
At the end every stored plan is fetched through replica A and its content address checked
(``plan_id_of`` of the bytes served is the id it is stored under).

The report: requests served, 5xx (as clients saw them, and as each replica's ``/metrics``
counts them: B's counters restart with B), ``/healthz`` latency, each HTTP worker's RSS
after seeding and at the end, the async jobs' outcomes and the plans verified, then a
table per kind of request. Nothing is asserted: the figures go to docs/benchmarks.md, and
what breaks is a bug to file.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import os
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from planner_service.plan.canonical import canonical_bytes, plan_id_of
from planner_service.plan.units import size
from tests.support import builders
from tests.support.builders import request, table
from tests.support.servers import PostgresServer, Service

SHARDPLAN = Path(sys.executable).parent / "shardplan"
SHORT_DURATION_S = 40.0
PROBE_INTERVAL_S = 0.05
REQUEST_TIMEOUT_S = 60.0
JOB_DEADLINE_S = 120.0  # an async job still running then counts as "unfinished"
RESTART_PAUSE_S = 2.0  # replica B stays down this long before it is started again
SEED_PLANS = 8
ALIAS = "soak"
HOSTILE_HEADER_BYTES = 256 * 1024


# --------------------------------------------------------------------------- documents


def small_request(name: str, time_limit_s: float = 2.0) -> dict[str, Any]:
    """Two tables on 2 ranks, named after ``name`` so that every request is a new solve."""
    tables = [table(f"{name}_a", rows=1000 + len(name)), table(f"{name}_b", rows=5000, dim=32)]
    document = request(tables, world_size=2, options={"time_limit_s": time_limit_s})
    return json.loads(canonical_bytes(document))


def import_body(name: str) -> tuple[str, bytes]:
    """A hand-built plan of a fresh request (not the planner's) and its ``PUT`` body."""
    req = request([table(f"{name}_a"), table(f"{name}_b", rows=300)], world_size=2)
    shardings = {
        f"{name}_a": builders.table_wise(req, f"{name}_a", 0),
        f"{name}_b": builders.table_wise(req, f"{name}_b", 1),
    }
    plan = builders.plan(req, shardings, planner_version="soak-import")
    body = {"request": json.loads(canonical_bytes(req)), "plan": json.loads(canonical_bytes(plan))}
    return plan.plan_id, json.dumps(body).encode()


# --------------------------------------------------------------------------- the load


class Tally:
    """Every answer and every unanswered request, by kind of request."""

    def __init__(self) -> None:
        self.outcomes: Counter[tuple[str, str]] = Counter()  # (kind, status or error)
        self.seconds: dict[str, list[float]] = {}
        self.by_replica: Counter[str] = Counter()
        self.jobs: Counter[str] = Counter()
        self.lost = 0  # neither replica answered

    def add(self, kind: str, outcome: str, seconds: float, replica: str) -> None:
        self.outcomes[kind, outcome] += 1
        self.seconds.setdefault(kind, []).append(seconds)
        if outcome.isdigit():
            self.by_replica[replica] += 1

    def as_data(self) -> dict[str, Any]:
        return {
            "outcomes": [[k, o, n] for (k, o), n in self.outcomes.items()],
            "seconds": self.seconds,
            "by_replica": dict(self.by_replica),
            "jobs": dict(self.jobs),
            "lost": self.lost,
        }


class Load:
    """The clients of one load process, sharing one connection pool per replica."""

    def __init__(self, bases: list[str], plan_ids: list[str], stop_at: float) -> None:
        self.bases = bases
        self.plan_ids = plan_ids
        self.stop_at = stop_at
        self.tally = Tally()
        self.random = random.Random(36)

    def running(self) -> bool:
        return time.monotonic() < self.stop_at

    async def send(
        self, http: list[httpx.AsyncClient], kind: str, method: str, path: str, **kw: Any
    ) -> httpx.Response | None:
        """One request to a random replica, the other one tried once if it does not answer."""
        first = self.random.randrange(len(http))
        for index in (first, 1 - first):
            began = time.perf_counter()
            try:
                response = await http[index].request(method, path, **kw)
            except httpx.HTTPError as error:
                self.tally.add(kind, type(error).__name__, time.perf_counter() - began, "")
                continue
            replica = "AB"[index]
            self.tally.add(kind, str(response.status_code), time.perf_counter() - began, replica)
            return response
        self.tally.lost += 1
        return None

    async def fetcher(self, http: list[httpx.AsyncClient]) -> None:
        encodings = ["zstd, gzip", "gzip", "identity"]
        while self.running():
            plan_id = self.random.choice(self.plan_ids)
            accept = {"Accept-Encoding": self.random.choice(encodings)}
            await self.send(http, "fetch plan", "GET", f"/v1/plans/{plan_id}", headers=accept)
            await self.send(http, "fetch request", "GET", f"/v1/plans/{plan_id[:12]}/request")
            await self.send(http, "list plans", "GET", "/v1/plans?limit=20")
            await self.send(http, "fetch alias", "GET", f"/v1/aliases/{ALIAS}", headers=accept)
            await asyncio.sleep(0.01)

    async def planner(self, http: list[httpx.AsyncClient]) -> None:
        count = 0
        while self.running():
            count += 1
            document = small_request(f"p{count}")
            await self.send(http, "plan (sync)", "POST", "/v1/plans", json=document)
            await asyncio.sleep(0.5)

    async def submitter(self, http: list[httpx.AsyncClient]) -> None:
        count = 0
        while self.running():
            count += 1
            document = small_request(f"j{count}", time_limit_s=3.0)
            prefer = {"Prefer": "respond-async"}
            response = await self.send(
                http, "plan (async)", "POST", "/v1/plans", json=document, headers=prefer
            )
            if response is not None and response.status_code == 202:
                self.tally.jobs[await self.job_outcome(http, response.json()["job_id"])] += 1
            await asyncio.sleep(0.5)

    async def job_outcome(self, http: list[httpx.AsyncClient], job_id: str) -> str:
        deadline = time.monotonic() + JOB_DEADLINE_S
        while time.monotonic() < deadline:
            response = await self.send(http, "poll job", "GET", f"/v1/solves/{job_id}")
            if response is not None and response.status_code == 200:
                status = str(response.json()["status"])
                if status not in ("queued", "running"):
                    return status
            await asyncio.sleep(0.5)
        return "unfinished"

    async def importer(self, http: list[httpx.AsyncClient]) -> None:
        count = 0
        while self.running():
            count += 1
            plan_id, body = import_body(f"i{count}")
            headers = {"Content-Type": "application/json"}
            await self.send(
                http, "import", "PUT", f"/v1/plans/{plan_id}", content=body, headers=headers
            )
            await asyncio.sleep(0.5)

    async def hostile(self, http: list[httpx.AsyncClient], seed: int) -> None:
        count = 0
        while self.running():
            count += 1
            plan_id = self.random.choice(self.plan_ids)
            big = f"gzip;q=0.{seed}{count}, " + "x" * HOSTILE_HEADER_BYTES
            header = {"Accept-Encoding": big}
            await self.send(
                http, "hostile: 256 KiB header", "GET", f"/v1/plans/{plan_id}", headers=header
            )
            await self.disconnect(self.random.choice(self.bases))
            cursor = base64.urlsafe_b64encode(b"2026\0\nx").decode().rstrip("=")
            await self.send(http, "hostile: NUL cursor", "GET", f"/v1/plans?after={cursor}")
            deep = b'{"topology": ' + b"[" * 1000 + b"]" * 1000 + b"}"
            await self.send(http, "hostile: nested 1000 deep", "POST", "/v1/plans", content=deep)
            await self.send(http, "hostile: bad id", "GET", "/v1/plans/not-an-id")
            await asyncio.sleep(0.5)

    async def disconnect(self, base: str) -> None:
        """A body that promises 1,000 bytes, sends one and hangs up."""
        host, port = base.removeprefix("http://").split(":")
        began = time.perf_counter()
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
            await writer.drain()
            writer.close()
            outcome = "sent"
        except OSError as error:
            outcome = type(error).__name__
        self.tally.add("hostile: disconnect mid-body", outcome, time.perf_counter() - began, "")

    async def run(self) -> dict[str, Any]:
        http = [httpx.AsyncClient(base_url=b, timeout=REQUEST_TIMEOUT_S) for b in self.bases]
        try:
            await asyncio.gather(
                *(self.fetcher(http) for _ in range(4)),
                self.planner(http),
                self.submitter(http),
                self.importer(http),
                *(self.hostile(http, seed) for seed in (1, 2)),
            )
        finally:
            for client in http:
                await client.aclose()
        return self.tally.as_data()


def load(bases: list[str], plan_ids: list[str], duration_s: float, results: Any) -> None:
    """Child process: the clients, for ``duration_s``."""
    stop_at = time.monotonic() + duration_s
    results.put(("load", asyncio.run(Load(bases, plan_ids, stop_at).run())))


def probe(bases: list[str], duration_s: float, results: Any) -> None:
    """Child process: ``/healthz`` of each replica in turn every PROBE_INTERVAL_S."""
    latencies: dict[str, list[float]] = {"A": [], "B": []}
    unanswered: Counter[str] = Counter()
    stop = time.monotonic() + duration_s
    clients = [httpx.Client(base_url=b, timeout=REQUEST_TIMEOUT_S) for b in bases]
    while time.monotonic() < stop:
        for name, client in zip("AB", clients, strict=True):
            began = time.perf_counter()
            try:
                ok = client.get("/healthz").status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                latencies[name].append(time.perf_counter() - began)
            else:
                unanswered[name] += 1
        time.sleep(PROBE_INTERVAL_S)
    results.put(("probe", {"latencies": latencies, "unanswered": dict(unanswered)}))


# --------------------------------------------------------------------------- replicas


def worker_rss(service: Service) -> dict[int, int]:
    """Each HTTP worker's resident bytes (the serve process's spawned children)."""
    assert service.process is not None
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:  # ended meanwhile
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["PPid"]) == service.process.pid and b"spawn_main" in command:
            found[int(entry.name)] = int(fields["VmRSS"].split()[0]) * 1024
    return found


def metrics_5xx(base: str) -> int:
    """The 5xx answers a replica's ``/metrics`` has counted since it started."""
    text = httpx.get(f"{base}/metrics", timeout=REQUEST_TIMEOUT_S).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("shardplan_http_requests_total{") and 'status="5' in line:
            total += float(line.split()[-1])
    return int(total)


def seed(base: str) -> list[str]:
    """SEED_PLANS solved plans and the alias; their ids."""
    ids = []
    with httpx.Client(base_url=base, timeout=REQUEST_TIMEOUT_S) as http:
        for n in range(SEED_PLANS):
            response = http.post("/v1/plans", json=small_request(f"seed{n}"))
            response.raise_for_status()
            ids.append(response.headers["X-Shardplan-Plan-Id"])
        http.put(f"/v1/aliases/{ALIAS}", json={"plan_id": ids[0]}).raise_for_status()
    return ids


def verify_stored(base: str) -> tuple[int, list[str]]:
    """Every stored plan fetched and its content address checked: (plans, ids that fail)."""
    checked, wrong = 0, []
    after: str | None = None
    with httpx.Client(base_url=base, timeout=REQUEST_TIMEOUT_S) as http:
        while True:
            page = http.get(
                "/v1/plans", params={"limit": 500, **({"after": after} if after else {})}
            )
            page.raise_for_status()
            for listing in page.json()["plans"]:
                plan_id = listing["plan_id"]
                body = http.get(f"/v1/plans/{plan_id}").json()
                checked += 1
                if plan_id_of(body) != plan_id or body.get("plan_id") != plan_id:
                    wrong.append(plan_id)
            after = page.json()["next"]
            if after is None:
                return checked, wrong


class Run(NamedTuple):
    load: dict[str, Any]
    probe: dict[str, Any]
    rss_start: dict[str, dict[int, int]]
    rss_end: dict[str, dict[int, int]]
    metrics_5xx: dict[str, int]
    restart_s: float
    verified: tuple[int, list[str]]


def soak(directory: Path, duration_s: float, workers: int) -> Run:
    postgres = PostgresServer().start()
    try:
        database = postgres.new_database()
        replicas = {
            name: Service(SHARDPLAN, directory / f"{name}.log", db=database, workers=workers)
            for name in "AB"
        }
        for service in replicas.values():
            service.start()
        try:
            return drive(replicas, duration_s)
        finally:
            for service in replicas.values():
                service.stop()
    finally:
        postgres.destroy()


def drive(replicas: dict[str, Service], duration_s: float) -> Run:
    a, b = replicas["A"], replicas["B"]
    plan_ids = seed(a.base)
    rss_start = {name: worker_rss(s) for name, s in replicas.items()}
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    bases = [a.base, b.base]
    children = [
        context.Process(target=load, args=(bases, plan_ids, duration_s, results)),
        context.Process(target=probe, args=(bases, duration_s, results)),
    ]
    for child in children:
        child.start()
    time.sleep(duration_s / 2)
    killed = time.monotonic()
    b.kill()
    time.sleep(RESTART_PAUSE_S)
    b.start()
    restart_s = time.monotonic() - killed
    outcome = dict(results.get(timeout=duration_s + JOB_DEADLINE_S + 120) for _ in children)
    for child in children:
        child.join()
    return Run(
        load=outcome["load"],
        probe=outcome["probe"],
        rss_start=rss_start,
        rss_end={name: worker_rss(s) for name, s in replicas.items()},
        metrics_5xx={name: metrics_5xx(s.base) for name, s in replicas.items()},
        restart_s=restart_s,
        verified=verify_stored(a.base),
    )


# --------------------------------------------------------------------------- report


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[int(fraction * (len(ordered) - 1))] if ordered else float("nan")


def bucket(outcome: str) -> str:
    """ "ok" (2xx, 3xx, a hostile body sent), "4", "5", or "none" (no answer)."""
    if outcome == "sent" or outcome[:1] in ("2", "3"):
        return "ok"
    return outcome[0] if outcome.isdigit() else "none"


def rss_cell(run: Run, replica: str) -> str:
    start = ", ".join(size(v) for v in run.rss_start[replica].values()) or "-"
    end = ", ".join(size(v) for v in run.rss_end[replica].values()) or "-"
    return f"{start} → {end}"


def report(run: Run, duration_s: float, workers: int) -> str:
    outcomes = [(k, o, n) for k, o, n in run.load["outcomes"]]
    served = sum(n for _, o, n in outcomes if o.isdigit())
    errors_5xx = sum(n for _, o, n in outcomes if o.startswith("5"))
    unanswered = sum(n for _, o, n in outcomes if not o.isdigit() and o != "sent")
    latencies = run.probe["latencies"]["A"] + run.probe["latencies"]["B"]
    checked, wrong = run.verified
    jobs = ", ".join(f"{k} {v}" for k, v in sorted(run.load["jobs"].items())) or "none"
    by_replica = run.load["by_replica"]
    down = run.probe["unanswered"]
    p99s = " / ".join(f"{1000 * percentile(run.probe['latencies'][r], 0.99):.1f} ms" for r in "AB")
    healthz = " / ".join(f"{1000 * percentile(latencies, q):.1f} ms" for q in (0.5, 0.99, 1.0))
    rows = [
        ("duration, replicas", f"{duration_s:g} s, 2 × {workers} HTTP workers on one PostgreSQL"),
        ("requests served", f"{served} (A {by_replica.get('A', 0)}, B {by_replica.get('B', 0)})"),
        ("5xx answered (clients)", str(errors_5xx)),
        (
            "5xx counted by /metrics",
            f"A {run.metrics_5xx['A']}, B {run.metrics_5xx['B']} (B since its restart)",
        ),
        (
            "connection errors (each retried on the other replica) / requests lost",
            f"{unanswered} / {run.load['lost']}",
        ),
        ("B: SIGKILL → healthy again", f"{run.restart_s:.1f} s"),
        ("/healthz p50 / p99 / max (both replicas)", healthz),
        ("/healthz p99, A / B", p99s),
        ("/healthz probes unanswered", f"A {down.get('A', 0)}, B {down.get('B', 0)}"),
        ("HTTP worker RSS, A (after seeding → end)", rss_cell(run, "A")),
        ("HTTP worker RSS, B (first start → end, after its restart)", rss_cell(run, "B")),
        ("async jobs", jobs),
        ("stored plans verified (content address)", f"{checked - len(wrong)} of {checked}"),
    ]
    lines = ["| measure | value |", "| --- | --- |"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines += ["", "| request | answered | 2xx/3xx | 4xx | 5xx | unanswered | p50 ms | p99 ms |"]
    lines += ["| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for kind in sorted({k for k, _, _ in outcomes}):
        count: Counter[str] = Counter()
        for k, o, n in outcomes:
            count[bucket(o)] += n if k == kind else 0
        seconds = run.load["seconds"][kind]
        answered = count["ok"] + count["4"] + count["5"]
        lines.append(
            f"| {kind} | {answered} | {count['ok']} | {count['4']} | {count['5']} | "
            f"{count['none']} | {1000 * percentile(seconds, 0.5):.1f} | "
            f"{1000 * percentile(seconds, 0.99):.1f} |"
        )
    if wrong:
        lines += ["", f"plans whose bytes do not hash to their id: {', '.join(wrong)}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    parser.add_argument("--short", action="store_true", help=f"{SHORT_DURATION_S:g} s")
    parser.add_argument("--workers", type=int, default=2, help="HTTP workers per replica")
    args = parser.parse_args()
    duration_s = SHORT_DURATION_S if args.short else args.duration
    print(
        f"# {platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{duration_s:g} s of load, replica B killed at {duration_s / 2:g} s",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as directory:
        run = soak(Path(directory), duration_s, args.workers)
    print(report(run, duration_s, args.workers))


if __name__ == "__main__":
    main()
