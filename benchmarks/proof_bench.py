"""Time to proof on small problems: how long a solve takes to prove its plan optimal or
within ``gap_limit``, on the public workloads of up to 100 tables and on a sweep of small
random requests, solved as a request gets solved by default.

    .venv/bin/python -m benchmarks.proof_bench [--workloads readme-64MiB,tiny,criteo,criteo-60]
        [--world-sizes 8,16,32,128] [--cost-models shardplan,torchrec-1.8]
        [--sweep 60] [--time-limit 10] [--json results.json]

``readme-64MiB`` is the README's request (``examples/request.json``, 4 ranks) with
``hbm_bytes`` at 64 MiB, so that two of its three tables must leave HBM. The sweep draws
requests of 1 to 50 tables from the Criteo and NVIDIA tiny and small shapes, on 2 to 32
ranks, with HBM loose (80 GiB) or tight (30% to 120% of the weights' share per rank),
either cost model, batch 512 or 4,096 (seeded: the same ``--sweep`` gives the same
requests). A solve that ends on ``optimal`` or ``gap_limit`` ended by its proof, so its
wall time is the time to proof.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.workloads import (
    criteo_tables,
    named_workload,
    nvidia_tables,
    workload_request,
)
from planner_service.plan.codec import parse_request
from planner_service.plan.types import PlanRequest
from planner_service.plan.units import GiB, MiB
from planner_service.solve.pipeline import solve

WORKLOADS = ("readme-64MiB", "tiny", "criteo", "criteo-60")
WORLD_SIZES = (8, 16, 32, 128)
COST_MODELS = ("shardplan", "torchrec-1.8")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "request.json"
SWEEP_TABLE_COUNTS = (1, 2, 3, 5, 8, 12, 20, 30, 50)
SWEEP_WORLD_SIZES = (2, 4, 8, 16, 32)
SLOW_S = 1.0  # a small problem should be answered well within this


def readme_64mib(cost_model: str, time_limit_s: float) -> PlanRequest:
    """The README's request with 64 MiB of HBM per rank: two tables must leave HBM."""
    document = json.loads(EXAMPLE.read_text())
    document["topology"]["hbm_bytes"] = 64 * MiB
    document["options"] = {"cost_model": cost_model, "time_limit_s": time_limit_s}
    return parse_request(json.dumps(document).encode())


def sweep_request(index: int, time_limit_s: float) -> tuple[str, PlanRequest]:
    """The sweep's ``index``-th request, and a short label saying what it is."""
    rng = random.Random(index)
    shapes = criteo_tables() + nvidia_tables("tiny") + nvidia_tables("small")
    count = rng.choice(SWEEP_TABLE_COUNTS)
    tables = [dict(t, name=f"t{j}") for j, t in enumerate(rng.sample(shapes, count))]
    world = rng.choice(SWEEP_WORLD_SIZES)
    weight_bytes = sum(t["num_embeddings"] * t["embedding_dim"] * 4 for t in tables)
    tight = rng.random() < 0.5
    hbm_bytes = max(int(weight_bytes / world * rng.uniform(0.3, 1.2)), 16 * MiB)
    cost_model = rng.choice(COST_MODELS)
    request = workload_request(
        tables,
        world,
        batch_size=rng.choice([512, 4096]),
        options={"cost_model": cost_model, "time_limit_s": time_limit_s},
    )
    topology = request.topology.model_copy(update={"hbm_bytes": hbm_bytes if tight else 80 * GiB})
    label = f"{count} tables, {world} ranks, {'tight' if tight else 'loose'}, {cost_model}"
    return label, request.model_copy(update={"topology": topology})


def measure(request: PlanRequest) -> dict[str, Any]:
    """Solve ``request`` in this process with its own deadline; what the plan says."""
    start = time.perf_counter()
    outcome = solve(request)
    row: dict[str, Any] = {
        "world_size": request.topology.world_size,
        "hosts": request.topology.num_hosts,
        "tables": len(request.tables),
        "cost_model": request.options.cost_model.value,
        "wall_s": round(time.perf_counter() - start, 3),
    }
    cpsat_wall_s = outcome.details.get("cpsat_wall_s")
    row["cpsat_wall_s"] = round(cpsat_wall_s, 3) if isinstance(cpsat_wall_s, float) else 0.0
    if outcome.plan is None:
        assert outcome.infeasibility is not None
        row["status"] = outcome.infeasibility.status.value
        return row
    report = outcome.plan.solver
    row.update(
        status=report.status.value,
        stop=report.stop_reason.value if report.stop_reason else "-",
        gap=report.gap,
        cost=report.objective,
        bound=report.lower_bound,
    )
    return row


def workload_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for name in args.workloads.split(","):
        worlds = [4] if name == "readme-64MiB" else map(int, args.world_sizes.split(","))
        for world in worlds:
            for cost_model in args.cost_models.split(","):
                options = {"cost_model": cost_model, "time_limit_s": args.time_limit}
                if name == "readme-64MiB":
                    request = readme_64mib(cost_model, args.time_limit)
                else:
                    request = named_workload(name, world, options)
                row = {"workload": name, **measure(request)}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def sweep_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for index in range(args.sweep):
        label, request = sweep_request(index, args.time_limit)
        row = {"workload": f"sweep {index}: {label}", **measure(request)}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | ranks (hosts) | tables | cost model | wall s | CP-SAT wall s | status | "
        "stop | gap |",
        "| --- | ---: | ---: | --- | ---: | ---: | --- | --- | ---: |",
    ]
    for r in rows:
        head = (
            f"| {r['workload']} | {r['world_size']} ({r['hosts']}) | {r['tables']} | "
            f"{r['cost_model']} | {r['wall_s']:.2f} | {r['cpsat_wall_s']:.2f} | {r['status']} | "
        )
        if "gap" not in r:
            lines.append(head + "- | - |")
            continue
        lines.append(head + f"{r['stop']} | {r['gap']:.2%} |")
    return "\n".join(lines)


def render_sweep(rows: list[dict[str, Any]]) -> str:
    """The sweep in one line per figure: wall times, and the solves over ``SLOW_S``."""
    walls = sorted(r["wall_s"] for r in rows)
    slow = [r for r in rows if r["wall_s"] > SLOW_S]
    unproven = [r for r in rows if r.get("stop") in ("work_budget", "time_limit")]
    lines = [
        f"- {len(rows)} requests; wall s median {statistics.median(walls):.2f}, "
        f"90th percentile {walls[int(0.9 * (len(walls) - 1))]:.2f}, max {walls[-1]:.2f}",
        f"- over {SLOW_S:.0f} s: {len(slow)}; ended unproven (work_budget or time_limit): "
        f"{len(unproven)}",
    ]
    lines += [f"  - {r['workload']}: {r['wall_s']:.2f} s, {r.get('stop', '-')}" for r in slow]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--world-sizes", default=",".join(map(str, WORLD_SIZES)))
    parser.add_argument("--cost-models", default=",".join(COST_MODELS))
    parser.add_argument("--sweep", type=int, default=0, help="random small requests to add")
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows = workload_rows(args) if args.workloads else []
    swept = sweep_rows(args) if args.sweep else []
    if rows:
        print(render(rows))
    if swept:
        print(render_sweep(swept))
    if args.json:
        args.json.write_text(json.dumps(rows + swept, indent=2))


if __name__ == "__main__":
    main()
