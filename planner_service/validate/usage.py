"""What a plan's shards put on each rank, recomputed from the shards and the request.

The validator checks capacities on these numbers, not on the ``rank_stats`` a plan reports
about itself, and compares the two: a solver that wrote its own numbers (``hbm_bytes: 0``)
would otherwise pass. Each shard is priced as the enumerator prices it (``estimate_storage``
for its rows and columns, ``estimate_perf`` for its width on its rank's device class), once
per distinct shape, and totals are kept only for the ranks some shard sits on: the cost
follows the plan's shards, never the world size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from planner_service.costs.calibrated import fixed_perf
from planner_service.costs.estimate import (
    OptionContext,
    Storage,
    TableLoad,
    estimate_perf,
    estimate_storage,
    perf_rows,
    total_components,
)
from planner_service.costs.options import DeviceClasses
from planner_service.plan.types import (
    DEFAULT_CACHE_LOAD_FACTOR,
    PERF_COMPONENTS,
    PERF_FIELDS,
    ComputeKernel,
    CostModel,
    PlanRequest,
    Shard,
    Table,
    TableShardingModel,
)


@dataclass
class RankLoad:
    """One rank's bytes per tier and milliseconds per perf field (``PERF_FIELDS``);
    ``io_bytes``: the input ids and output embeddings its shards buffer per iteration
    (part of the tiers' bytes), for reports."""

    hbm_bytes: int = 0
    ddr_bytes: int = 0
    io_bytes: tuple[int, int] = (0, 0)
    perf: list[float] = field(default_factory=lambda: [0.0] * len(PERF_FIELDS))


@dataclass(frozen=True)
class RankUsage:
    """The loads of the ranks that hold a shard; every other rank holds nothing."""

    loads: dict[int, RankLoad]
    cost_model: CostModel
    # Per perf field, what every rank pays whatever it holds (the calibrated model's fixed
    # costs of the sharding types the plan uses; zeros under the other models).
    fixed: tuple[float, ...] = (0.0,) * len(PERF_FIELDS)

    def of(self, rank: int) -> RankLoad:
        """The rank's load, its share of the fixed costs included."""
        load = self.loads.get(rank) or RankLoad()
        if not any(self.fixed):
            return load
        perf = [a + b for a, b in zip(load.perf, self.fixed, strict=True)]
        return RankLoad(load.hbm_bytes, load.ddr_bytes, load.io_bytes, perf)

    def io_bytes(self, world_size: int) -> list[tuple[int, int]]:
        """(input id bytes, output embedding bytes) per rank, as the solver reports them
        beside a plan (``SolveOutcome.rank_io_bytes``)."""
        return [self.of(rank).io_bytes for rank in range(world_size)]

    @property
    def objective(self) -> float:
        """The most loaded rank's perf total (ms)."""
        return max((load.perf[-1] for load in self.loads.values()), default=0.0) + self.fixed[-1]

    @property
    def critical_path(self) -> float:
        """Sum over the perf components in the total of their max over ranks."""
        counted = total_components(self.cost_model)
        return sum(
            max((load.perf[i] for load in self.loads.values()), default=0.0) + self.fixed[i]
            for i, name in enumerate(PERF_COMPONENTS)
            if name in counted
        )


def rank_usage(request: PlanRequest, tables: Mapping[str, TableShardingModel]) -> RankUsage:
    """What ``tables`` (a plan's) put on each rank; shards on ranks outside the world and
    tables the request does not have are left out (the validator reports those)."""
    pricer = _Pricer(request)
    loads: dict[int, RankLoad] = {}
    for table in request.tables:
        sharding = tables.get(table.name)
        if sharding is None:
            continue
        for shard in sharding.shards:
            if shard.rank >= request.topology.world_size:
                continue
            storage, perf = pricer.price(table, sharding, shard)
            load = loads.setdefault(shard.rank, RankLoad())
            load.hbm_bytes += storage.hbm_bytes
            load.ddr_bytes += storage.ddr_bytes
            inputs, outputs = load.io_bytes
            load.io_bytes = (inputs + storage.input_bytes, outputs + storage.output_bytes)
            load.perf = [a + b for a, b in zip(load.perf, perf, strict=True)]
    used = {tables[t.name].sharding_type for t in request.tables if t.name in tables}
    fixed = fixed_perf(request, used)
    return RankUsage(
        loads, request.options.cost_model, tuple(getattr(fixed, f) for f in PERF_FIELDS)
    )


def table_storage(
    request: PlanRequest, tables: Mapping[str, TableShardingModel]
) -> dict[str, Storage]:
    """Every table's bytes per tier under ``tables`` (a plan's), summed over its shards
    on ranks inside the world; tables the request does not have are left out."""
    pricer = _Pricer(request)
    totals: dict[str, Storage] = {}
    for table in request.tables:
        sharding = tables.get(table.name)
        if sharding is None:
            continue
        hbm = ddr = 0
        for shard in sharding.shards:
            if shard.rank < request.topology.world_size:
                storage, _ = pricer.price(table, sharding, shard)
                hbm, ddr = hbm + storage.hbm_bytes, ddr + storage.ddr_bytes
        totals[table.name] = Storage(hbm_bytes=hbm, ddr_bytes=ddr)
    return totals


class _Pricer:
    """Shard estimates, each computed once per table option and distinct shape."""

    def __init__(self, request: PlanRequest) -> None:
        self.request = request
        self.classes = DeviceClasses.of(request.topology)
        self.contexts: dict[tuple[Any, ...], OptionContext] = {}
        self.storages: dict[tuple[Any, ...], Storage] = {}
        self.perf: dict[tuple[Any, ...], tuple[float, ...]] = {}

    def price(
        self, table: Table, sharding: TableShardingModel, shard: Shard
    ) -> tuple[Storage, tuple[float, ...]]:
        ctx = self._context(table, sharding)
        rows, cols = shard.sizes
        storage_key = (id(ctx), rows, cols)
        storage = self.storages.get(storage_key)
        if storage is None:
            storage = self.storages[storage_key] = estimate_storage(ctx, rows, cols)
        device_class = self.classes.class_of(shard.rank)
        perf_key = (id(ctx), perf_rows(ctx, rows), cols, device_class)
        perf = self.perf.get(perf_key)
        if perf is None:
            estimate = estimate_perf(ctx, rows, cols, self.classes.specs[device_class])
            perf = self.perf[perf_key] = tuple(getattr(estimate, f) for f in PERF_FIELDS)
        return storage, perf

    def _context(self, table: Table, sharding: TableShardingModel) -> OptionContext:
        caching = sharding.compute_kernel is ComputeKernel.FUSED_UVM_CACHING
        clf = (sharding.cache_load_factor or DEFAULT_CACHE_LOAD_FACTOR) if caching else None
        key = (table.name, sharding.sharding_type, sharding.compute_kernel, clf)
        ctx = self.contexts.get(key)
        if ctx is None:
            ctx = self.contexts[key] = OptionContext(
                table=table,
                load=TableLoad.of(table, self.request.batch_size),
                topology=self.request.topology,
                sharding_type=sharding.sharding_type,
                compute_kernel=sharding.compute_kernel,
                cache_load_factor=clf,
                cost_model=self.request.options.cost_model,
                device_profile=self.request.options.device_profile,
            )
        return ctx
