"""Real servers for tests: a PostgreSQL cluster in a scratch directory, the shardplan
service as a subprocess on a free loopback port, and a faulty proxy to put in front of it.
Nothing is mocked; everything is torn down by the fixtures that start it, and every wait
is bounded."""

from __future__ import annotations

import contextlib
import glob
import http.server
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def postgres_bindir() -> Path:
    """Debian's server binaries (package ``postgresql``; ``.ci/run`` installs it)."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not candidates:
        found = shutil.which("initdb")
        assert found, (
            "PostgreSQL server binaries not found: install Debian's `postgresql` package "
            "(.ci/run does this with apt-get)"
        )
        return Path(found).parent
    return Path(candidates[-1]).parent


class PostgresServer:
    """A throwaway PostgreSQL cluster on a free port (trust auth on loopback only)."""

    USER = "shardplan"

    def __init__(self) -> None:
        self.bindir = postgres_bindir()
        # Under /tmp, not pytest's 0700 tree: the server runs as `postgres` when we are root.
        self.root = Path(tempfile.mkdtemp(prefix="shardplan-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")

    def _run(self, *args: str, timeout: float = 60) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=timeout)

    def start(self) -> PostgresServer:
        if not self.data.exists():
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", self.USER, "-E", "UTF8")
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=on"
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w",
            "-t", "60", "start",
        )  # fmt: skip
        return self

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh empty database; returns its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


class Service:
    """``shardplan serve`` in a subprocess; ``base`` is its URL once ``/healthz`` answers."""

    def __init__(
        self,
        exe: Path,
        log_path: Path,
        *,
        db: str,
        env: dict[str, str] | None = None,
        workers: int = 1,
        port: int | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.exe = exe
        self.args = args  # more of `shardplan serve`'s flags
        self.log_path = log_path
        self.db = db
        self.env = {**os.environ, "SHARDPLAN_SOLVE_WORKERS": "1", **(env or {})}
        self.workers = workers
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> Service:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                str(self.exe), "serve", "--host", "127.0.0.1", "--port", str(self.port),
                "--db", self.db, "--workers", str(self.workers), *self.args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,  # kill() takes the solver processes too
        )  # fmt: skip
        log.close()
        return self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = 60) -> Service:
        """Waits for ``/healthz`` on ``port`` from ``process``, started here or by the caller."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.base}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            assert self.process.poll() is None, self.log()
            assert time.monotonic() < deadline, f"server did not start in {timeout} s\n{self.log()}"
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole process group: no shutdown code runs."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def started_service(exe: Path, directory: Path, env: dict[str, str]) -> Service:
    """A started service with its log and SQLite store in ``directory``."""
    return Service(exe, directory / "log", db=str(directory / "plans.db"), env=env).start()


# --------------------------------------------------------------------------- faulty proxy


@dataclass(frozen=True)
class Fault:
    """How the proxy answers one request instead of forwarding it: a status with headers
    and a problem+json body, or (``reset``) a connection closed with a TCP reset before
    any answer."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    reset: bool = False

    @classmethod
    def connection_reset(cls) -> Fault:
        return cls(reset=True)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    at: float  # time.monotonic() when the request had been read


class FaultyProxy:
    """A real HTTP server on a free loopback port, in front of ``upstream`` (a base URL):
    it answers the requests it is given ``faults`` for with those, in order, then forwards
    the rest, passing each forwarded body through ``corrupt``. ``seen`` lists every request
    received, ``answered`` the status of each answer. ``upstream=None``: nothing to forward to (every request needs a fault).
    ``encoded``: bodies are passed on as sent (gzip stays gzip, ``Content-Encoding`` kept)
    and ``corrupt`` sees them so; otherwise they are decoded first. ``accept_encoding``:
    what the proxy asks the upstream for instead of what the client asked (a proxy that
    only knows gzip)."""

    def __init__(
        self,
        upstream: str | None,
        faults: list[Fault] | None = None,
        *,
        corrupt: Callable[[bytes], bytes] | None = None,
        encoded: bool = False,
        accept_encoding: str | None = None,
    ) -> None:
        self.upstream = upstream
        self.encoded = encoded
        self.accept_encoding = accept_encoding
        self.faults = list(faults or [])
        self.corrupt = corrupt
        self.seen: list[Seen] = []
        self.answered: list[int] = []
        self._lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ProxyHandler)
        self._server.daemon_threads = True
        self._server.proxy = self  # type: ignore[attr-defined]
        self.base = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FaultyProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def next_fault(self, seen: Seen) -> Fault | None:
        with self._lock:
            self.seen.append(seen)
            return self.faults.pop(0) if self.faults else None


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: http.server.ThreadingHTTPServer

    def _handle(self) -> None:
        proxy: FaultyProxy = self.server.proxy  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        headers = {key.lower(): value for key, value in self.headers.items()}
        fault = proxy.next_fault(Seen(self.command, self.path, headers, time.monotonic()))
        if fault is not None and fault.reset:
            # SO_LINGER 0: close() sends a RST, as a crashed or restarted server's host does.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        if fault is not None:
            problem = f'{{"title": "Injected", "status": {fault.status}, "detail": "fault"}}'
            self._answer(fault.status, fault.headers, problem.encode(), "application/problem+json")
            return
        assert proxy.upstream is not None, f"no fault left for {self.command} {self.path}"
        forwarded = {k: v for k, v in headers.items() if k not in _HOP_BY_HOP}
        if proxy.accept_encoding is not None:
            forwarded["accept-encoding"] = proxy.accept_encoding
        with httpx.Client(base_url=proxy.upstream, timeout=60) as upstream:
            request = upstream.build_request(self.command, self.path, content=body)
            request.headers.update(forwarded)
            response = upstream.send(request, stream=True)
            try:
                raw = b"".join(response.iter_raw()) if proxy.encoded else response.read()
            finally:
                response.close()
        content = proxy.corrupt(raw) if proxy.corrupt else raw
        dropped = _HOP_BY_HOP - {"content-encoding"} if proxy.encoded else _HOP_BY_HOP
        kept = {k: v for k, v in response.headers.items() if k.lower() not in dropped}
        self._answer(response.status_code, kept, content, None)

    def _answer(
        self, status: int, headers: dict[str, str], body: bytes, content_type: str | None
    ) -> None:
        self.server.proxy.answered.append(status)  # type: ignore[attr-defined]
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        if content_type:
            self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _handle

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host"}
)
