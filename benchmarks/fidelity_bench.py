"""How well each cost model predicts what plans measure when this runtime executes them.

    .venv/bin/python -m benchmarks.fidelity_bench --profile profiles/cpu-2core-example.json \\
        --world-sizes 2,4 --workloads many-small,few-huge,sequence

For each workload and world size: at least ten diverse valid plans (the plan of each cost
model, every table table-wise, row-wise, column-wise, data-parallel for the small tables,
table-row-wise on two hosts, and random mixes of sharding types), each executed by the
runtime (``runtime.measure``: gloo ranks on this machine, one thread each, synthetic
batches drawn to the request's shapes). Each plan is priced under every model
(``validate.usage.rank_usage``, the validator's recomputation). Reported per model:

- Spearman's ρ between the predicted step (the plan's most loaded rank) and the measured
  step (the slowest rank's median);
- regret: the model's own plan's measured step over the fastest measured step;
- the median per-rank relative error |predicted − measured| / measured.

Every plan is measured ``--rounds`` times (default 3). In a round the plans are measured
side by side (``runtime.measure.measure_plans``): the same ranks hold every plan and take a
step of each in turn, so a machine that is faster one second and slower the next (a
shared VM drifts 10 to 25% from one minute to the next) slows every plan alike. Plans
whose shards do not fit in memory together are split into groups that do
(``runtime.measure.launch.fitting_runs``). ``--apart`` measures each plan in a run of its
own instead, as before. Each round takes the plans in a new seeded order; a plan's step is
the median of its rounds. The report gives the noise beside the scores: the median spread
of a plan's rounds, and ρ between two rounds' measurements of the same plans (the most any
model could score on plans measured once).

A world size of 4 is two hosts of two ranks; on a 2-core machine its 4 ranks share 2
cores, which the report says.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner_service.plan.codec import parse_request
from planner_service.plan.types import (
    CostModel,
    PlanRequest,
    ShardingPlan,
)
from planner_service.solve.pipeline import solve
from planner_service.validate.usage import rank_usage

MODELS = (CostModel.SHARDPLAN, CostModel.TORCHREC_1_8, CostModel.CALIBRATED)
SMALL_ROWS = 20_000  # "small" tables: data-parallel candidates


# ---- workloads: three characters, none of them a file in this repository


def many_small(rng: random.Random) -> list[dict[str, Any]]:
    """40 small tables: the step is mostly fixed costs and small kernels."""
    return [
        _table(
            f"s{i}",
            rng.choice([100, 500, 2_000, 8_000, 30_000]),
            rng.choice([8, 16, 32, 64]),
            rng.choice([1.0, 2.0, 5.0, 10.0]),
        )
        for i in range(40)
    ]


def few_huge(rng: random.Random) -> list[dict[str, Any]]:
    """Three tables of 0.5 to 2 million rows beside six small ones: bytes and balance."""
    huge = [
        _table("h0", 2_000_000, 64, 20.0),
        _table("h1", 1_000_000, 128, 8.0),
        _table("h2", 500_000, 128, 30.0),
    ]
    small = [
        _table(
            f"s{i}",
            rng.choice([1_000, 10_000, 50_000]),
            rng.choice([16, 32]),
            rng.choice([1.0, 4.0]),
        )
        for i in range(6)
    ]
    return huge + small


def sequence(rng: random.Random) -> list[dict[str, Any]]:
    """Eight sequence tables (one row per id, no pooling) beside four pooled ones."""
    seq = [
        {
            **_table(
                f"q{i}",
                rng.choice([5_000, 50_000, 200_000]),
                rng.choice([16, 32, 64]),
                rng.choice([5.0, 10.0, 20.0]),
            ),
            "pooling": "none",
        }
        for i in range(8)
    ]
    pooled = [
        _table(f"p{i}", rng.choice([1_000, 100_000]), 32, rng.choice([1.0, 8.0])) for i in range(4)
    ]
    return seq + pooled


def mixed_14(rng: random.Random) -> list[dict[str, Any]]:
    """14 tables of 400 to 400,000 rows, widths 16 to 128, pooling 1 to 40."""
    return [
        _table(
            f"t{i}",
            rng.choice([400, 4_000, 40_000, 400_000]),
            rng.choice([16, 32, 64, 128]),
            rng.choice([1.0, 5.0, 10.0, 20.0, 40.0]),
            weighted=i % 5 == 0,
        )
        for i in range(14)
    ]


WORKLOADS = {
    "many-small": many_small,
    "few-huge": few_huge,
    "sequence": sequence,
    "mixed-14": mixed_14,
}


def _table(
    name: str, rows: int, dim: int, pooling: float, weighted: bool = False
) -> dict[str, Any]:
    return {
        "name": name,
        "num_embeddings": rows,
        "embedding_dim": dim,
        "feature_names": [f"{name}_f"],
        "pooling_factors": [pooling],
        "is_weighted": weighted,
    }


# ---- plans


@dataclass
class Candidate:
    label: str
    plan: ShardingPlan
    models: list[CostModel] = field(default_factory=list)  # the models whose own plan it is
    predicted_ms: dict[CostModel, float] = field(default_factory=dict)
    predicted_ranks_ms: dict[CostModel, list[float]] = field(default_factory=dict)
    measured_ms: float = 0.0
    measured_ranks_ms: list[float] = field(default_factory=list)
    rounds_ms: list[float] = field(default_factory=list)  # the job's step, each round
    rounds_ranks_ms: list[list[float]] = field(default_factory=list)  # each rank, each round
    rounds_parts: list[list[dict[str, float]]] = field(default_factory=list)  # [round][rank]
    calls_ms: float = 0.0  # the kernels and collectives alone (``bare_profile``)


def base_request(
    tables: list[dict[str, Any]], world: int, batch: int, time_limit_s: float
) -> dict[str, Any]:
    local = 2 if world == 4 else world
    return {
        "topology": {"world_size": world, "local_world_size": local, "compute_device": "cpu"},
        "tables": tables,
        "batch_size": batch,
        "options": {"time_limit_s": time_limit_s},
    }


def with_model(document: dict[str, Any], model: CostModel, profile: dict[str, Any]) -> PlanRequest:
    data = json.loads(json.dumps(document))
    data["options"]["cost_model"] = model.value
    if model is CostModel.CALIBRATED:
        data["options"]["device_profile"] = profile
    return parse_request(json.dumps(data))


def constrained(
    document: dict[str, Any], types_of: dict[str, list[str]], **extra: Any
) -> PlanRequest:
    data = json.loads(json.dumps(document))
    data["constraints"] = {
        "tables": {name: {"sharding_types": kinds, **extra} for name, kinds in types_of.items()}
    }
    return parse_request(json.dumps(data))


def candidate_plans(
    document: dict[str, Any], profile: dict[str, Any], mixes: int, seed: int
) -> list[Candidate]:
    """The models' own plans, then the hand-shaped ones, then random mixes (distinct)."""
    tables = document["tables"]
    world = document["topology"]["world_size"]
    names = [t["name"] for t in tables]
    shapes: list[tuple[str, PlanRequest, CostModel | None]] = [
        (f"{model.value} plan", with_model(document, model, profile), model) for model in MODELS
    ]

    def every(kind: str) -> dict[str, list[str]]:  # sequence tables too: they take all six
        return {n: [kind] for n in names}

    shapes.append(("all table_wise", constrained(document, every("table_wise")), None))
    shapes.append(("all row_wise", constrained(document, every("row_wise")), None))
    shapes.append(
        ("all column_wise", constrained(document, every("column_wise"), min_partition=8), None)
    )
    small = {t["name"]: ["data_parallel"] for t in tables if t["num_embeddings"] <= SMALL_ROWS}
    shapes.append(("data_parallel small", constrained(document, small), None))
    if world >= 4:
        shapes.append(("all table_row_wise", constrained(document, every("table_row_wise")), None))
    rng = random.Random(seed)
    kinds = ["table_wise", "row_wise", "column_wise", "data_parallel"]
    if world >= 4:
        kinds.append("table_row_wise")
    for i in range(mixes):
        mix = {}
        for t in tables:
            allowed = kinds
            if t["num_embeddings"] > 200_000:
                allowed = [k for k in allowed if k != "data_parallel"]
            mix[t["name"]] = [rng.choice(allowed)]
        shapes.append((f"random mix {i + 1}", constrained(document, mix, min_partition=8), None))
    candidates: dict[str, Candidate] = {}
    for label, request, model in shapes:
        outcome = solve(request)
        if outcome.plan is None:
            print(f"  {label}: no plan ({outcome.infeasibility})", file=sys.stderr)
            continue
        found = candidates.setdefault(_key(outcome.plan), Candidate(label, outcome.plan))
        if model is not None:
            found.models.append(model)
    return list(candidates.values())


def _key(plan: ShardingPlan) -> str:
    """Plans the runtime executes alike have one key: a column-wise table left whole (one
    shard of every column) runs as the same table table-wise does, so "all column_wise"
    with no table split is not a plan of its own."""
    return json.dumps({n: _executed(t) for n, t in plan.tables.items()}, sort_keys=True)


def _executed(table: Any) -> dict[str, Any]:
    data: dict[str, Any] = table.model_dump(mode="json")
    widths = data.get("column_widths") or []
    if (
        data["sharding_type"] in ("column_wise", "table_column_wise")
        and widths
        and all(width == data["shape"][1] for width, _count in widths)
    ):
        data["sharding_type"] = "table_wise"
        data.pop("column_widths", None)
    return data


def price(candidate: Candidate, document: dict[str, Any], profile: dict[str, Any]) -> None:
    world = document["topology"]["world_size"]
    for model in MODELS:
        request = with_model(document, model, profile)
        usage = rank_usage(request, candidate.plan.tables)
        candidate.predicted_ranks_ms[model] = [usage.of(r).perf[-1] for r in range(world)]
        candidate.predicted_ms[model] = usage.objective
    bare = rank_usage(
        with_model(document, CostModel.CALIBRATED, bare_profile(profile)), candidate.plan.tables
    )
    candidate.calls_ms = bare.objective


def bare_profile(profile: dict[str, Any]) -> dict[str, Any]:
    """The profile's kernels and collectives as microbenchmarked, without what whole steps
    and the runtime stage added: what the step would cost if the runtime cost nothing
    beyond the calls it makes."""
    data = json.loads(json.dumps(profile))
    runtime = data["runtime"]
    runtime.update(
        step_ms=0.0,
        input_us_per_id=0.0,
        output_ns_per_byte=0.0,
        placement_ns_per_byte=0.0,
        sharding_type_ms={},
    )
    runtime.update(compute_scale=1.0, comms_scale=1.0, input_scale=1.0)
    return data


# ---- statistics


def ranks_of(values: list[float]) -> list[float]:
    """Ranks 1..n, ties sharing their mean rank (as Spearman's ρ needs)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: list[float], y: list[float]) -> float:
    rx, ry = ranks_of(x), ranks_of(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (sx * sy) if sx and sy else 0.0


def settle(candidate: Candidate) -> None:
    """A plan's measured step and per-rank steps: the median of its rounds."""
    candidate.measured_ms = statistics.median(candidate.rounds_ms)
    candidate.measured_ranks_ms = [
        statistics.median(ranks) for ranks in zip(*candidate.rounds_ranks_ms, strict=True)
    ]


@dataclass(frozen=True)
class Noise:
    """How much the same plans measure apart: the median over plans of (slowest − fastest
    round) / median round, and Spearman's ρ between the first two rounds' steps."""

    spread: float
    rho_between_rounds: float | None


def noise(candidates: list[Candidate]) -> Noise:
    spread = statistics.median(
        (max(c.rounds_ms) - min(c.rounds_ms)) / c.measured_ms for c in candidates
    )
    if min(len(c.rounds_ms) for c in candidates) < 2:
        return Noise(spread, None)
    return Noise(
        spread,
        spearman([c.rounds_ms[0] for c in candidates], [c.rounds_ms[1] for c in candidates]),
    )


@dataclass(frozen=True)
class ModelScore:
    model: CostModel
    rho: float
    regret: float | None
    median_rank_error: float


def scores(candidates: list[Candidate]) -> list[ModelScore]:
    best = min(c.measured_ms for c in candidates)
    measured = [c.measured_ms for c in candidates]
    result = []
    for model in MODELS:
        predicted = [c.predicted_ms[model] for c in candidates]
        own = next((c for c in candidates if model in c.models), None)
        errors = [
            abs(p - m) / m
            for c in candidates
            for p, m in zip(c.predicted_ranks_ms[model], c.measured_ranks_ms, strict=True)
            if m > 0
        ]
        result.append(
            ModelScore(
                model,
                spearman(predicted, measured),
                None if own is None else own.measured_ms / best,
                statistics.median(errors),
            )
        )
    return result


# ---- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--profile", type=Path, required=True, help="a device profile (shardplan calibrate)"
    )
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--workloads", default="many-small,few-huge,sequence,mixed-14")
    parser.add_argument(
        "--mixes", type=int, default=6, help="random mixes of sharding types per workload"
    )
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument(
        "--apart",
        action="store_true",
        help="measure each plan in a run of its own (default: side by side, in turn)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="times each plan is measured, interleaved"
    )
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--time-limit-s", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--json", type=Path, help="append one JSON line per workload and world size"
    )
    args = parser.parse_args()

    from runtime.measure import MeasureSettings, measure_plans

    profile = json.loads(args.profile.read_text())
    settings = MeasureSettings(steps=args.steps, warmup=args.warmup, seed=args.seed)
    print(f"# fidelity_bench: {os.cpu_count()} cores, profile {profile.get('name')!r}")
    for world in [int(w) for w in args.world_sizes.split(",")]:
        if world > (os.cpu_count() or 1):
            print(f"# world size {world}: {world} ranks share {os.cpu_count()} cores")
        for name in args.workloads.split(","):
            rng = random.Random(f"{name}-{args.seed}")
            document = base_request(WORKLOADS[name](rng), world, args.batch_size, args.time_limit_s)
            started = time.perf_counter()
            candidates = candidate_plans(document, profile, args.mixes, args.seed)
            request = with_model(document, CostModel.SHARDPLAN, profile)
            for c in candidates:
                price(c, document, profile)
            order = random.Random(f"rounds-{name}-{world}-{args.seed}")
            for _ in range(max(1, args.rounds)):
                shuffled = order.sample(candidates, len(candidates))
                for group in groups(shuffled, apart=args.apart):
                    reports = measure_plans(request, [c.plan for c in group], settings)
                    assert reports is not None  # spawned here: rank 0's reports
                    for c, report in zip(group, reports, strict=True):
                        c.rounds_ms.append(report.job_step_ms)
                        c.rounds_ranks_ms.append([r.step_median_ms for r in report.ranks])
                        c.rounds_parts.append([r.iqm.model_dump() for r in report.ranks])
            for c in candidates:
                settle(c)
            _print(name, world, candidates)
            if args.json:
                with args.json.open("a") as f:
                    f.write(
                        json.dumps(_record(name, world, candidates, time.perf_counter() - started))
                        + "\n"
                    )


def groups(candidates: list[Candidate], *, apart: bool = False) -> list[list[Candidate]]:
    """The candidates in runs measured side by side, in their order, as many in a run as
    fit in memory together (``runtime.measure.launch.fitting_runs``); one a run when
    ``apart``."""
    from runtime.measure.launch import fitting_runs

    if apart:
        return [[c] for c in candidates]
    runs, left = [], iter(candidates)
    for run in fitting_runs([c.plan for c in candidates]):
        runs.append([next(left) for _ in run])
    return runs


def _print(name: str, world: int, candidates: list[Candidate]) -> None:
    print(f"\n## {name}, world size {world}: {len(candidates)} plans")
    header = "| plan | measured ms | " + " | ".join(f"{m.value} ms" for m in MODELS) + " |"
    print(header)
    print("|" + " --- |" * (2 + len(MODELS)))
    for c in sorted(candidates, key=lambda c: c.measured_ms):
        own = "".join(f" ({m.value}'s)" for m in c.models)
        cells = " | ".join(f"{c.predicted_ms[m]:.2f}" for m in MODELS)
        print(f"| {c.label}{own} | {c.measured_ms:.2f} | {cells} |")
    print("\n| plan | measured ms | kernels + collectives ms | runtime overhead |")
    print("| --- | --- | --- | --- |")
    for c in candidates:
        if c.label.startswith("all ") or c.label == "data_parallel small":
            overhead = c.measured_ms / c.calls_ms if c.calls_ms else float("nan")
            print(f"| {c.label} | {c.measured_ms:.2f} | {c.calls_ms:.2f} | {overhead:.2f}× |")
    measured_noise = noise(candidates)
    between = measured_noise.rho_between_rounds
    print(
        f"\nnoise: a plan's rounds spread {measured_noise.spread:.1%} (median over plans); "
        f"ρ between two rounds of the same plans "
        f"{'—' if between is None else f'{between:.3f}'}"
    )
    print("\n| model | Spearman ρ | regret of its plan | median per-rank error |")
    print("| --- | --- | --- | --- |")
    for s in scores(candidates):
        regret = "—" if s.regret is None else f"{s.regret:.3f}×"
        print(f"| {s.model.value} | {s.rho:.3f} | {regret} | {s.median_rank_error:.1%} |")


def _record(name: str, world: int, candidates: list[Candidate], wall_s: float) -> dict[str, Any]:
    return {
        "workload": name,
        "world_size": world,
        "wall_s": round(wall_s, 1),
        "plans": [
            {
                "label": c.label,
                "own_plan_of": [m.value for m in c.models],
                "measured_ms": c.measured_ms,
                "rounds_ms": c.rounds_ms,
                "rounds_parts": c.rounds_parts,
                "kernels_and_collectives_ms": c.calls_ms,
                "predicted_ms": {m.value: c.predicted_ms[m] for m in MODELS},
                "predicted_ranks_ms": {m.value: c.predicted_ranks_ms[m] for m in MODELS},
                "plan": json.loads(c.plan.model_dump_json()),
            }
            for c in candidates
        ],
        "noise": {
            "spread": noise(candidates).spread,
            "rho_between_rounds": noise(candidates).rho_between_rounds,
        },
        "scores": [
            {
                "model": s.model.value,
                "rho": s.rho,
                "regret": s.regret,
                "median_rank_error": s.median_rank_error,
            }
            for s in scores(candidates)
        ],
    }


if __name__ == "__main__":
    main()
