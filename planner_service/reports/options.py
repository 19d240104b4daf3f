"""``shardplan options``: every table's sharding options with per-shard estimates, as the
JSON document (``options_document``) and as one text table per table (``options_table``),
after what each rank offers once the reservation is held back."""

from __future__ import annotations

from collections import Counter
from typing import Any

from planner_service.costs.options import DeviceClasses, Placement, ShardingOption, TableOptions
from planner_service.plan.capacity import Capacity
from planner_service.plan.order import natural_sorted
from planner_service.plan.types import ComputeDevice, PlanRequest, TableProblem
from planner_service.plan.units import size
from planner_service.reports.tables import rank_ranges, text_table


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
    tier = "HBM" if request.topology.compute_device is ComputeDevice.CUDA else "DDR"
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
    fixed = option.placement is Placement.FIXED
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


OPTION_COLUMNS = (
    "sharding type",
    "kernel",
    "shards",
    "shard rows x cols",
    "perf ms",
    "HBM",
    "DDR",
)


def options_table(request: PlanRequest, document: dict[str, Any]) -> str:
    """``shardplan options --format table``: the options document (``options_document``)
    as one table per table, in natural order, after what each rank offers."""
    sections = [_reservation_section(document["reservation"])]
    described = {table.name: table for table in request.tables}
    for name in natural_sorted(document["tables"]):
        table = described[name]
        title = (
            f"{name}: {table.num_embeddings:,} x {table.embedding_dim} {table.data_type.value}, "
            f"{len(document['tables'][name])} option(s)"
        )
        rows = [_option_row(option) for option in document["tables"][name]]
        sections.append(title + "\n" + text_table(list(OPTION_COLUMNS), rows))
    note = (
        "per option, its largest shard: the perf ms, HBM and DDR that the rank "
        "holding it bears (--format json: every shard, with perf components); shard rows x "
        "cols as count x rows x cols"
    )
    return "\n\n".join(sections) + "\n\n" + note + "\n"


def _reservation_section(reservation: dict[str, Any]) -> str:
    header = ["ranks", "usable HBM", "usable DDR", "headroom", "dense"]
    rows = [
        [
            group["ranks"],
            size(group["usable_hbm_bytes"]),
            size(group["usable_ddr_bytes"]),
            size(group["headroom_bytes"]),
            size(group["dense_bytes"]),
        ]
        for group in reservation["ranks"]
    ]
    return f"usable capacity per rank ({reservation['why']})\n" + text_table(header, rows)


def _option_row(option: dict[str, Any]) -> list[str]:
    shards = option["shards"]
    largest = max(shards, key=lambda shard: (shard["perf"]["total"], shard["sizes"]))
    sizes = Counter(tuple(shard["sizes"]) for shard in shards)
    kernel = option["compute_kernel"]
    if option["cache_load_factor"] is not None:
        kernel += f" (cache {option['cache_load_factor']:g})"
    return [
        option["sharding_type"],
        kernel,
        str(len(shards)),
        ", ".join(f"{count} x {rows} x {cols}" for (rows, cols), count in sizes.items()),
        f"{largest['perf']['total']:.4f}",
        size(max(shard["storage"]["hbm_bytes"] for shard in shards)),
        size(max(shard["storage"]["ddr_bytes"] for shard in shards)),
    ]
