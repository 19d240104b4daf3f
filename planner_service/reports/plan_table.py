"""``shardplan plan --format table``: a stats table like TorchRec's, per rank (usage in
bytes and in percent of the usable capacity, perf components and the rule that sums them),
per table, then the solver report. The plan page (``service/pages/plan.py``) shows
the same perf rule."""

from __future__ import annotations

from planner_service.costs.estimate import total_components
from planner_service.plan.capacity import Capacity
from planner_service.plan.order import natural_sorted
from planner_service.plan.types import PERF_COMPONENTS, CostModel, PlanRequest, ShardingPlan
from planner_service.plan.units import size
from planner_service.reports.tables import (
    SHARDING_TYPE_SHORT,
    rank_ranges,
    text_table,
    usage_cell,
)

USABLE_NOTE = (
    "% of usable: of what the rank offers to tables after the reservation "
    "(hbm_headroom_fraction, dense_bytes_per_rank); KiB, MiB, GiB = 2^10, 2^20, 2^30 bytes"
)


def perf_rule(cost_model: CostModel) -> str:
    """How the perf components add up to ``perf.total`` under ``cost_model``, as a line
    printed under every table that shows them."""
    summed = total_components(cost_model)
    rule = f"perf ms = {' + '.join(summed)}"
    left_out = [name for name in PERF_COMPONENTS if name not in summed]
    if left_out:
        rule += f" ({', '.join(left_out)} is shown but not summed under cost model "
        rule += f"{cost_model.value}, as TorchRec does)"
    return rule


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
        label = SHARDING_TYPE_SHORT[sharding.sharding_type]
        for shard in sharding.shards:
            counts = shard_counts[shard.rank]
            counts[label] = counts.get(label, 0) + 1
    header = [
        "rank",
        "HBM (% of usable)",
        "DDR (% of usable)",
        "perf ms",
        *PERF_COMPONENTS,
        "input",
        "output",
        "shards",
    ]
    rows = []
    for stats in plan.rank_stats:
        capacity = capacities[stats.rank]
        io = rank_io_bytes[stats.rank] if stats.rank < len(rank_io_bytes) else (0, 0)
        rows.append(
            [
                str(stats.rank),
                usage_cell(stats.hbm_bytes, capacity.hbm_bytes),
                usage_cell(stats.ddr_bytes, capacity.ddr_bytes),
                f"{stats.perf.total:.4f}",
                *(f"{getattr(stats.perf, name):.4f}" for name in PERF_COMPONENTS),
                size(io[0]),
                size(io[1]),
                " ".join(f"{k}:{v}" for k, v in sorted(shard_counts[stats.rank].items())) or "-",
            ]
        )
    notes = [USABLE_NOTE, perf_rule(request.options.cost_model)]
    return text_table(header, rows) + "\n" + "\n".join(notes)


def _table_section(plan: ShardingPlan) -> str:
    header = ["table", "sharding type", "kernel", "shards", "ranks"]
    rows = []
    for name in natural_sorted(plan.tables):
        sharding = plan.tables[name]
        rows.append(
            [
                name,
                sharding.sharding_type.value,
                sharding.compute_kernel.value,
                str(sharding.num_shards),
                rank_ranges(sorted(set(sharding.ranks))),
            ]
        )
    return text_table(header, rows)


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
