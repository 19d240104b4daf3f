"""Hand-built requests and plans for tests: small, explicit, no solver involved."""

from __future__ import annotations

import json
from typing import Any

from planner_service.plan.codec import parse_request, request_hash, seal_plan_body
from planner_service.plan.compact import NotCompactError, compact_sharding, expand_sharding
from planner_service.plan.runs import rank_runs
from planner_service.plan.schema_version import SCHEMA_VERSION, SCHEMA_VERSION_WITHOUT_MIGRATION
from planner_service.plan.shards import column_wise_shards, row_wise_shards
from planner_service.plan.types import (
    PERF_FIELDS,
    CompactSharding,
    ComputeKernel,
    ParameterSharding,
    Perf,
    PlanRequest,
    RankStats,
    Shard,
    ShardingPlan,
    ShardingType,
    SolverReport,
    SolverStatus,
    Table,
    TableShardingModel,
)
from planner_service.validate.usage import rank_usage


def request(tables: list[dict[str, Any]], world_size: int = 4, **fields: Any) -> PlanRequest:
    """A PlanRequest decoded from JSON exactly as a user's file would be."""
    topology = {"world_size": world_size, **fields.pop("topology", {})}
    document = {"topology": topology, "tables": tables, **fields}
    return parse_request(json.dumps(document))


def table(name: str, rows: int = 100, dim: int = 16, **fields: Any) -> dict[str, Any]:
    return {"name": name, "num_embeddings": rows, "embedding_dim": dim, **fields}


def _table(req: PlanRequest, name: str) -> Table:
    return next(t for t in req.tables if t.name == name)


def seal_plan(
    *,
    request: PlanRequest,
    planner_version: str,
    tables: dict[str, TableShardingModel],
    rank_stats: list[RankStats],
    solver: SolverReport,
    explicit: bool = False,
) -> ShardingPlan:
    """A plan for ``request`` assembled from models and stamped with its content address:
    at schema 2.0 (runs), as the planner writes plans, unless ``explicit`` or a table's
    shards are in a layout runs cannot write (a test of a broken layout): then at 1.1
    (shard lists)."""
    try:
        if explicit:
            raise NotCompactError("asked for shard lists")
        written = {name: compact_sharding(s).model_dump(mode="json") for name, s in tables.items()}
        version = SCHEMA_VERSION
    except NotCompactError:
        written = {name: expand_sharding(s).model_dump(mode="json") for name, s in tables.items()}
        version = SCHEMA_VERSION_WITHOUT_MIGRATION
    return seal_plan_body(
        request_hash=request_hash(request),
        world_size=request.topology.world_size,
        planner_version=planner_version,
        tables=written,
        rank_stats=[stats.model_dump(mode="json") for stats in rank_stats],
        solver=solver.model_dump(mode="json"),
        schema_version=version,
    )


def sharding(
    kind: ShardingType, kernel: ComputeKernel, shards: list[Shard], clf: float | None = None
) -> ParameterSharding:
    return ParameterSharding(
        sharding_type=kind,
        compute_kernel=kernel,
        ranks=[shard.rank for shard in shards],
        shards=shards,
        cache_load_factor=clf,
    )


def table_wise(
    req: PlanRequest, name: str, rank: int, kernel: ComputeKernel = ComputeKernel.FUSED
) -> ParameterSharding:
    t = _table(req, name)
    shard = Shard(offsets=(0, 0), sizes=(t.num_embeddings, t.embedding_dim), rank=rank)
    clf = 0.2 if kernel is ComputeKernel.FUSED_UVM_CACHING else None
    return sharding(ShardingType.TABLE_WISE, kernel, [shard], clf)


def row_wise(req: PlanRequest, name: str) -> ParameterSharding:
    t = _table(req, name)
    ranks = list(range(req.topology.world_size))
    shards = row_wise_shards(t.num_embeddings, t.embedding_dim, ranks)
    return sharding(ShardingType.ROW_WISE, ComputeKernel.FUSED, shards)


def table_row_wise(req: PlanRequest, name: str, host: int) -> ParameterSharding:
    t = _table(req, name)
    ranks = list(req.topology.host_ranks(host))
    shards = row_wise_shards(t.num_embeddings, t.embedding_dim, ranks)
    return sharding(ShardingType.TABLE_ROW_WISE, ComputeKernel.FUSED, shards)


def column_wise(
    req: PlanRequest,
    name: str,
    widths: list[int],
    ranks: list[int],
    kind: ShardingType = ShardingType.COLUMN_WISE,
) -> ParameterSharding:
    t = _table(req, name)
    return sharding(kind, ComputeKernel.FUSED, column_wise_shards(t.num_embeddings, widths, ranks))


def data_parallel(req: PlanRequest, name: str) -> ParameterSharding:
    t = _table(req, name)
    shards = [
        Shard(offsets=(0, 0), sizes=(t.num_embeddings, t.embedding_dim), rank=rank)
        for rank in range(req.topology.world_size)
    ]
    return sharding(ShardingType.DATA_PARALLEL, ComputeKernel.DENSE, shards)


def plan(
    req: PlanRequest,
    tables: dict[str, TableShardingModel],
    hbm_bytes: list[int] | None = None,
    ddr_bytes: list[int] | None = None,
    report: SolverReport | None = None,
    stats_ranks: list[int] | None = None,
    planner_version: str = "test",
    explicit: bool = False,
) -> ShardingPlan:
    """A sealed plan whose rank_stats and report say what its shards really put on each
    rank (recomputed as the validator does), unless given: ``hbm_bytes`` and ``ddr_bytes``
    replace the bytes, ``report`` the solver report. ``stats_ranks``: the ranks rank_stats
    lists (every rank by default). ``explicit``: at schema 1.1 (shard lists)."""
    usage = rank_usage(req, tables)
    ranks = range(req.topology.world_size) if stats_ranks is None else stats_ranks
    loads = [usage.of(rank) for rank in ranks]
    hbm = hbm_bytes or [load.hbm_bytes for load in loads]
    ddr = ddr_bytes or [load.ddr_bytes for load in loads]
    stats = [
        RankStats(
            rank=rank,
            hbm_bytes=hbm[i],
            ddr_bytes=ddr[i],
            perf=Perf(**dict(zip(PERF_FIELDS, load.perf, strict=True))),
        )
        for i, (rank, load) in enumerate(zip(ranks, loads, strict=True))
    ]
    report = report or SolverReport(
        status=SolverStatus.OPTIMAL,
        objective=usage.objective,
        lower_bound=usage.objective,
        gap=0.0,
        critical_path=usage.critical_path,
    )
    return seal_plan(
        request=req,
        planner_version=planner_version,
        tables=tables,
        rank_stats=stats,
        solver=report,
        explicit=explicit,
    )


FIT = {
    "samples": 12,
    "r2": 0.99,
    "rms_residual_ms": 0.01,
    "median_relative_error": 0.03,
    "max_relative_error": 0.1,
}


def kernel_coefficients(kernel: str, scale: float = 1.0, **fields: Any) -> dict[str, Any]:
    """A kernel's coefficients in a profile, each ``scale`` times a plausible cpu value."""
    coefficients = {
        "call_fwd_ms": 0.05,
        "call_bwd_ms": 0.08,
        "fwd_us_per_id": 0.02,
        "fwd_ns_per_byte": 0.3,
        "fwd_ns_per_out_byte": 0.5,
        "bwd_us_per_id": 0.04,
        "bwd_ns_per_byte": 0.6,
        "bwd_ns_per_row_byte": 1.0,
    }
    scaled = {name: value * scale for name, value in coefficients.items()}
    return {"compute_kernel": kernel, **scaled, "fit_fwd": FIT, "fit_bwd": FIT, **fields}


def device_profile(
    device: str = "cpu", world_sizes: tuple[int, ...] = (2,), **fields: Any
) -> dict[str, Any]:
    """A device profile's JSON data with plausible cpu coefficients (as ``shardplan
    calibrate`` writes it), for requests with ``cost_model: calibrated``."""
    kernels = [kernel_coefficients("fused"), kernel_coefficients("dense")]
    if device == "cuda":
        kernels += [
            kernel_coefficients("fused_uvm", 5.0),
            kernel_coefficients("fused_uvm_caching", 3.0, cache_hit_rate=0.2),
            kernel_coefficients("fused_uvm_caching", 1.5, cache_hit_rate=0.8),
        ]
    collectives = [
        {
            "collective": kind,
            "world_size": world,
            "ranks_per_host": world,
            "latency_ms": 0.2,
            "ns_per_byte": 1.0,
            "fit": FIT,
        }
        for kind in ("all_to_all", "reduce_scatter", "all_gather")
        for world in world_sizes
    ]
    runtime = {
        "step_ms": 1.0,
        "input_us_per_id": 0.05,
        "output_ns_per_byte": 0.2,
        "sharding_type_ms": {"row_wise": 0.3},
        "fit": FIT,
    }
    profile = {
        "name": f"test-{device}",
        "compute_device": device,
        "machine": {"cpu_count": 2, "threads_per_rank": 1},
        "kernels": kernels,
        "collectives": collectives,
        "runtime": runtime,
    }
    return {**profile, **fields}


# --------------------------------------------------------------------------- plan JSON


def shard_list(table_data: dict[str, Any]) -> list[dict[str, Any]]:
    """A plan table's shards as JSON records (``offsets``, ``sizes``, ``rank``), from its
    JSON data in either form (2.0 runs, 1.x shard lists)."""
    model = ParameterSharding if "shards" in table_data else CompactSharding
    return [shard.model_dump(mode="json") for shard in model.model_validate(table_data).shards]


def move_shard(table_data: dict[str, Any], index: int, rank: int) -> None:
    """Edit a plan table's JSON data (either form) so that shard ``index`` is on ``rank``:
    what a tampering test changes after the plan was sealed."""
    if "shards" in table_data:
        table_data["shards"][index]["rank"] = rank
        return
    ranks = CompactSharding.model_validate(table_data).ranks
    ranks[index] = rank
    table_data["ranks"] = [run if isinstance(run, int) else list(run) for run in rank_runs(ranks)]
