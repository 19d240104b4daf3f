"""Cached plan fetches per second: the service's ``GET /v1/plans/{id}`` against nginx serving
the same bytes as static files, on the same machine, in the same run.

    .venv/bin/python -m benchmarks.serve_bench [--workers 1 2] [--duration 10] [--repeats 3]

Needs Debian's nginx and wrk (``apt-get install nginx wrk``); measures granian too when it is
installed (``pip install granian``: an alternative ASGI server, not a dependency). The plan
is a real one: the NVIDIA "medium" model (311 tables) on 136 ranks, about 1 MB of JSON,
stored by ``POST /v1/plans``. nginx serves its identity bytes and, with ``gzip_static on``,
the service's own stored gzip bytes (``<plan_id>.gz``) to clients that accept gzip; zstd is
measured for the service alone (Debian's nginx has no zstd module). With one worker, the
"floor" is uvicorn running ``serve_floor``, an app that sends the same bytes and does
nothing else: the most any app under uvicorn can serve here. For each worker count
(the same for every server) and each encoding, every server's answer is checked byte for
byte, then ``wrk -t2 -c64`` runs ``--repeats`` rounds of ``--duration``
seconds against each server in turn (interleaved, so drift hits all alike); the table
gives the median round.
"""

from __future__ import annotations

import argparse
import gzip
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from benchmarks.workloads import nvidia_tables, workload_request
from planner_service.plan.canonical import canonical_bytes
from tests.support.servers import Service, free_port

SHARDPLAN = Path(sys.executable).parent / "shardplan"
GRANIAN = Path(sys.executable).parent / "granian"
UVICORN = Path(sys.executable).parent / "uvicorn"
ENCODINGS = ("identity", "gzip", "zstd")
NGINX_ENCODINGS = ("identity", "gzip")  # Debian's nginx has no zstd module


def machine() -> str:
    return (
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )


def plan_request() -> bytes:
    request = workload_request(nvidia_tables("medium"), 136, options={"time_limit_s": 0.5})
    return canonical_bytes(request)


def run_wrk(url: str, duration: int, connections: int, encoding: str) -> dict[str, float]:
    output = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{duration}s", "--latency",
         "-H", f"Accept-Encoding: {encoding}", url],
        capture_output=True, text=True, timeout=duration + 60, check=True,
    ).stdout  # fmt: skip
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    socket_errors = re.search(r"Socket errors: (.*)", output)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", output)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    return {
        "rps": rps,
        "errors": (int(errors.group(1)) if errors else 0) + _socket_errors(socket_errors),
        "p99_ms": float(p99.group(1)) * scale[p99.group(2)] if p99 else float("nan"),
    }


def _socket_errors(match: re.Match[str] | None) -> int:
    return sum(int(n) for n in re.findall(r"\d+", match.group(1))) if match else 0


def _raw(url: str, encoding: str) -> bytes:
    """The body as the server sent it for ``Accept-Encoding: <encoding>`` (not decoded)."""
    with httpx.stream("GET", url, headers={"Accept-Encoding": encoding}, timeout=60) as response:
        response.raise_for_status()
        return b"".join(response.iter_raw())


def check_answer(url: str, encoding: str, bodies: dict[str, bytes]) -> None:
    """The server gives exactly the stored bytes of the representation asked for."""
    with httpx.stream("GET", url, headers={"Accept-Encoding": encoding}, timeout=60) as response:
        raw = b"".join(response.iter_raw())
    assert response.status_code == 200, (url, response.status_code)
    assert raw == bodies[encoding], (url, encoding)
    assert response.headers.get("content-encoding", "identity") == encoding, url


# --------------------------------------------------------------------------- servers


NGINX_CONF = """
daemon off;
worker_processes {workers};
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 8192; }}
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
        listen 127.0.0.1:{port} backlog=4096;
        root {root}/www;
        default_type application/json;
        etag on;
        gzip_static on;
        gzip_vary on;
    }}
}}
"""


@contextmanager
def nginx(root: Path, plan_id: str, identity: bytes, gzipped: bytes, workers: int) -> Iterator[str]:
    """nginx serving ``identity`` at /v1/plans/<plan_id>, and ``gzipped`` for it to clients
    that accept gzip; yields the URL."""
    executable = shutil.which("nginx") or "/usr/sbin/nginx"
    (root / "tmp").mkdir(parents=True)
    target = root / "www" / "v1" / "plans" / plan_id
    target.parent.mkdir(parents=True)
    target.write_bytes(identity)
    target.with_name(f"{plan_id}.gz").write_bytes(gzipped)
    port = free_port()
    conf = root / "nginx.conf"
    conf.write_text(NGINX_CONF.format(workers=workers, root=root, port=port))
    # nginx's workers run as `nobody`: they must be able to read the files.
    for path in (root.parent, root, root / "www", target.parent.parent, target.parent):
        path.chmod(0o755)
    for path in target.parent.iterdir():
        path.chmod(0o644)
    process = subprocess.Popen(
        [executable, "-c", str(conf), "-p", str(root)],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/v1/plans/{plan_id}"
        _wait(url, process, lambda: (root / "error.log").read_text())
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=20)


@contextmanager
def shardplan(root: Path, db: str, plan_id: str, workers: int) -> Iterator[str]:
    """``shardplan serve --workers N`` (uvicorn) on the stored plan; yields its URL with every
    worker's plan cache filled."""
    service = Service(
        SHARDPLAN, root / f"uvicorn-{workers}.log", db=db, workers=workers,
        env={"SHARDPLAN_SOLVE_WORKERS": "1"},
    ).start()  # fmt: skip
    try:
        url = f"{service.base}/v1/plans/{plan_id}"
        _fill_caches(url, workers)
        yield url
    finally:
        service.stop()


@contextmanager
def granian(root: Path, db: str, plan_id: str, workers: int) -> Iterator[str]:
    """The same app (``create_served_app``) under granian, a Rust HTTP server."""
    port = free_port()
    env = {**os.environ, "SHARDPLAN_DATABASE_URL": db, "SHARDPLAN_SOLVE_WORKERS": "1"}
    log = (root / f"granian-{workers}.log").open("ab")
    process = subprocess.Popen(
        [str(GRANIAN), "--interface", "asgi", "--http", "1", "--factory",
         "planner_service.service.app:create_served_app", "--host", "127.0.0.1",
         "--port", str(port), "--workers", str(workers), "--log-level", "warning"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    log.close()
    try:
        url = f"http://127.0.0.1:{port}/v1/plans/{plan_id}"
        _wait(url, process, lambda: (root / f"granian-{workers}.log").read_text())
        _fill_caches(url, workers)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


@contextmanager
def floor(root: Path, plan_id: str, bodies: dict[str, bytes]) -> Iterator[str]:
    """uvicorn (uvloop, httptools, as ``shardplan serve``) running ``serve_floor``: the
    same bytes from an app that does nothing else, so the most uvicorn can give."""
    folder = root / "floor"
    folder.mkdir(exist_ok=True)
    for encoding, body in bodies.items():
        (folder / encoding).write_bytes(body)
    port = free_port()
    env = {**os.environ, "FLOOR_PLAN_DIR": str(folder)}
    process = subprocess.Popen(
        [str(UVICORN), "--factory", "benchmarks.serve_floor:create", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning", "--no-access-log"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/v1/plans/{plan_id}"
        _wait(url, process, lambda: "")
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def _wait(url: str, process: subprocess.Popen[bytes], log: object) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            os.killpg(process.pid, signal.SIGKILL)
            raise RuntimeError(f"{url} did not start: {log() if callable(log) else ''}")
        time.sleep(0.1)


def _fill_caches(url: str, workers: int) -> None:
    """Enough fetches that every worker has read the plan from the store once (the kernel
    spreads connections over the workers)."""
    for _ in range(workers * 8):
        with httpx.Client() as client:  # a new connection each time
            client.get(url).raise_for_status()


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="shardplan-serve-bench-"))
    print(f"{machine()}; wrk -t2 -c{args.connections} -d{args.duration}s, median of "
          f"{args.repeats} interleaved rounds")  # fmt: skip
    db = str(root / "plans.db")
    rows = []
    try:
        setup = Service(SHARDPLAN, root / "setup.log", db=db).start()
        try:
            created = httpx.post(f"{setup.base}/v1/plans", content=plan_request(), timeout=600)
            created.raise_for_status()
            identity, plan_id = created.content, created.headers["x-shardplan-plan-id"]
            bodies = {
                encoding: _raw(f"{setup.base}/v1/plans/{plan_id}", encoding)
                for encoding in ENCODINGS
            }
        finally:
            setup.stop()
        assert bodies["identity"] == identity == gzip.decompress(bodies["gzip"])
        gzipped = bodies["gzip"]
        print(", ".join(f"{encoding} {len(body):,} bytes" for encoding, body in bodies.items()))
        for workers in args.workers:
            with ExitStack() as servers:
                urls = {
                    f"nginx ({workers} workers)": servers.enter_context(
                        nginx(root / f"nginx-{workers}", plan_id, identity, gzipped, workers)
                    ),
                    f"shardplan, uvicorn ({workers} workers)": servers.enter_context(
                        shardplan(root, db, plan_id, workers)
                    ),
                }
                if GRANIAN.exists():
                    urls[f"shardplan, granian ({workers} workers)"] = servers.enter_context(
                        granian(root, db, plan_id, workers)
                    )
                if workers == 1:
                    urls["uvicorn floor: constant bytes (1 worker)"] = servers.enter_context(
                        floor(root, plan_id, bodies)
                    )
                for encoding in ENCODINGS:
                    serving = {
                        name: url
                        for name, url in urls.items()
                        if encoding in NGINX_ENCODINGS or not name.startswith("nginx")
                    }
                    for url in serving.values():
                        check_answer(url, encoding, bodies)
                    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in serving}
                    for _ in range(args.repeats):
                        for name, url in serving.items():
                            rounds[name].append(
                                run_wrk(url, args.duration, args.connections, encoding)
                            )
                    nginx_rps = statistics.median(
                        r["rps"] for r in rounds.get(f"nginx ({workers} workers)", [{"rps": 0}])
                    )
                    size = len(bodies[encoding])
                    for name, results in rounds.items():
                        rps = statistics.median(r["rps"] for r in results)
                        rows.append((
                            workers, encoding, name, rps, min(r["rps"] for r in results),
                            max(r["rps"] for r in results), rps * size / 1e6,
                            statistics.median(r["p99_ms"] for r in results),
                            sum(int(r["errors"]) for r in results),
                            rps / nginx_rps if nginx_rps else 0.0,
                        ))  # fmt: skip
                        print(f"  {workers} {encoding} {name}: {rps:.0f} req/s", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print("| workers | encoding | server | req/s | range | MB/s | p99 ms | errors | vs nginx |")
    print("| ---: | --- | --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for workers, encoding, name, rps, low, high, mbps, p99, errors, ratio in rows:
        versus = f"{ratio:.2f}×" if ratio else "—"
        print(
            f"| {workers} | {encoding} | {name} | {rps:,.0f} | {low:,.0f}–{high:,.0f} | "
            f"{mbps:,.0f} | {p99:.1f} | {errors} | {versus} |"
        )


if __name__ == "__main__":
    main()
