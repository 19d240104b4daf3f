"""Plan fetch load: the service's cached GET /v1/plans/{id} against nginx serving the same
bytes as a static file, on the same machine, in the same run.

    .venv/bin/python -m benchmarks.serve_bench [--workers 1 2] [--duration 10]

Needs Debian's nginx and wrk (``apt-get install nginx wrk``). The plan is a real one: the
NVIDIA "medium" model (311 tables) on 136 ranks, about 1 MB of JSON. For each server:

- burst: 1,024 concurrent clients (one connection each, from a second process) fetch the
  plan once, like every rank of a 1,024-rank job at startup; all must get the exact bytes;
  p50/p99/max latency and the time until the last one finished;
- sustained: ``wrk`` with 2 threads and 64 connections for ``--duration`` seconds;
  requests per second and ours / nginx.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.workloads import nvidia_tables, workload_request
from planner_service.plan.codec import canonical_bytes
from tests.servers import Service, free_port

SHARDPLAN = Path(sys.executable).parent / "shardplan"


def plan_request() -> bytes:
    request = workload_request(nvidia_tables("medium"), 136, options={"time_limit_s": 0.5})
    return canonical_bytes(request)


# --------------------------------------------------------------------------- load


def burst(url: str, clients: int, expected_sha: str) -> dict[str, float]:
    """Runs in a child process: ``clients`` concurrent connections, one GET each."""
    return asyncio.run(_burst(url, clients, expected_sha))


async def _burst(url: str, clients: int, expected_sha: str) -> dict[str, float]:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    start_gate = asyncio.Event()
    latencies: list[float] = []
    failures = 0
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:

        async def fetch() -> None:
            nonlocal failures
            await start_gate.wait()
            began = time.perf_counter()
            try:
                response = await client.get(url)
                ok = (
                    response.status_code == 200
                    and hashlib.sha256(response.content).hexdigest() == expected_sha
                )
            except httpx.HTTPError:
                ok = False
            latencies.append(time.perf_counter() - began)
            failures += not ok

        tasks = [asyncio.create_task(fetch()) for _ in range(clients)]
        await asyncio.sleep(0.1)
        began = time.perf_counter()
        start_gate.set()
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - began
    latencies.sort()
    return {
        "clients": clients,
        "ok": clients - failures,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
        "max_ms": 1000 * latencies[-1],
        "wall_s": wall,
    }


def run_burst(url: str, clients: int, expected_sha: str) -> dict[str, float]:
    output = subprocess.run(
        [sys.executable, "-m", "benchmarks.serve_bench", "--burst-child", url, str(clients),
         expected_sha],
        capture_output=True, text=True, timeout=600, check=True,
    ).stdout  # fmt: skip
    return dict(json.loads(output))


def run_wrk(url: str, duration: int, connections: int) -> dict[str, float]:
    output = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{duration}s", "--latency", url],
        capture_output=True, text=True, timeout=duration + 60, check=True,
    ).stdout  # fmt: skip
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", output)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    return {
        "rps": rps,
        "non_2xx": int(errors.group(1)) if errors else 0,
        "p99_ms": float(p99.group(1)) * scale[p99.group(2)] if p99 else float("nan"),
    }


# --------------------------------------------------------------------------- nginx


NGINX_CONF = """
daemon off;
worker_processes {workers};
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    client_body_temp_path {root}/tmp;
    proxy_temp_path {root}/tmp;
    fastcgi_temp_path {root}/tmp;
    uwsgi_temp_path {root}/tmp;
    scgi_temp_path {root}/tmp;
    server {{
        listen 127.0.0.1:{port};
        root {root}/www;
        default_type application/json;
        etag on;
    }}
}}
"""


def start_nginx(
    root: Path, plan_id: str, data: bytes, workers: int
) -> tuple[subprocess.Popen[bytes], str]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    (root / "tmp").mkdir(parents=True)
    target = root / "www" / "v1" / "plans" / plan_id
    target.parent.mkdir(parents=True)
    target.write_bytes(data)
    port = free_port()
    conf = root / "nginx.conf"
    conf.write_text(NGINX_CONF.format(workers=workers, root=root, port=port))
    # nginx's workers run as `nobody`: they must be able to read the file.
    for path in (root.parent, root, root / "www", target.parent.parent, target.parent):
        path.chmod(0o755)
    target.chmod(0o644)
    process = subprocess.Popen(
        [nginx, "-c", str(conf), "-p", str(root)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1/plans/{plan_id}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            os.killpg(process.pid, signal.SIGKILL)
            raise RuntimeError("nginx did not start: " + (root / "error.log").read_text())
        time.sleep(0.1)


# --------------------------------------------------------------------------- main


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--burst-child":
        _raise_fd_limit()
        url, clients, sha = sys.argv[2], int(sys.argv[3]), sys.argv[4]
        print(json.dumps(burst(url, clients, sha)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--nginx-workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--clients", type=int, default=1024)
    args = parser.parse_args()
    _raise_fd_limit()
    root = Path(tempfile.mkdtemp(prefix="shardplan-serve-bench-"))
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs"
    print(f"machine: {machine}, Python {platform.python_version()}")
    rows = []
    try:
        data, plan_id = b"", ""
        for workers in args.workers:
            service = Service(
                SHARDPLAN, root / f"service-{workers}.log", db=str(root / "plans.db"),
                env={"SHARDPLAN_SOLVE_WORKERS": "1"}, workers=workers,
            ).start()  # fmt: skip
            try:
                response = httpx.post(
                    f"{service.base}/v1/plans", content=plan_request(), timeout=600
                )
                response.raise_for_status()
                data, plan_id = response.content, response.headers["x-shardplan-plan-id"]
                url = f"{service.base}/v1/plans/{plan_id}"
                sha = hashlib.sha256(data).hexdigest()
                for _ in range(workers * 4):  # fill each worker's in-memory plan cache
                    httpx.get(url)
                rows.append(
                    (f"shardplan --workers {workers}", run_burst(url, args.clients, sha),
                     run_wrk(url, args.duration, args.connections))
                )  # fmt: skip
            finally:
                service.stop()
        nginx, url = start_nginx(root / "nginx", plan_id, data, args.nginx_workers)
        try:
            sha = hashlib.sha256(data).hexdigest()
            rows.append(
                (f"nginx ({args.nginx_workers} workers)", run_burst(url, args.clients, sha),
                 run_wrk(url, args.duration, args.connections))
            )  # fmt: skip
        finally:
            os.killpg(nginx.pid, signal.SIGTERM)
            nginx.wait(timeout=20)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    nginx_rps = rows[-1][2]["rps"]
    print(f"plan: {len(data):,} bytes; burst: {args.clients} clients; sustained: wrk -t2 "
          f"-c{args.connections} -d{args.duration}s")  # fmt: skip
    print(
        "| server | burst ok | burst p50 ms | burst p99 ms | burst max ms | burst wall s "
        "| sustained req/s | sustained p99 ms | non-2xx | vs nginx |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, b, w in rows:
        print(
            f"| {name} | {b['ok']}/{b['clients']} | {b['p50_ms']:.0f} | {b['p99_ms']:.0f} | "
            f"{b['max_ms']:.0f} | {b['wall_s']:.2f} | {w['rps']:.0f} | {w['p99_ms']:.1f} | "
            f"{w['non_2xx']} | {w['rps'] / nginx_rps:.2f}x |"
        )


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 16384)), hard))


if __name__ == "__main__":
    main()
