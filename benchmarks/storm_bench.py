"""A startup storm: every rank of a job fetches its plan through the client at once.

    .venv/bin/python -m benchmarks.storm_bench [--fetches 4096] [--processes 8] [--workers 2]

The plan is the 1 MB one of ``serve_bench`` (NVIDIA "medium", 136 ranks), stored by
``POST /v1/plans`` in a ``shardplan serve --workers N`` on loopback. ``--processes`` client
processes each open ``fetches / processes`` ``AsyncPlannerClient``s (one connection each,
as each rank has its own), report ready, and at one start signal all call ``get_plan``
together: the client sends the request, decodes the body and verifies the plan id on the
decoded bytes. Each fetch's latency runs from the start signal to its verified plan. The
same storm also runs as bare httpx GETs whose decoded bodies' sha256 is checked (the wire
alone: no parse, no model). Each runs compressed (the client's default: it accepts zstd and
gzip, and the service sends zstd) and ``compressed=False`` (identity). Bounded: every fetch
has the client's own timeouts (90 s a step) and retries, and each storm ends by
``--deadline`` seconds.

On a machine with fewer cores than client processes, the clients' own decoding and
verification (CPU) share the cores with the service: the CPU seconds columns say how much
of the wall time that is.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.serve_bench import SHARDPLAN, machine, plan_request
from tests.support.servers import Service


def child(
    base: str, plan_id: str, count: int, compressed: bool, deadline_s: float, mode: str,
    sha: str,
) -> None:  # fmt: skip
    """One client process: ``count`` clients, a line "ready", then (on a line with the
    start time) every fetch at once; prints one JSON line of results. ``mode`` "client":
    ``AsyncPlannerClient.get_plan``; "wire": an httpx GET, the decoded body's sha256
    compared with ``sha``."""
    from clients.http.client import DEFAULT_TIMEOUT_S, AsyncPlannerClient

    url = f"{base}/v1/plans/{plan_id}"
    accept = {"Accept-Encoding": "zstd, gzip" if compressed else "identity"}

    async def get_plan(client: AsyncPlannerClient) -> None:
        plan = await client.get_plan(plan_id)
        assert plan.plan_id == plan_id

    async def get_bytes(client: httpx.AsyncClient) -> None:
        response = await client.get(url, headers=accept)
        assert response.status_code == 200 and hashlib.sha256(response.content).hexdigest() == sha

    async def run() -> dict[str, object]:
        # The client's own timeouts and retries, as a rank has them; a bare GET gets the
        # same timeout and no retry.
        clients: list[Any] = [
            AsyncPlannerClient(base, compressed=compressed)
            if mode == "client"
            else httpx.AsyncClient(timeout=DEFAULT_TIMEOUT_S)
            for _ in range(count)
        ]
        get = get_plan if mode == "client" else get_bytes
        print("ready", flush=True)
        started = float(sys.stdin.readline())
        await asyncio.sleep(max(0.0, started - time.time()))  # every process starts together
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        latencies: list[float] = []
        errors: list[str] = []

        async def fetch(client: Any) -> None:
            try:
                await get(client)
                latencies.append(time.time() - started)
            except Exception as error:  # counted and reported, not raised
                errors.append(f"{type(error).__name__}: {error}"[:200])

        try:
            await asyncio.wait_for(asyncio.gather(*(fetch(c) for c in clients)), timeout=deadline_s)
        except TimeoutError:
            errors.append(f"deadline of {deadline_s} s")
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.gather(*(c.aclose() for c in clients))
        cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (
            cpu_after.ru_stime - cpu_before.ru_stime
        )
        return {"latencies": latencies, "errors": errors, "cpu_s": cpu}

    print(json.dumps(asyncio.run(run())), flush=True)


def storm(
    service: Service, plan_id: str, fetches: int, processes: int, compressed: bool,
    deadline_s: float, mode: str, sha: str,
) -> dict[str, float]:  # fmt: skip
    assert service.process is not None
    base, group = service.base, service.process.pid
    counts = [fetches // processes + (i < fetches % processes) for i in range(processes)]
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.storm_bench",
                "--child",
                base,
                plan_id,
                str(count),
                str(int(compressed)),
                str(deadline_s),
                mode,
                sha,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for count in counts
    ]
    try:
        for process in children:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        service_cpu = _group_cpu(group)
        started = time.time() + 0.2
        for process in children:
            assert process.stdin is not None
            process.stdin.write(f"{started}\n")
            process.stdin.flush()
        results = []
        for process in children:
            out, _ = process.communicate(timeout=deadline_s + 60)
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for process in children:
            if process.poll() is None:
                process.kill()
    wall = time.time() - started
    latencies = sorted(x for r in results for x in r["latencies"])
    errors = [e for r in results for e in r["errors"]]
    if errors:
        print(f"  {len(errors)} errors, e.g. {errors[:3]}", file=sys.stderr)
    return {
        "errors": len(errors),
        "ok": len(latencies),
        "fetches": fetches,
        "p50_s": statistics.median(latencies) if latencies else float("nan"),
        "p99_s": latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("nan"),
        "max_s": latencies[-1] if latencies else float("nan"),
        "wall_s": wall,
        "client_cpu_s": sum(r["cpu_s"] for r in results),
        "service_cpu_s": _group_cpu(group) - service_cpu,
    }


def _group_cpu(group: int) -> float:
    """CPU seconds (user + system) used so far by the live processes of process group
    ``group``: the service's supervisor, its workers and their solver processes."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # ended meanwhile
        if int(fields[2]) == group:  # pgrp; utime and stime follow at 11 and 12
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        base, plan, count, packed, deadline, how, digest = sys.argv[2:9]
        child(base, plan, int(count), packed == "1", float(deadline), how, digest)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fetches", type=int, default=4096)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--deadline", type=float, default=600.0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="shardplan-storm-bench-"))
    print(f"{machine()}; {args.fetches} fetches from {args.processes} client processes; "
          f"shardplan serve --workers {args.workers}")  # fmt: skip
    rows = []
    try:
        service = Service(
            SHARDPLAN, root / "service.log", db=str(root / "plans.db"), workers=args.workers
        ).start()
        try:
            created = httpx.post(f"{service.base}/v1/plans", content=plan_request(), timeout=600)
            created.raise_for_status()
            plan_id = created.headers["x-shardplan-plan-id"]
            sha = hashlib.sha256(created.content).hexdigest()
            print(f"plan {plan_id[:12]}…: {len(created.content):,} bytes")
            for compressed in (True, False):
                for mode in ("wire", "client"):
                    result = storm(
                        service, plan_id, args.fetches, args.processes, compressed,
                        args.deadline, mode, sha,
                    )  # fmt: skip
                    rows.append((mode, "zstd" if compressed else "identity", result))
                    print(f"  {mode} {rows[-1][1]}: {result}", flush=True)
        finally:
            service.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print("| fetch | encoding | verified | errors | p50 s | p99 s | max s | wall s | "
          "client CPU s | client CPU ms / fetch | service CPU s |")  # fmt: skip
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode, name, r in rows:
        fetch = "AsyncPlannerClient.get_plan" if mode == "client" else "httpx GET + sha256"
        print(
            f"| {fetch} | {name} | {r['ok']}/{r['fetches']} | {r['errors']} | {r['p50_s']:.2f} | "
            f"{r['p99_s']:.2f} | {r['max_s']:.2f} | {r['wall_s']:.2f} | {r['client_cpu_s']:.0f} | "
            f"{1000 * r['client_cpu_s'] / r['fetches']:.0f} | {r['service_cpu_s']:.1f} |"
        )


if __name__ == "__main__":
    main()
