"""Converting between a table's two written forms, and a plan's: explicit shard lists
(``ParameterSharding``, schemas 1.x) and runs (``CompactSharding``, schema 2.0).

``compact_sharding`` writes any layout the validator accepts as runs (column shards left
to right, the order schema 2.0 defines) and refuses one runs cannot write;
``expand_sharding`` lists the shards back. ``expand_plan`` re-seals a 2.0 plan as 1.x for
a reader that predates 2.0 (its plan_id changes with its bytes), ``compact_plan`` the
other way; ``table_runs`` is the JSON data of one table's runs, which the planner emits.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner_service.plan.codec import seal_plan_body
from planner_service.plan.json_data import JsonObject
from planner_service.plan.runs import rank_runs, width_runs
from planner_service.plan.schema_version import (
    SCHEMA_VERSION,
    SCHEMA_VERSION_WITH_MIGRATION,
    SCHEMA_VERSION_WITHOUT_MIGRATION,
)
from planner_service.plan.types import (
    COLUMN_SHARDING_TYPES,
    ROW_SHARDING_TYPES,
    CompactSharding,
    ComputeKernel,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
    TableShardingModel,
)


class NotCompactError(ValueError):
    """A shard list whose layout a split rule and a rank list cannot write."""


def table_runs(
    *,
    sharding_type: ShardingType,
    compute_kernel: ComputeKernel,
    shape: tuple[int, int],
    ranks: Sequence[int],
    split: Sequence[int],
    cache_load_factor: float | None,
) -> JsonObject:
    """A table's runs as JSON data. ``split``: each shard's rows (row types) or columns
    (column types), in shard order; row blocks are all ``split[0]`` rows but the remainder
    and the empty ones after it."""
    data: JsonObject = {
        "sharding_type": sharding_type.value,
        "compute_kernel": compute_kernel.value,
        "shape": list(shape),
        "ranks": [run if isinstance(run, int) else list(run) for run in rank_runs(ranks)],
    }
    if sharding_type in ROW_SHARDING_TYPES:
        data["rows_per_shard"] = split[0]
    elif sharding_type in COLUMN_SHARDING_TYPES:
        data["column_widths"] = [list(run) for run in width_runs(split)]
    if cache_load_factor is not None:
        data["cache_load_factor"] = cache_load_factor
    return data


def compact_sharding(sharding: TableShardingModel) -> CompactSharding:
    """``sharding`` as runs; NotCompactError when no runs give back its shards (a row
    split other than equal blocks, column shards out of column order, a table-wise table
    of several shards...), which the validator refuses too."""
    if isinstance(sharding, CompactSharding):
        return sharding
    shards = sharding.shards
    shape = (
        max(s.offsets[0] + s.sizes[0] for s in shards),
        max(s.offsets[1] + s.sizes[1] for s in shards),
    )
    kind = sharding.sharding_type
    axis = 0 if kind in ROW_SHARDING_TYPES else 1
    try:
        compact = CompactSharding.model_validate(
            table_runs(
                sharding_type=kind,
                compute_kernel=sharding.compute_kernel,
                shape=shape,
                ranks=[s.rank for s in shards],
                split=[s.sizes[axis] for s in shards],
                cache_load_factor=sharding.cache_load_factor,
            )
        )
    except ValueError as error:  # pydantic's ValidationError is a ValueError
        raise NotCompactError(f"{kind.value} shards that runs cannot write: {error}") from None
    if compact.shards != shards or sharding.ranks != compact.ranks:
        raise NotCompactError(
            f"{kind.value} shards that runs cannot write: they are not "
            f"{_layout_of(kind)} on the ranks they name"
        )
    return compact


def _layout_of(kind: ShardingType) -> str:
    if kind in ROW_SHARDING_TYPES:
        return "equal row blocks in order (the last with rows holding the remainder)"
    if kind in COLUMN_SHARDING_TYPES:
        return "full-height column blocks left to right"
    return "whole copies of the table"


def expand_sharding(sharding: TableShardingModel) -> ParameterSharding:
    """``sharding`` as an explicit shard list (schema 1.x's form)."""
    if isinstance(sharding, ParameterSharding):
        return sharding
    return ParameterSharding(
        sharding_type=sharding.sharding_type,
        compute_kernel=sharding.compute_kernel,
        ranks=sharding.ranks,
        shards=sharding.shards,
        cache_load_factor=sharding.cache_load_factor,
    )


def compact_plan(plan: ShardingPlan) -> ShardingPlan:
    """``plan`` at schema 2.0, re-sealed (a new plan_id); NotCompactError naming the
    table when one's shards cannot be written as runs."""
    tables = {}
    for name, sharding in plan.tables.items():
        try:
            tables[name] = compact_sharding(sharding).model_dump(mode="json")
        except NotCompactError as error:
            raise NotCompactError(f"table {name!r}: {error}") from None
    return _reseal(plan, tables, SCHEMA_VERSION)


def expand_plan(plan: ShardingPlan) -> ShardingPlan:
    """``plan`` with explicit shard lists at the oldest 1.x schema that has its fields,
    re-sealed (a new plan_id): for readers that predate schema 2.0."""
    tables = {
        name: expand_sharding(sharding).model_dump(mode="json")
        for name, sharding in plan.tables.items()
    }
    migrated = plan.migration is not None
    version = SCHEMA_VERSION_WITH_MIGRATION if migrated else SCHEMA_VERSION_WITHOUT_MIGRATION
    return _reseal(plan, tables, version)


def _reseal(plan: ShardingPlan, tables: dict[str, JsonObject], version: str) -> ShardingPlan:
    data = plan.model_dump(mode="json")
    return seal_plan_body(
        request_hash=plan.request_hash,
        world_size=plan.world_size,
        planner_version=plan.planner_version,
        tables=tables,
        rank_stats=[stats.model_dump(mode="json") for stats in plan.rank_stats],
        solver=data["solver"],
        migration=data.get("migration"),
        schema_version=version,
    )


__all__ = [
    "NotCompactError",
    "compact_plan",
    "compact_sharding",
    "expand_plan",
    "expand_sharding",
    "table_runs",
]
