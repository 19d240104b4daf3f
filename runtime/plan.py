"""Plans as the runtime reads them, hand-built plans for tests and scripts, and the check of a
plan against the module and process group that runs before anything is allocated.

A plan is the planner's ``ShardingPlan`` (an object, or its JSON as fetched from the
service), or a ``ModulePlan`` built here with ``construct_module_plan`` and the per-table
helpers (``table_wise(rank=0)``, ``column_wise(ranks=[0, 1, 0])``, ...), named after
TorchRec's ``construct_module_sharding_plan`` helpers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from planner_service.plan.canonical import plan_id_of
from planner_service.plan.codec import parse_plan
from planner_service.plan.errors import problems_from_validation_error
from planner_service.plan.shards import COLUMN_ALIGNMENT, column_wise_shards, row_wise_shards
from planner_service.plan.types import (
    CompactSharding,
    ComputeKernel,
    ParameterSharding,
    Shard,
    ShardingPlan,
    ShardingType,
    Table,
    TableShardingModel,
    Topology,
)
from planner_service.validate.validator import check_layout
from runtime.choices import choice
from runtime.modules import BaseEmbeddingConfig

ROW_SPLIT = (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE)


class PlanMismatchError(ValueError):
    """The plan does not fit the module or the process group (raised before allocating)."""


@dataclass(frozen=True)
class ModulePlan:
    """What the runtime needs of a plan: the world size and each table's sharding."""

    world_size: int
    tables: Mapping[str, TableShardingModel]
    plan_id: str | None = None

    def __post_init__(self) -> None:
        tables = {name: _parameter_sharding(name, s) for name, s in self.tables.items()}
        object.__setattr__(self, "tables", tables)

    @staticmethod
    def of(plan: ModulePlan | ShardingPlan | bytes | str | Mapping[str, object]) -> ModulePlan:
        """The runtime's view of a plan; a planner plan (object, JSON or its data) must be
        the content its ``plan_id`` names (``check_plan_id``)."""
        if isinstance(plan, ModulePlan):
            return plan
        if isinstance(plan, bytes | str):
            plan = parse_plan(plan)
        elif isinstance(plan, Mapping):
            plan = ShardingPlan.model_validate(plan)
        if not isinstance(plan, ShardingPlan):
            raise TypeError(f"plan must be a ShardingPlan, its JSON or a ModulePlan; got {plan!r}")
        check_plan_id(plan)
        return ModulePlan(plan.world_size, dict(plan.tables), plan.plan_id)


def _parameter_sharding(table: str, sharding: object) -> TableShardingModel:
    """A ``ModulePlan`` table's sharding: a ``ParameterSharding`` or ``CompactSharding``,
    or the JSON data of either (enums as their string values), read once here."""
    if isinstance(sharding, ParameterSharding | CompactSharding):
        return sharding
    if not isinstance(sharding, Mapping):
        raise PlanMismatchError(
            f"table {table!r}: its sharding is a {type(sharding).__name__}; give a "
            "ParameterSharding (a plan builder's), a CompactSharding or its JSON data"
        )
    model = ParameterSharding if "shards" in sharding else CompactSharding
    try:
        return model.model_validate(sharding)
    except ValidationError as error:
        problems = problems_from_validation_error(error, model)
        details = "; ".join(problem.render() for problem in problems)
        raise PlanMismatchError(f"table {table!r}: {details}") from None


def check_plan_id(plan: ShardingPlan) -> None:
    """Refuse a plan whose content is not what its ``plan_id`` addresses.

    Training workers fetch plans by id or alias and log the id as the identity of the
    layout they run; a plan edited after it was sealed (a hand-tuned kernel, a re-split
    table, a damaged copy) would otherwise run under the id of a plan that was validated.
    This is the check ``shardplan validate`` makes, on the same canonical content."""
    actual = plan_id_of(plan.model_dump(mode="json"))
    if actual != plan.plan_id:
        raise PlanMismatchError(
            f"the plan says plan_id {plan.plan_id} but its content hashes to {actual}: it was "
            "changed after the planner sealed it; fetch it again (GET /v1/plans/{plan_id}), or "
            "apply a deliberate change as a ModulePlan (construct_module_plan), which claims no "
            "plan_id"
        )


# --------------------------------------------------------------------------- helpers

TableSharder = Callable[[BaseEmbeddingConfig, int, int], ParameterSharding]


def _kernel(kernel: object, builder: str) -> ComputeKernel:
    """The builder's ``kernel``, read when the builder is called (not when it builds)."""
    return choice(ComputeKernel, kernel, "kernel", owner=builder)


def _sharding(kind: ShardingType, kernel: ComputeKernel, shards: list[Shard]) -> ParameterSharding:
    ranks = [s.rank for s in shards]
    return ParameterSharding(sharding_type=kind, compute_kernel=kernel, ranks=ranks, shards=shards)


def table_wise(rank: int, kernel: ComputeKernel = ComputeKernel.FUSED) -> TableSharder:
    kernel = _kernel(kernel, "table_wise")

    def build(table: BaseEmbeddingConfig, world: int, local: int) -> ParameterSharding:
        shard = Shard(offsets=(0, 0), sizes=(table.num_embeddings, table.embedding_dim), rank=rank)
        return _sharding(ShardingType.TABLE_WISE, kernel, [shard])

    return build


def _even_widths(dim: int, parts: int) -> list[int]:
    """``parts`` widths in multiples of COLUMN_ALIGNMENT summing to ``dim``, widest first."""
    units = dim // COLUMN_ALIGNMENT
    base, extra = divmod(units, parts)
    return [(base + (i < extra)) * COLUMN_ALIGNMENT for i in range(parts)]


def column_wise(
    ranks: Sequence[int],
    widths: Sequence[int] | None = None,
    kernel: ComputeKernel = ComputeKernel.FUSED,
) -> TableSharder:
    """Column shards left to right on ``ranks`` (a rank may repeat: [0, 1, 0])."""
    kernel = _kernel(kernel, "column_wise")

    def build(table: BaseEmbeddingConfig, world: int, local: int) -> ParameterSharding:
        cut = list(widths) if widths is not None else _even_widths(table.embedding_dim, len(ranks))
        shards = column_wise_shards(table.num_embeddings, cut, ranks)
        return _sharding(ShardingType.COLUMN_WISE, kernel, shards)

    return build


def table_column_wise(
    host: int, ranks: Sequence[int] | None = None, kernel: ComputeKernel = ComputeKernel.FUSED
) -> TableSharder:
    """Column shards on ranks of one host (default: each local rank of ``host`` once)."""
    kernel = _kernel(kernel, "table_column_wise")

    def build(table: BaseEmbeddingConfig, world: int, local: int) -> ParameterSharding:
        on = list(ranks) if ranks is not None else list(range(host * local, (host + 1) * local))
        cut = _even_widths(table.embedding_dim, len(on))
        shards = column_wise_shards(table.num_embeddings, cut, on)
        return _sharding(ShardingType.TABLE_COLUMN_WISE, kernel, shards)

    return build


def row_wise(kernel: ComputeKernel = ComputeKernel.FUSED) -> TableSharder:
    kernel = _kernel(kernel, "row_wise")

    def build(table: BaseEmbeddingConfig, world: int, local: int) -> ParameterSharding:
        shards = row_wise_shards(table.num_embeddings, table.embedding_dim, range(world))
        return _sharding(ShardingType.ROW_WISE, kernel, shards)

    return build


def table_row_wise(host: int, kernel: ComputeKernel = ComputeKernel.FUSED) -> TableSharder:
    kernel = _kernel(kernel, "table_row_wise")

    def build(table: BaseEmbeddingConfig, world: int, local: int) -> ParameterSharding:
        on = range(host * local, (host + 1) * local)
        shards = row_wise_shards(table.num_embeddings, table.embedding_dim, on)
        return _sharding(ShardingType.TABLE_ROW_WISE, kernel, shards)

    return build


def data_parallel() -> TableSharder:
    def build(table: BaseEmbeddingConfig, world: int, local: int) -> ParameterSharding:
        size = (table.num_embeddings, table.embedding_dim)
        shards = [Shard(offsets=(0, 0), sizes=size, rank=r) for r in range(world)]
        return _sharding(ShardingType.DATA_PARALLEL, ComputeKernel.DENSE, shards)

    return build


def construct_module_plan(
    tables: Sequence[BaseEmbeddingConfig],
    per_table: Mapping[str, TableSharder],
    *,
    world_size: int,
    local_world_size: int | None = None,
) -> ModulePlan:
    """A plan from one helper per table name (TorchRec's ``construct_module_sharding_plan``)."""
    local = local_world_size or world_size
    by_name = {t.name: t for t in tables}
    unknown = sorted(set(per_table) - set(by_name))
    if unknown:
        raise PlanMismatchError(f"per_table names tables {unknown} that the module does not have")
    return ModulePlan(
        world_size,
        {name: build(by_name[name], world_size, local) for name, build in per_table.items()},
    )


# --------------------------------------------------------------------------- checks


def check_plan(plan: ModulePlan, tables: Sequence[BaseEmbeddingConfig], world_size: int) -> None:
    """Raise ``PlanMismatchError`` naming the table and the numbers when the plan cannot be
    applied to these tables on ``world_size`` ranks."""
    if plan.world_size != world_size:
        raise PlanMismatchError(
            f"the plan is for world_size {plan.world_size} but the process group has "
            f"{world_size} ranks; plan again for {world_size} ranks or start "
            f"{plan.world_size} processes"
        )
    names = {t.name for t in tables}
    missing = sorted(names - set(plan.tables))
    if missing:
        raise PlanMismatchError(f"the plan has no sharding for tables {missing}")
    unknown = sorted(set(plan.tables) - names)
    if unknown:
        raise PlanMismatchError(
            f"the plan shards tables {unknown} that the module does not have "
            f"(module tables: {sorted(names)})"
        )
    local = host_size(plan) or world_size
    topology = Topology(world_size=world_size, local_world_size=local)
    for table in tables:
        _check_table(table, plan.tables[table.name], topology)


def host_size(plan: ModulePlan) -> int | None:
    """Ranks per host, as the plan's table-row-wise tables show it (``None`` without any).

    A table-row-wise table's row blocks are on every rank of one host: ranks
    ``h * L .. h * L + L - 1`` for a host size ``L`` that divides the world size and is the
    same for every such table (the planner places them so; the exchange reduces inside the
    host and then crosses hosts, so it needs the hosts)."""
    size: int | None = None
    first = ""
    for name, sharding in sorted(plan.tables.items()):
        if sharding.sharding_type is not ShardingType.TABLE_ROW_WISE:
            continue
        ranks = sorted(sharding.ranks)
        local = len(ranks)
        if ranks != list(range(ranks[0], ranks[0] + local)) or ranks[0] % local:
            raise PlanMismatchError(
                f"table {name!r} (table_row_wise): its row blocks are on ranks {ranks}; they "
                f"must be all the ranks of one host, h * {local} .. h * {local} + {local - 1}"
            )
        if plan.world_size % local:
            raise PlanMismatchError(
                f"table {name!r} (table_row_wise) spans hosts of {local} ranks, which do not "
                f"divide world_size {plan.world_size}"
            )
        if size is not None and local != size:
            raise PlanMismatchError(
                f"table {name!r} (table_row_wise) spans a host of {local} ranks but table "
                f"{first!r} spans {size}; every host has the same number of ranks"
            )
        size, first = local, first or name
    return size


def _check_table(
    table: BaseEmbeddingConfig, sharding: TableShardingModel, topology: Topology
) -> None:
    """The planner's layout rules (``validator.check_layout``), then what FBGEMM's kernels
    need of every shard."""
    kind = sharding.sharding_type.value
    config = Table.model_construct(
        name=table.name, num_embeddings=table.num_embeddings, embedding_dim=table.embedding_dim
    )
    violations = check_layout(topology, config, sharding)
    if violations:
        prefix = f"table {table.name!r}: "
        details = "; ".join(v.message.removeprefix(prefix) for v in violations)
        raise PlanMismatchError(f"table {table.name!r} ({kind}): {details}")
    for width in _widths(sharding):
        if width % COLUMN_ALIGNMENT:
            raise PlanMismatchError(
                f"table {table.name!r} ({kind}): a shard is {width} columns wide; FBGEMM's "
                f"kernels need widths that are multiples of {COLUMN_ALIGNMENT}"
            )


def _widths(sharding: TableShardingModel) -> set[int]:
    """The widths of the shards that hold rows, read from the runs where there are runs
    (a table row-split over every rank has one width, not one per rank)."""
    if isinstance(sharding, ParameterSharding):
        return {shard.sizes[1] for shard in sharding.shards if shard.sizes[0]}
    if not sharding.shape[0]:
        return set()
    if sharding.column_widths is None:
        return {sharding.shape[1]}
    return {width for width, _ in sharding.column_widths}
