"""Real servers for tests: a PostgreSQL cluster in a scratch directory and the shardplan
service as a subprocess on a free loopback port. Nothing is mocked; everything is torn
down by the fixtures that start it, and every wait is bounded."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
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
    ) -> None:
        self.exe = exe
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
                "--db", self.db, "--workers", str(self.workers),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,  # kill() takes the solver processes too
        )  # fmt: skip
        log.close()
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
