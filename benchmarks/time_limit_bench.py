"""Does ``options.time_limit_s`` hold? Requested against measured wall time, on an idle
machine and beside a CPU hog, as three clocks see it (``--mode``):

- ``solve``: around ``solve()`` only, in a fresh child process (enumeration to sealed plan);
- ``cli``: the ``shardplan plan REQUEST -o FILE`` command, from spawn to exit, less the
  measured start of a bare ``python -c pass`` (the interpreter's own start, outside the
  contract); imports, reading the request and writing the plan are inside it;
- ``service``: a real ``shardplan serve`` (one solver process, SQLite), ``POST /v1/plans``
  from the request sent to the answer read; each request is new to the store.

    .venv/bin/python -m benchmarks.time_limit_bench [--mode solve,cli,service]
        [--limits 1,5,10] [--hogs 2] [--workloads criteo/8,medium/32,...] [--json out.json]

The contract is wall time <= time_limit_s + max(5%, 0.25 s). The hog is ``--hogs`` busy
processes (default: one per core), started before the measurement and stopped after, so
the solver shares every core with them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.workloads import named_workload, nvidia_tables, workload_request
from planner_service.plan.canonical import canonical_bytes
from planner_service.solve.deadline import finish_slack_s

DEFAULT_WORKLOADS = (
    "criteo/8",
    "criteo-60/16",
    "small/32",
    "medium/32",
    "large/128",
    "colossal/128",
    "colossal-10000/128",
)

CHILD = """
import json, sys, time
from benchmarks.time_limit_bench import build
from planner_service.solve.pipeline import solve
request = build(sys.argv[1], float(sys.argv[2]))
start = time.perf_counter()
outcome = solve(request)
wall = time.perf_counter() - start
plan = outcome.plan
print(json.dumps({
    "wall_s": wall,
    "status": (plan.solver.status if plan else outcome.infeasibility.status).value,
    "stop_reason": plan.solver.stop_reason.value if plan and plan.solver.stop_reason else "-",
    "gap": plan.solver.gap if plan else None,
}))
"""


def build(name: str, time_limit_s: float) -> Any:
    """A workload by name: ``model/world_size``, a public workload
    (``workloads.named_workload``: ``criteo-60`` is the multi-host reproducer) or
    ``colossal-10000``, the colossal model's tables repeated to 10,000."""
    model, world = name.split("/")
    options = {"time_limit_s": time_limit_s, "gap_limit": 0}
    if model.startswith("colossal-"):
        base = nvidia_tables("colossal")
        count = int(model.split("-")[1])
        tables = [dict(base[i % len(base)], name=f"t{i}") for i in range(count)]
        return workload_request(tables, int(world), options=options)
    return named_workload(model, int(world), options)


def _hog() -> None:
    while True:
        pass


@contextlib.contextmanager
def hogging(hogs: int) -> Iterator[None]:
    """``hogs`` busy processes while the block runs."""
    workers = [multiprocessing.Process(target=_hog, daemon=True) for _ in range(hogs)]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        for worker in workers:
            worker.terminate()
            worker.join()


def run(mode: str, name: str, limit: float, hogs: int, context: Context) -> dict[str, Any]:
    """One measurement of ``mode`` on workload ``name`` at ``limit`` beside ``hogs``."""
    with hogging(hogs):
        if mode == "cli":
            result = _run_cli(name, limit, context)
        elif mode == "service":
            result = _run_service(name, limit, context)
        else:
            result = _run_solve(name, limit)
    if "error" in result:
        return result
    result["over_s"] = result["wall_s"] - limit
    result["within"] = result["wall_s"] <= limit + finish_slack_s(limit)
    return result


def _run_solve(name: str, limit: float) -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, "-c", CHILD, name, str(limit)],
        capture_output=True,
        text=True,
        timeout=limit * 20 + 300,
        check=False,
        env=_env(),
    )
    if completed.returncode != 0:
        return {"error": completed.stderr[-300:]}
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


@dataclass
class Context:
    """What the cli and service modes share: a scratch folder, the bare interpreter's
    start, the server (started on first use) and a counter that makes requests new."""

    folder: Path
    bare_start_s: float = 0.0
    server: subprocess.Popen[bytes] | None = None
    base: str = ""
    salt: int = 0

    def close(self) -> None:
        if self.server is not None:
            self.server.terminate()
            self.server.wait(timeout=60)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.getcwd()}


def _request_file(name: str, limit: float, context: Context) -> Path:
    """The workload's request in a file, made new (a seed) so no store has its plan."""
    context.salt += 1
    request = build(name, limit)
    request = request.model_copy(
        update={"options": request.options.model_copy(update={"seed": context.salt})}
    )
    path = context.folder / f"request-{context.salt}.json"
    path.write_bytes(canonical_bytes(request))
    return path


def _bare_start_s() -> float:
    """The interpreter's own start, the least of five: what the CLI's clock leaves out."""
    times = []
    for _ in range(5):
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.monotonic() - started)
    return min(times)


def _run_cli(name: str, limit: float, context: Context) -> dict[str, Any]:
    path = _request_file(name, limit, context)
    exe = Path(sys.executable).parent / "shardplan"
    started = time.monotonic()
    completed = subprocess.run(
        [str(exe), "plan", str(path), "-o", str(context.folder / "plan.json")],
        capture_output=True,
        text=True,
        timeout=limit * 20 + 300,
        check=False,
        env=_env(),
    )
    wall_s = time.monotonic() - started - context.bare_start_s
    if completed.returncode not in (0, 3):
        return {"error": completed.stderr[-300:]}
    return {"wall_s": wall_s, **_outcome(context.folder / "plan.json", completed.returncode)}


def _outcome(path: Path, code: int) -> dict[str, Any]:
    """Status, stop reason and gap of the plan (or the explanation) in ``path``."""
    document = json.loads(path.read_bytes())
    if code != 0 or "solver" not in document:
        return {"status": document.get("status", "-"), "stop_reason": "-", "gap": None}
    solver = document["solver"]
    return {
        "status": solver["status"],
        "stop_reason": solver.get("stop_reason") or "-",
        "gap": solver["gap"],
    }


def _run_service(name: str, limit: float, context: Context) -> dict[str, Any]:
    if context.server is None:
        _start_server(context)
    body = _request_file(name, limit, context).read_bytes()
    with httpx.Client(base_url=context.base, timeout=limit * 20 + 300) as http:
        started = time.monotonic()
        answer = http.post("/v1/plans", content=body)
        wall_s = time.monotonic() - started
    if answer.status_code not in (200, 201, 422):
        return {"error": f"{answer.status_code} {answer.text[:300]}"}
    path = context.folder / "answer.json"
    document = answer.json()
    path.write_bytes(json.dumps(document.get("infeasibility", document)).encode())
    return {"wall_s": wall_s, **_outcome(path, 0 if answer.status_code < 300 else 3)}


def _start_server(context: Context) -> None:
    """``shardplan serve`` on a free port with one solver process and its own SQLite."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    exe = Path(sys.executable).parent / "shardplan"
    env = {**_env(), "SHARDPLAN_SOLVE_WORKERS": "1"}
    context.server = subprocess.Popen(
        [str(exe), "serve", "--port", str(port), "--db", str(context.folder / "plans.db")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    context.base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{context.base}/healthz", timeout=2).status_code == 200:
                time.sleep(3)  # the solver and CPU-lane processes finish starting
                return
        time.sleep(0.2)
    raise RuntimeError("shardplan serve did not answer /healthz within 120 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="solve", help="solve, cli, service: comma-separated")
    parser.add_argument("--limits", default="1,5")
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    parser.add_argument("--json")
    args = parser.parse_args()
    limits = [float(x) for x in args.limits.split(",")]
    rows = []
    print("| mode | workload | limit s | load | wall s | over s | within | status | stop | gap |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as folder:
        context = Context(Path(folder), bare_start_s=_bare_start_s())
        try:
            for mode in args.mode.split(","):
                for name in args.workloads.split(","):
                    for limit in limits:
                        for hogs in (0, args.hogs):
                            result = run(mode, name, limit, hogs, context)
                            row = {"mode": mode, "workload": name, "limit_s": limit}
                            rows.append({**row, "hogs": hogs, **result})
                            _print_row(mode, name, limit, hogs, result)
        finally:
            context.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


def _print_row(mode: str, name: str, limit: float, hogs: int, result: dict[str, Any]) -> None:
    load = f"{hogs} hogs" if hogs else "idle"
    if "error" in result:
        print(f"| {mode} | {name} | {limit:g} | {load} | error: {result['error']!r} |")
        return
    gap = "-" if result["gap"] is None else f"{result['gap']:.2%}"
    print(
        f"| {mode} | {name} | {limit:g} | {load} | {result['wall_s']:.2f} | "
        f"{result['over_s']:+.2f} | {'yes' if result['within'] else '**no**'} | "
        f"{result['status']} | {result['stop_reason']} | {gap} |",
        flush=True,
    )


if __name__ == "__main__":
    main()
