"""How soon an async solve's job runs again after its server is SIGKILLed mid-solve.

    .venv/bin/python -m benchmarks.resume_bench [--leases 2,15]

For each lease (``SHARDPLAN_JOB_LEASE_S``): start ``shardplan serve`` on a fresh SQLite
store, POST a request that runs to its 4 s time limit with ``Prefer: respond-async``,
wait until its job is running, SIGKILL the server's process group, start another on the
same store and port, and time (from the kill) when it answers ``/healthz``, when the job
runs again (attempt 2) and when it is done. The job runs again once its lease lapses:
about the lease after the killed process last renewed it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx

from planner_service.plan.api import SolveJob, SolveJobStatus
from tests.service.test_solves import timed_request
from tests.support.servers import Service

ASYNC = {"Prefer": "respond-async"}


def _job(http: httpx.Client, job_id: str) -> SolveJob:
    return SolveJob.model_validate_json(http.get(f"/v1/solves/{job_id}").content)


def _until(http: httpx.Client, job_id: str, done: object, timeout_s: float = 300) -> SolveJob:
    deadline = time.monotonic() + timeout_s
    while True:
        job = _job(http, job_id)
        if done(job):  # type: ignore[operator]
            return job
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job_id} stuck: {job}")
        time.sleep(0.05)


def measure(exe: Path, lease_s: str, seed: int) -> str:
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        env = {"SHARDPLAN_JOB_LEASE_S": lease_s}
        db = str(directory / "plans.db")
        server = Service(exe, directory / "log", db=db, env=env).start()
        with httpx.Client(base_url=server.base, timeout=30) as http:
            posted = http.post("/v1/plans", json=timed_request(seed, 4.0), headers=ASYNC)
            job_id = posted.json()["job_id"]
            _until(http, job_id, lambda job: job.status is SolveJobStatus.RUNNING)
        server.kill()
        killed = time.monotonic()
        restarted = Service(exe, directory / "log2", db=db, env=env, port=server.port).start()
        healthy = time.monotonic()
        try:
            with httpx.Client(base_url=restarted.base, timeout=30) as http:
                _until(http, job_id, lambda job: job.attempts == 2 and not job.status.ended)
                resumed = time.monotonic()
                job = _until(http, job_id, lambda job: job.status.ended)
                ended = time.monotonic()
        finally:
            restarted.stop()
    return (
        f"| {lease_s} | {healthy - killed:.1f} | {resumed - killed:.1f} | {ended - killed:.1f} "
        f"| {job.status.value} | {job.attempts} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leases", default="2,15", help="SHARDPLAN_JOB_LEASE_S values")
    args = parser.parse_args()
    exe = Path(sys.executable).parent / "shardplan"
    print("| lease s | healthy s | running again s | done s | status | attempts |")
    print("| --- | --- | --- | --- | --- | --- |")
    for seed, lease_s in enumerate(args.leases.split(","), start=30):
        print(measure(exe, lease_s.strip(), seed), flush=True)


if __name__ == "__main__":
    main()
