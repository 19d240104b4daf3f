"""Public workloads for tests and benchmarks, read from ../shared/data/.

- NVIDIA distributed-embeddings synthetic models (tiny 55 tables ... colossal 2,002): one
  feature per table with ``lookups_per_sample`` as its pooling factor.
- Criteo's 26 categorical features (MLPerf DLRMv2 40M-capped cardinalities), dim 128,
  pooling factors from the DLRMv2 multi-hot sizes.
- ``criteo-60``: 60 Criteo-like tables (``criteo_like_tables``), rowwise_adagrad, batch
  4,096: the multi-host reproducer of issue 23 (a 6.97% gap on 2 hosts of 8).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from planner_service.plan.canonical import canonical_bytes
from planner_service.plan.codec import parse_request
from planner_service.plan.types import PlanRequest
from planner_service.plan.units import GiB

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
NVIDIA_CSV = DATA / "nvidia_distributed_embeddings_synthetic_tables.csv"
CRITEO_CSV = DATA / "criteo_cardinalities.csv"
NVIDIA_MODELS = ("tiny", "small", "medium", "large", "jumbo", "colossal")


def nvidia_tables(model: str) -> list[dict[str, Any]]:
    with NVIDIA_CSV.open() as f:
        rows = [row for row in csv.DictReader(f) if row["model"] == model]
    if not rows:
        raise ValueError(f"no model {model!r} in {NVIDIA_CSV.name}; models: {NVIDIA_MODELS}")
    return [
        {
            "name": f"{model}_{row['table_id']}",
            "num_embeddings": int(row["rows"]),
            "embedding_dim": int(row["dim"]),
            "pooling_factors": [float(row["lookups_per_sample"])],
        }
        for row in rows
    ]


def criteo_tables(
    column: str = "terabyte_mlperf_dlrmv2_40M", dim: int = 128
) -> list[dict[str, Any]]:
    with CRITEO_CSV.open() as f:
        rows = list(csv.DictReader(f))
    return [
        {
            "name": row["feature"],
            "num_embeddings": int(row[column]),
            "embedding_dim": dim,
            "pooling_factors": [float(row["mlperf_dlrmv2_multi_hot_size"])],
        }
        for row in rows
    ]


def criteo_like_tables(count: int = 60) -> list[dict[str, Any]]:
    """``count`` Criteo-like tables trained with rowwise_adagrad: Criteo's 26 features
    repeated, the ``k``-th repetition (from 0) with ``num_embeddings // (k + 1)`` rows, so
    every copy keeps its feature's dim and pooling factor and the cardinalities stay on
    Criteo's spread (40M down to 1)."""
    base = criteo_tables()
    tables = []
    for i in range(count):
        entry = dict(base[i % len(base)], name=f"t{i}", optimizer="rowwise_adagrad")
        entry["num_embeddings"] = max(1, entry["num_embeddings"] // (1 + i // len(base)))
        tables.append(entry)
    return tables


def named_workload(
    name: str, world_size: int, options: dict[str, Any] | None = None
) -> PlanRequest:
    """A public workload by name on ``world_size`` ranks (8 per host, 80 GiB): an NVIDIA
    model at batch 512, ``criteo`` at batch 512, or ``criteo-60`` at batch 4,096."""
    extra = {"options": options} if options else {}
    if name == "criteo-60":
        return workload_request(criteo_like_tables(60), world_size, batch_size=4096, **extra)
    tables = criteo_tables() if name == "criteo" else nvidia_tables(name)
    return workload_request(tables, world_size, **extra)


def workload_request(
    tables: list[dict[str, Any]],
    world_size: int,
    *,
    local_world_size: int = 8,
    hbm_gib: int = 80,
    batch_size: int = 512,
    **extra: Any,
) -> PlanRequest:
    """The benchmark topology: ``world_size`` ranks, 8 per host, 80 GiB HBM each."""
    document = {
        "topology": {
            "world_size": world_size,
            "local_world_size": min(local_world_size, world_size),
            "hbm_bytes": hbm_gib * GiB,
        },
        "tables": tables,
        "batch_size": batch_size,
        **extra,
    }
    return parse_request(canonical_bytes(document))


def synthetic_tables(count: int, *, jitter: float = 0.0, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` tables drawn from the NVIDIA synthetic distribution at its largest scale
    (the colossal model's nine config groups, in its proportions, by largest remainder).

    With ``jitter`` 0 the tables repeat the groups' shapes exactly, as production models
    repeat shapes; with ``jitter`` > 0 each table's rows are scaled by a seeded uniform
    factor in [1 - jitter, 1 + jitter], so every table has a shape of its own (the hard
    case for a solver that groups identical tables)."""
    import random
    from collections import Counter

    base = nvidia_tables("colossal")
    with NVIDIA_CSV.open() as f:
        group_of = {
            f"colossal_{row['table_id']}": row["config_group"]
            for row in csv.DictReader(f)
            if row["model"] == "colossal"
        }
    members: dict[str, list[dict[str, Any]]] = {}
    for entry in base:
        members.setdefault(group_of[entry["name"]], []).append(entry)
    sizes = Counter({group: len(entries) for group, entries in members.items()})
    exact = {group: count * size / len(base) for group, size in sizes.items()}
    counts = {group: int(share) for group, share in exact.items()}
    by_remainder = sorted(exact, key=lambda g: (-(exact[g] - counts[g]), int(g)))
    for group in by_remainder[: count - sum(counts.values())]:
        counts[group] += 1
    rng = random.Random(seed)
    tables = []
    for group in sorted(counts, key=int):
        for i in range(counts[group]):
            entry = dict(members[group][i % len(members[group])], name=f"g{group}_t{i}")
            if jitter:
                scale = rng.uniform(1 - jitter, 1 + jitter)
                entry["num_embeddings"] = max(1, round(entry["num_embeddings"] * scale))
            tables.append(entry)
    return tables
