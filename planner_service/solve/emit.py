"""Emitting a plan: the chosen placement as a sealed ``ShardingPlan``, with its rank stats
and its solver report (status, bound, gap, critical path, stop reason), and the per-rank
buffer sizes reported beside it. The last stage of ``pipeline.solve``.
"""

from __future__ import annotations

import numpy as np

from planner_service import PLANNER_VERSION
from planner_service.costs.estimate import total_components
from planner_service.costs.options import Placement, ShardingOption
from planner_service.plan.codec import seal_plan_data
from planner_service.plan.compact import table_runs
from planner_service.plan.json_data import JsonObject
from planner_service.plan.types import (
    COLUMN_SHARDING_TYPES,
    PERF_COMPONENTS,
    Migration,
    Perf,
    PlanOptions,
    ShardingPlan,
    SolverReport,
    SolverStatus,
    StopReason,
    Table,
    gap,
)
from planner_service.solve.bounds.simple import OPTIMAL_GAP, LowerBound
from planner_service.solve.problem import Choice, Loads, Problem


def build_plan(
    problem: Problem,
    choices: list[Choice],
    loads: Loads,
    bound: LowerBound,
    deadline_reached: bool = False,
    migration: Migration | None = None,
    fixed_costs: Perf | None = None,
) -> ShardingPlan:
    """The sealed plan of ``choices``. Built as JSON data and validated once: a plan can
    hold hundreds of thousands of shards, and sealing happens after the deadline.
    ``fixed_costs``: what every rank pays whatever it holds (the calibrated model's fixed costs;
    ``bound`` then includes them too)."""
    tables: dict[str, JsonObject] = {}
    components = np.zeros((problem.world_size, len(PERF_COMPONENTS)))
    vectors: dict[int, np.ndarray] = {}  # shards of one size share one Perf object
    # Options fixed on every rank (row-wise, data-parallel: world-size shards each) always
    # have the same shards on the same ranks: their per-rank components are built once per
    # option and shared by every table that takes it.
    fixed: dict[int, np.ndarray] = {}
    for entry, choice in zip(problem.tables, choices, strict=True):
        option = entry.options[choice.option]
        ranks = [int(rank) for rank in choice.ranks]
        known = fixed.get(id(option))
        if known is None:
            # one shard per rank when fixed: adding them into zeros first is exact
            is_fixed = option.placement is Placement.FIXED
            added = np.zeros_like(components) if is_fixed else components
            for shard, rank in zip(option.shards, ranks, strict=True):
                perf = shard.perf[problem.class_of_rank[rank]]
                vector = vectors.get(id(perf))
                if vector is None:
                    vector = np.array([getattr(perf, n) for n in PERF_COMPONENTS])
                    vectors[id(perf)] = vector
                added[rank] += vector
            if is_fixed:
                fixed[id(option)] = added
                components += added
        else:
            components += known
        tables[entry.table.name] = _table_runs(entry.table, option, ranks)
    fixed_total = 0.0
    if fixed_costs is not None and fixed_costs.total:
        components += np.array([getattr(fixed_costs, n) for n in PERF_COMPONENTS])
        fixed_total = fixed_costs.total
    rank_stats = [
        {
            "rank": rank,
            "hbm_bytes": int(loads.hbm[rank]),
            "ddr_bytes": int(loads.ddr[rank]),
            "perf": {
                **dict(zip(PERF_COMPONENTS, map(float, components[rank]), strict=True)),
                "total": float(loads.perf[rank]) + fixed_total,
            },
        }
        for rank in range(problem.world_size)
    ]
    objective = loads.objective + fixed_total
    lower = min(bound.value, objective)
    plan_gap = gap(objective, lower)
    report = SolverReport(
        status=SolverStatus.OPTIMAL if plan_gap <= OPTIMAL_GAP else SolverStatus.FEASIBLE,
        objective=objective,
        lower_bound=lower,
        gap=plan_gap,
        lower_bound_source=bound.source,
        critical_path=_critical_path(problem, components),
        stop_reason=_stop_reason(plan_gap, problem.request.options, deadline_reached),
    )
    return seal_plan_data(
        request=problem.request,
        planner_version=PLANNER_VERSION,
        tables=tables,
        rank_stats=rank_stats,
        solver=report.model_dump(mode="json"),
        migration=None if migration is None else migration.model_dump(mode="json"),
    )


def _table_runs(table: Table, option: ShardingOption, ranks: list[int]) -> JsonObject:
    """The table's shards as runs (plan schema 2.0): its option's split rule, its ranks."""
    axis = 1 if option.sharding_type in COLUMN_SHARDING_TYPES else 0
    return table_runs(
        sharding_type=option.sharding_type,
        compute_kernel=option.compute_kernel,
        shape=(table.num_embeddings, table.embedding_dim),
        ranks=ranks,
        split=[estimate.sizes[axis] for estimate in option.shards],
        cache_load_factor=option.cache_load_factor,
    )


def rank_io(problem: Problem, choices: list[Choice]) -> list[tuple[int, int]]:
    """(input id bytes, output embedding bytes) each rank's shards buffer per iteration."""
    io = np.zeros((problem.world_size, 2), dtype=np.int64)
    per_shard: dict[int, np.ndarray] = {}  # per option: each shard's (input, output) bytes
    for entry, choice in zip(problem.tables, choices, strict=True):
        option = entry.options[choice.option]
        shards = per_shard.get(id(option))
        if shards is None:
            counts = [count for _, count in option.runs]
            each = [(s.storage.input_bytes, s.storage.output_bytes) for s, _ in option.runs]
            shards = per_shard[id(option)] = np.repeat(np.array(each, np.int64), counts, axis=0)
        np.add.at(io, np.asarray(choice.ranks, dtype=np.int64), shards)
    return [(int(i), int(o)) for i, o in io]


def _stop_reason(plan_gap: float, options: PlanOptions, deadline_reached: bool) -> StopReason:
    """Why the search ended. ``time_limit`` whenever the wall clock cut a stage short, even
    if the plan was then proven optimal: the status says how good the plan is, the stop
    reason whether the same request reproduces it."""
    if deadline_reached:
        return StopReason.TIME_LIMIT
    if plan_gap <= OPTIMAL_GAP:
        return StopReason.OPTIMAL
    if plan_gap <= options.gap_limit:
        return StopReason.GAP_LIMIT
    return StopReason.WORK_BUDGET


def _critical_path(problem: Problem, components: np.ndarray) -> float:
    """Sum over the perf components in the total of their max over ranks: every rank waits
    for the slowest at each collective."""
    if not len(components):
        return 0.0
    in_total = total_components(problem.request.options.cost_model)
    counted = [i for i, name in enumerate(PERF_COMPONENTS) if name in in_total]
    return float(components[:, counted].max(axis=0).sum())
