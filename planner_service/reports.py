"""Documents and text rendered from planner results, for the CLI and the service."""

from __future__ import annotations

from typing import Any

from planner_service.capacity import Capacity
from planner_service.enumerator import DeviceClasses, ShardingOption, TableOptions
from planner_service.types import PlanRequest, TableProblem


def options_document(
    request: PlanRequest,
    tables: list[TableOptions],
    problems: list[TableProblem],
    capacities: list[Capacity],
) -> dict[str, Any]:
    """The JSON of ``shardplan options``: every table's options with per-shard estimates."""
    classes = DeviceClasses.of(request.topology)
    document: dict[str, Any] = {
        "cost_model": request.options.cost_model.value,
        "reservation": reservation_document(request, capacities),
        "tables": {
            entry.table.name: [_option_document(option, classes) for option in entry.options]
            for entry in tables
        },
        "problems": [problem.model_dump(mode="json") for problem in problems],
    }
    if len(classes.specs) > 1:
        document["device_classes"] = [
            {
                "ranks": rank_ranges(
                    [r for r, c in enumerate(classes.class_of_rank) if c == index]
                ),
                "hbm_bw_bytes_per_s": spec.hbm_bw_bytes_per_s,
                "ddr_bw_bytes_per_s": spec.ddr_bw_bytes_per_s,
            }
            for index, spec in enumerate(classes.specs)
        ]
    return document


def reservation_document(request: PlanRequest, capacities: list[Capacity]) -> dict[str, Any]:
    """What is held back on each rank and why, grouped by identical capacities."""
    tier = "HBM" if request.topology.compute_device.value == "cuda" else "DDR"
    constraints = request.constraints
    groups: dict[tuple[int, int, int, int], list[int]] = {}
    for capacity in capacities:
        key = (
            capacity.hbm_bytes,
            capacity.ddr_bytes,
            capacity.headroom_bytes,
            capacity.dense_bytes,
        )
        groups.setdefault(key, []).append(capacity.rank)
    return {
        "tier": tier,
        "why": (
            f"hbm_headroom_fraction {constraints.hbm_headroom_fraction} of each rank's {tier} "
            "is kept free for allocator fragmentation, caches and estimate error; "
            f"dense_bytes_per_rank {constraints.dense_bytes_per_rank} is kept for the dense "
            "model (parameters, activations, optimizer state)"
        ),
        "ranks": [
            {
                "ranks": rank_ranges(ranks),
                "headroom_bytes": headroom,
                "dense_bytes": dense,
                "usable_hbm_bytes": hbm,
                "usable_ddr_bytes": ddr,
            }
            for (hbm, ddr, headroom, dense), ranks in groups.items()
        ],
    }


def _option_document(option: ShardingOption, classes: DeviceClasses) -> dict[str, Any]:
    fixed = option.placement.value == "fixed"
    shards = []
    offsets = option.offsets()
    for index, shard in enumerate(option.shards):
        device_class = classes.class_of_rank[index] if fixed else 0
        entry: dict[str, Any] = {
            "offsets": list(offsets[index]),
            "sizes": list(shard.sizes),
            "perf": shard.perf[device_class].model_dump(mode="json"),
            "storage": {"hbm_bytes": shard.storage.hbm_bytes, "ddr_bytes": shard.storage.ddr_bytes},
        }
        if len(shard.perf) > 1 and not fixed:
            entry["perf_by_device_class"] = [perf.model_dump(mode="json") for perf in shard.perf]
        shards.append(entry)
    return {
        "sharding_type": option.sharding_type.value,
        "compute_kernel": option.compute_kernel.value,
        "cache_load_factor": option.cache_load_factor,
        "shards": shards,
    }


def rank_ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    parts: list[str] = []
    start = previous = None
    for rank in sorted(ranks):
        if previous is not None and rank == previous + 1:
            previous = rank
            continue
        if start is not None:
            parts.append(f"{start}" if start == previous else f"{start}-{previous}")
        start = previous = rank
    if start is not None:
        parts.append(f"{start}" if start == previous else f"{start}-{previous}")
    return ",".join(parts)
