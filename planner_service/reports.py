"""Documents and text rendered from planner results, for the CLI and the service."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from planner_service.costs.options import DeviceClasses, Placement, ShardingOption, TableOptions
from planner_service.plan.capacity import Capacity, usable_capacity
from planner_service.plan.types import (
    PERF_COMPONENTS,
    ComputeDevice,
    PlanRequest,
    ShardingPlan,
    TableProblem,
)


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


# --------------------------------------------------------------------------- plan tables

# TorchRec's stats table's perf columns: every component but input_dist.
_PERF_COLUMNS = tuple(name for name in PERF_COMPONENTS if name != "input_dist")
_TYPE_ABBREVIATIONS = {
    "table_wise": "TW",
    "row_wise": "RW",
    "column_wise": "CW",
    "table_row_wise": "TWRW",
    "table_column_wise": "TWCW",
    "data_parallel": "DP",
}


def plan_table(
    request: PlanRequest,
    plan: ShardingPlan,
    capacities: list[Capacity],
    rank_io_bytes: list[tuple[int, int]],
    wall_time_s: float,
) -> str:
    """A stats table like TorchRec's: per rank, per table, then the solver report."""
    sections = [
        _rank_section(request, plan, capacities, rank_io_bytes),
        _table_section(plan),
        _report_section(plan, wall_time_s),
    ]
    return "\n\n".join(sections) + "\n"


def _rank_section(
    request: PlanRequest,
    plan: ShardingPlan,
    capacities: list[Capacity],
    rank_io_bytes: list[tuple[int, int]],
) -> str:
    shard_counts: list[dict[str, int]] = [{} for _ in plan.rank_stats]
    for sharding in plan.tables.values():
        label = _TYPE_ABBREVIATIONS[sharding.sharding_type.value]
        for shard in sharding.shards:
            counts = shard_counts[shard.rank]
            counts[label] = counts.get(label, 0) + 1
    header = [
        "rank",
        "HBM GB (used %)",
        "DDR GB",
        "perf ms",
        *_PERF_COLUMNS,
        "input MB",
        "output MB",
        "shards",
    ]
    rows = []
    for stats in plan.rank_stats:
        total_hbm = capacities[stats.rank].hbm_bytes + capacities[stats.rank].reserved_bytes
        used = f"{stats.hbm_bytes / 1e9:.2f} ({_percent(stats.hbm_bytes, total_hbm)})"
        io = rank_io_bytes[stats.rank] if stats.rank < len(rank_io_bytes) else (0, 0)
        rows.append(
            [
                str(stats.rank),
                used,
                f"{stats.ddr_bytes / 1e9:.2f}",
                f"{stats.perf.total:.4f}",
                *(f"{getattr(stats.perf, name):.4f}" for name in _PERF_COLUMNS),
                f"{io[0] / 1e6:.2f}",
                f"{io[1] / 1e6:.2f}",
                " ".join(f"{k}:{v}" for k, v in sorted(shard_counts[stats.rank].items())) or "-",
            ]
        )
    return _render(header, rows)


def _table_section(plan: ShardingPlan) -> str:
    header = ["table", "sharding type", "kernel", "shards", "ranks"]
    rows = [
        [
            name,
            sharding.sharding_type.value,
            sharding.compute_kernel.value,
            str(len(sharding.shards)),
            rank_ranges(sorted(set(sharding.ranks))),
        ]
        for name, sharding in sorted(plan.tables.items())
    ]
    return _render(header, rows)


def _report_section(plan: ShardingPlan, wall_time_s: float) -> str:
    report = plan.solver
    return "\n".join(
        [
            f"status        {report.status.value}",
            f"objective     {report.objective:.6f} ms (max over ranks of perf total)",
            f"lower bound   {report.lower_bound:.6f} ms ({report.lower_bound_source})",
            f"gap           {report.gap:.4%}",
            f"critical path {report.critical_path:.6f} ms",
            f"wall time     {wall_time_s:.2f} s",
            f"plan_id       {plan.plan_id}",
        ]
    )


def _percent(used: int, total: int) -> str:
    return f"{used / total:.0%}" if total else "-"


def _render(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in [header, *rows]
    ]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """Columns aligned under a header and a rule, as the CLI prints its tables."""
    return _render(header, rows)


# --------------------------------------------------------------------------- headroom


class RankHeadroom(BaseModel):
    """One rank's bytes per tier against what it can hold, and its estimated time."""

    rank: int
    hbm_used_bytes: int
    hbm_usable_bytes: int = Field(description="after hbm_headroom_fraction and dense bytes")
    hbm_free_bytes: int
    ddr_used_bytes: int
    ddr_usable_bytes: int
    ddr_free_bytes: int
    perf_total_ms: float


def rank_headroom(request: PlanRequest, plan: ShardingPlan) -> list[RankHeadroom]:
    """Every rank's headroom under ``plan`` (``POST /v1/check`` and ``shardplan check``);
    usable is what the rank offers after the reservation (``plan/capacity.py``)."""
    capacities = usable_capacity(request.topology, request.constraints)
    return [
        RankHeadroom(
            rank=stats.rank,
            hbm_used_bytes=stats.hbm_bytes,
            hbm_usable_bytes=capacity.hbm_bytes,
            hbm_free_bytes=capacity.hbm_bytes - stats.hbm_bytes,
            ddr_used_bytes=stats.ddr_bytes,
            ddr_usable_bytes=capacity.ddr_bytes,
            ddr_free_bytes=capacity.ddr_bytes - stats.ddr_bytes,
            perf_total_ms=stats.perf.total,
        )
        for stats, capacity in zip(plan.rank_stats, capacities, strict=True)
    ]
