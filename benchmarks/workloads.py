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


TIGHT_TABLES_PER_RANK = 6  # the memory-tight named workloads' tables per rank


def named_workload(
    name: str, world_size: int, options: dict[str, Any] | None = None
) -> PlanRequest:
    """A public workload by name on ``world_size`` ranks (8 per host, 80 GiB): an NVIDIA
    model at batch 512, ``criteo`` at batch 512, ``criteo-60`` at batch 4,096, or
    ``tight-FILL`` (``tight-60``, ``tight-80``, ``tight-95``): ``memory_tight_tables``,
    six tables per rank whose weights fill FILL% of the HBM, two of them larger than a
    rank's HBM, at batch 4,096."""
    extra = {"options": options} if options else {}
    if name.startswith("tight-"):
        fill = int(name.removeprefix("tight-")) / 100
        tables = memory_tight_tables(TIGHT_TABLES_PER_RANK * world_size, world_size, fill=fill)
        return workload_request(tables, world_size, batch_size=4096, **extra)
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


# The colossal model's config groups whose tables are larger than one rank's HBM.
GIANT_GROUPS = ("2", "3")


def memory_tight_tables(
    count: int,
    world_size: int,
    *,
    fill: float = 0.8,
    giants: int = 2,
    hbm_gib: int = 80,
    jitter: float = 0.0,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """``count`` tables whose fp32 weights fill ``fill`` of ``world_size`` ranks' HBM: the
    planner's hard case, where tables must leave HBM and spreading them is what keeps the
    slowest rank near the mean (issue 37).

    Each table's config group is drawn at random (seeded) in the colossal model's
    proportions, except the ``giants``, which take the groups larger than a rank's HBM in
    turn, their weights between 1.5 ranks' HBM and a tenth of all HBM. Every other table's
    rows are then scaled by one factor so that all weights come to ``fill`` of the HBM
    (with ``jitter`` > 0, each also by its own factor in [1 - jitter, 1 + jitter]: distinct
    shapes). Draws with the same arguments are equal."""
    import random

    rng = random.Random(seed)
    members = _colossal_groups()
    regular = sorted(g for g in members if g not in GIANT_GROUPS)
    weights = [len(members[g]) for g in regular]
    drawn = rng.choices(regular, weights=weights, k=count - giants)
    hbm_bytes = hbm_gib * GiB
    tables = []
    for i in range(giants):
        entry = dict(members[GIANT_GROUPS[i % len(GIANT_GROUPS)]][0], name=f"giant_t{i}")
        width_bytes = entry["embedding_dim"] * 4
        giant_bytes = min(
            max(entry["num_embeddings"] * width_bytes, 1.5 * hbm_bytes),
            0.1 * world_size * hbm_bytes,
        )
        entry["num_embeddings"] = round(giant_bytes / width_bytes)
        tables.append(entry)
    regular_tables = [
        dict(members[group][0], name=f"g{group}_t{i}") for i, group in enumerate(drawn)
    ]
    giant_total = sum(_weight_bytes(t) for t in tables)
    scale = (fill * world_size * hbm_bytes - giant_total) / sum(
        _weight_bytes(t) for t in regular_tables
    )
    for entry in regular_tables:
        factor = scale * (rng.uniform(1 - jitter, 1 + jitter) if jitter else 1.0)
        entry["num_embeddings"] = max(1, round(entry["num_embeddings"] * factor))
    return tables + regular_tables


def _colossal_groups() -> dict[str, list[dict[str, Any]]]:
    """The colossal model's tables by config group."""
    with NVIDIA_CSV.open() as f:
        group_of = {
            f"colossal_{row['table_id']}": row["config_group"]
            for row in csv.DictReader(f)
            if row["model"] == "colossal"
        }
    members: dict[str, list[dict[str, Any]]] = {}
    for entry in nvidia_tables("colossal"):
        members.setdefault(group_of[entry["name"]], []).append(entry)
    return members


def _weight_bytes(table: dict[str, Any]) -> int:
    """A table's fp32 weights."""
    return int(table["num_embeddings"]) * int(table["embedding_dim"]) * 4
