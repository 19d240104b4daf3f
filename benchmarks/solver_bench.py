"""Our planner against TorchRec 1.8's planner on the public workloads, in one run.

    bash benchmarks/torchrec_env.sh        # dev-only venv with torchrec 1.8.0
    .venv/bin/python -m benchmarks.solver_bench [--time-limit 10] [--fast-time-limit 0.04]
        [--torchrec-cap 180] [--workloads tiny,small,...]
        [--world-sizes 8,32,128] [--json results.json]

Every workload is planned with ``cost_model: torchrec-1.8`` (we optimise TorchRec's own
rating) on 8 ranks per host, 80 GiB HBM, batch 512. TorchRec's default planner runs on the
same tables in a child process with a time cap (``did not finish`` is recorded as such).
Both plans are priced with our ``torchrec-1.8`` model (identical to TorchRec's estimator,
see docs/cost-model.md), and TorchRec's own rating is printed beside as a cross-check.

Three runs of ours per workload: the default (the request's default ``gap_limit``: stop
once the plan is proven within 2% of the optimum, or out of time), exact (``gap_limit`` 0:
search until proven optimal or out of time) and fast (the warm start alone).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.workloads import NVIDIA_MODELS, criteo_tables, nvidia_tables, workload_request
from planner_service.costs.enumerate import enumerate_options
from planner_service.plan.types import PlanRequest
from planner_service.solve.pipeline import solve

ROOT = Path(__file__).resolve().parent.parent
TORCHREC_PYTHON = ROOT / ".venv-torchrec" / "bin" / "python"
HARNESS = ROOT / "benchmarks" / "torchrec_planner_reference.py"


def torchrec_plan(request: PlanRequest, cap_s: float) -> dict[str, Any]:
    if not TORCHREC_PYTHON.exists():
        sys.exit(f"{TORCHREC_PYTHON} is missing: run `bash benchmarks/torchrec_env.sh` first")
    completed = subprocess.run(
        [str(TORCHREC_PYTHON), str(HARNESS), "-", "--time-cap", str(cap_s)],
        input=request.model_dump_json(),
        capture_output=True,
        text=True,
        timeout=cap_s + 600,
        check=False,
    )
    try:
        return json.loads(completed.stdout)
    except json.JSONDecodeError:
        return {"status": "error", "error": completed.stderr[-500:]}


def price(request: PlanRequest, tables: dict[str, Any]) -> float:
    """Max over ranks of summed shard perf.total for a plan given as TorchRec's tables,
    priced with our model (which must pick the option with the same shard sizes)."""
    loads = [0.0] * request.topology.world_size
    options = {entry.table.name: entry.options for entry in enumerate_options(request)}
    for name, sharding in tables.items():
        sizes = [tuple(shard["sizes"]) for shard in sharding["shards"]]
        match = [
            option
            for option in options[name]
            if option.sharding_type.value == sharding["sharding_type"]
            and option.compute_kernel.value == sharding["compute_kernel"]
            and [s.sizes for s in option.shards] == sizes
        ]
        if not match:
            raise ValueError(f"no option of ours matches TorchRec's {name}: {sharding}")
        for estimate, shard in zip(match[0].shards, sharding["shards"], strict=True):
            loads[shard["rank"]] += estimate.perf[0].total
    return max(loads)


def ours(tables: list[dict[str, Any]], world: int, options: dict[str, Any], prefix: str) -> dict:
    request = workload_request(tables, world, options={"cost_model": "torchrec-1.8", **options})
    start = time.perf_counter()
    outcome = solve(request)
    row: dict[str, Any] = {f"{prefix}wall_s": time.perf_counter() - start}
    if outcome.plan is not None:
        report = outcome.plan.solver
        row.update(
            {
                f"{prefix}cost": report.objective,
                f"{prefix}lower_bound": report.lower_bound,
                f"{prefix}gap": report.gap,
                f"{prefix}status": report.status.value,
                f"{prefix}bound_source": report.lower_bound_source,
            }
        )
    else:
        status = outcome.infeasibility.status.value if outcome.infeasibility else "?"
        row[f"{prefix}status"] = status
    return row


def modes(args: argparse.Namespace) -> list[tuple[str, str, dict[str, Any]]]:
    """(row key prefix, column title, options) of each run of ours."""
    return [
        ("", "default", {"time_limit_s": args.time_limit}),
        ("exact_", "exact", {"time_limit_s": args.time_limit, "gap_limit": 0.0}),
        ("fast_", "fast", {"time_limit_s": args.fast_time_limit}),
    ]


def run_one(
    name: str, tables: list[dict[str, Any]], world: int, args: argparse.Namespace
) -> dict[str, Any]:
    request = workload_request(tables, world, options={"cost_model": "torchrec-1.8"})
    row: dict[str, Any] = {"workload": name, "world_size": world, "tables": len(tables)}
    for prefix, _, options in reversed(modes(args)):
        row.update(ours(tables, world, options, prefix))
    if args.torchrec_cap > 0:
        theirs = torchrec_plan(request, args.torchrec_cap)
        row["torchrec_status"] = theirs.get("status")
        row["torchrec_wall_s"] = theirs.get("wall_time_s")
        if theirs.get("status") == "ok":
            row["torchrec_rating"] = theirs["rating"]
            row["torchrec_cost"] = price(request, theirs["tables"])
            row["torchrec_types"] = sorted({t["sharding_type"] for t in theirs["tables"].values()})
    return row


def render(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """Two tables: each run of ours (wall time, cost, gap), then TorchRec and the ratios of
    each run of ours to it. Gaps are against the best lower bound any run proved."""
    runs = modes(args)
    titles = [title for _, title, _ in runs]
    ours_table = _header(
        ["workload", "ranks", "tables"] + [f"{t} {c}" for t in titles for c in ("s", "cost", "gap")]
    )
    theirs_table = _header(
        ["workload", "ranks", "TorchRec s", "TorchRec cost", "TorchRec gap"]
        + [f"{t} / TorchRec" for t in titles]
        + [f"{t} speed-up" for t in titles]
    )
    for r in rows:
        bounds = [r[f"{p}lower_bound"] for p, _, _ in runs if f"{p}lower_bound" in r]
        bound = max(bounds, default=None)
        cells = [r["workload"], str(r["world_size"]), str(r["tables"])]
        for prefix, _, _ in runs:
            cost = r.get(f"{prefix}cost")
            cells.append(f"{r[f'{prefix}wall_s']:.2f}")
            cells.append(f"{cost:.4f}" if cost is not None else r[f"{prefix}status"])
            cells.append(_gap(cost, bound))
        ours_table.append(_row(cells))
        theirs = r.get("torchrec_cost")
        status = r.get("torchrec_status")
        cells = [r["workload"], str(r["world_size"])]
        if status == "ok":
            cells += [f"{r['torchrec_wall_s']:.2f}", f"{theirs:.4f}", _gap(theirs, bound)]
            for prefix, _, _ in runs:
                cost = r.get(f"{prefix}cost")
                cells.append(f"{cost / theirs:.4f}" if cost is not None else "-")
            for prefix, _, _ in runs:
                cells.append(f"{r['torchrec_wall_s'] / r[f'{prefix}wall_s']:.1f}x")
        else:
            cap = args.torchrec_cap
            cells.append(
                f"did not finish in {cap:.0f} s"
                if status == "did_not_finish"
                else (status or "not run")
            )
            cells += ["-"] * (2 + 2 * len(runs))
        theirs_table.append(_row(cells))
    return "\n".join(ours_table) + "\n\n" + "\n".join(theirs_table)


def _header(titles: list[str]) -> list[str]:
    aligns = ["---" if t in ("workload",) else "---:" for t in titles]
    return [_row(titles), _row(aligns)]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _gap(cost: float | None, bound: float | None) -> str:
    if cost is None or bound is None or cost <= 0:
        return "-"
    return f"{(cost - bound) / cost:.2%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--time-limit", type=float, default=10.0, help="time_limit_s of our default and exact runs"
    )
    parser.add_argument(
        "--fast-time-limit",
        type=float,
        default=0.04,
        help="time_limit_s of our fast run (below 0.05 s: warm start only)",
    )
    parser.add_argument(
        "--torchrec-cap",
        type=float,
        default=180.0,
        help="seconds TorchRec may plan; 0 skips TorchRec",
    )
    parser.add_argument("--workloads", default=",".join([*NVIDIA_MODELS, "criteo"]))
    parser.add_argument("--world-sizes", default="8,32,128")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows = []
    for name in args.workloads.split(","):
        tables = criteo_tables() if name == "criteo" else nvidia_tables(name)
        for world in map(int, args.world_sizes.split(",")):
            row = run_one(name, tables, world, args)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print(render(rows, args))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
