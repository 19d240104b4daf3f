"""Compare our ``torchrec-1.8`` cost model with TorchRec 1.8's own estimators.

    bash benchmarks/torchrec_env.sh                      # dev-only venv with torchrec 1.8.0
    .venv/bin/python -m benchmarks.compare_torchrec_estimator [--tables 300] [--seed 0]

Random tables and topologies (every sharding type, kernel, column width, data type,
pooling, weighting TorchRec accepts) are enumerated by our planner; each option becomes a
case for ``benchmarks/torchrec_reference.py``, which runs TorchRec's EmbeddingEnumerator
with its default estimators in the TorchRec venv. Every shard's sizes, offsets, perf
components and storage are compared. Prints the worst relative error per (sharding type,
kernel) and overall; exits 1 if any exceeds 0.5% or any shard layout differs.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from planner_service.costs.enumerate import enumerate_options
from planner_service.costs.options import ShardingOption
from planner_service.plan.codec import parse_request
from planner_service.plan.types import (
    PERF_FIELDS,
    ComputeDevice,
    PlanRequest,
    PoolingType,
    ShardingType,
)

ROOT = Path(__file__).resolve().parent.parent
TORCHREC_PYTHON = ROOT / ".venv-torchrec" / "bin" / "python"
HARNESS = ROOT / "benchmarks" / "torchrec_reference.py"
TOLERANCE = 0.005


def random_request(rng: random.Random, index: int) -> PlanRequest:
    world = rng.choice([1, 2, 4, 8, 16, 32, 64])
    local = rng.choice([d for d in (1, 2, 4, 8) if world % d == 0])
    device = "cpu" if rng.random() < 0.15 else "cuda"
    pooling = rng.choice(["sum", "sum", "mean", "none"])
    features = rng.randint(1, 3)
    table = {
        "name": f"t{index}",
        "num_embeddings": int(10 ** rng.uniform(0, 7.5)),
        "embedding_dim": rng.choice([4, 8, 12, 16, 32, 48, 64, 96, 128, 160, 256, 384, 512]),
        "feature_names": [f"t{index}_f{i}" for i in range(features)],
        "pooling": pooling,
        "pooling_factors": [
            round(rng.choice([1.0, rng.uniform(0.1, 60)]), 3) for _ in range(features)
        ],
        "data_type": rng.choice(["fp32", "fp32", "fp16", "bf16"]),
        "is_weighted": pooling != "none" and rng.random() < 0.3,
    }
    document = {
        "topology": {"world_size": world, "local_world_size": local, "compute_device": device},
        "tables": [table],
        "batch_size": rng.choice([128, 512, 2048]),
        "constraints": {
            "tables": {
                table["name"]: {
                    "cache_load_factor": round(rng.uniform(0.05, 1.0), 3),
                    "min_partition": rng.choice([32, 64, 128]),
                }
            }
        },
        "options": {"cost_model": "torchrec-1.8"},
    }
    return parse_request(json.dumps(document))


def torchrec_accepts(request: PlanRequest, option: ShardingOption) -> bool:
    """TorchRec 1.8 refuses row-wise types for pooled tables on cpu (we support them)."""
    table = request.tables[0]
    row_types = (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE)
    return not (
        request.topology.compute_device is ComputeDevice.CPU
        and table.pooling is not PoolingType.NONE
        and option.sharding_type in row_types
    )


def build_cases(num_tables: int, seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rng = random.Random(seed)
    cases, ours = [], {}
    for index in range(num_tables):
        request = random_request(rng, index)
        request_json = json.loads(request.model_dump_json())
        for number, option in enumerate(enumerate_options(request)[0].options):
            if not torchrec_accepts(request, option):
                continue
            case_id = f"t{index}.o{number}"
            splits_columns = option.sharding_type in (
                ShardingType.COLUMN_WISE,
                ShardingType.TABLE_COLUMN_WISE,
            )
            cases.append(
                {
                    "id": case_id,
                    "topology": request_json["topology"],
                    "batch_size": request.batch_size,
                    "table": request_json["tables"][0],
                    "sharding_type": option.sharding_type.value,
                    "compute_kernel": option.compute_kernel.value,
                    "cache_load_factor": option.cache_load_factor,
                    "col_wise_shard_dim": option.shards[0].sizes[1] if splits_columns else None,
                }
            )
            ours[case_id] = option
    return cases, ours


def run_torchrec(cases: list[dict[str, Any]]) -> dict[str, Any]:
    if not TORCHREC_PYTHON.exists():
        sys.exit(f"{TORCHREC_PYTHON} is missing: run `bash benchmarks/torchrec_env.sh` first")
    completed = subprocess.run(
        [str(TORCHREC_PYTHON), str(HARNESS), "-"],
        input=json.dumps({"cases": cases}),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(completed.stdout)["results"]


def relative_error(ours: float, theirs: float) -> float:
    if ours == theirs:
        return 0.0
    return abs(ours - theirs) / max(abs(theirs), 1e-300)


def compare(option: ShardingOption, result: dict[str, Any]) -> tuple[dict[str, float], list[str]]:
    """Worst relative error per field over the option's shards, and layout mismatches."""
    errors: dict[str, float] = defaultdict(float)
    problems = []
    shards = result["shards"]
    if len(shards) != len(option.shards):
        return errors, [f"{len(option.shards)} shards vs TorchRec's {len(shards)}"]
    for ours, offsets, theirs in zip(option.shards, option.offsets(), shards, strict=True):
        if list(ours.sizes) != theirs["sizes"] or list(offsets) != theirs["offsets"]:
            problems.append(
                f"shard {list(ours.sizes)}@{list(offsets)} vs {theirs['sizes']}@{theirs['offsets']}"
            )
        perf = ours.perf[0]
        for field in PERF_FIELDS:
            errors[field] = max(
                errors[field], relative_error(getattr(perf, field), theirs["perf"][field])
            )
        for field in ("hbm_bytes", "ddr_bytes"):
            errors[field] = max(
                errors[field],
                relative_error(getattr(ours.storage, field), theirs["storage"][field]),
            )
    return errors, problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cases, ours = build_cases(args.tables, args.seed)
    results = run_torchrec(cases)
    worst: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[tuple[str, str], int] = defaultdict(int)
    refused, mismatched = [], []
    for case in cases:
        result = results[case["id"]]
        if "error" in result:
            refused.append(f"{case['id']}: {result['error'][:160]}")
            continue
        key = (case["sharding_type"], case["compute_kernel"])
        errors, problems = compare(ours[case["id"]], result)
        mismatched += [f"{case['id']}: {p}" for p in problems]
        counts[key] += 1
        for field, error in errors.items():
            worst[key][field] = max(worst[key][field], error)
    fields = (*PERF_FIELDS, "hbm_bytes", "ddr_bytes")
    print(
        f"{args.tables} random tables, {len(cases)} options, {sum(counts.values())} compared, "
        f"{len(refused)} refused by TorchRec, {len(mismatched)} layout mismatches"
    )
    print("| sharding type | kernel | options | worst rel. error | worst field |")
    print("| --- | --- | ---: | ---: | --- |")
    overall = 0.0
    for key in sorted(counts):
        field, error = max(((f, worst[key][f]) for f in fields), key=lambda item: item[1])
        overall = max(overall, error)
        print(f"| {key[0]} | {key[1]} | {counts[key]} | {error:.2e} | {field} |")
    print(
        f"worst relative error over every shard and field: {overall:.3e} "
        f"(tolerance {TOLERANCE:.1%})"
    )
    for line in (refused + mismatched)[:10]:
        print("  ", line)
    return 0 if overall <= TOLERANCE and not mismatched and not refused else 1


if __name__ == "__main__":
    sys.exit(main())
