"""The options vocabulary: one way to shard a table (``ShardingOption``), its shards'
estimates, and the device classes perf is priced on.

``costs.enumerate`` builds these; the solver, the validator's usage recomputation and the
reports read them.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from enum import Enum
from itertools import repeat
from typing import TYPE_CHECKING

from planner_service.costs.estimate import Storage
from planner_service.plan.types import (
    COLUMN_SHARDING_TYPES,
    ROW_SHARDING_TYPES,
    ComputeKernel,
    DeviceSpec,
    Perf,
    ShardingType,
    Table,
    Topology,
)

if TYPE_CHECKING:
    import numpy as np


class Placement(Enum):
    """Who decides where an option's shards go."""

    PER_SHARD = "per_shard"  # table_wise, column_wise: each shard picks a rank
    PER_HOST = "per_host"  # table_row_wise: shard i on local rank i of a chosen host;
    # table_column_wise: every shard on some rank of a chosen host
    FIXED = "fixed"  # row_wise, data_parallel: shard i on rank i


PLACEMENT = {
    ShardingType.TABLE_WISE: Placement.PER_SHARD,
    ShardingType.COLUMN_WISE: Placement.PER_SHARD,
    ShardingType.TABLE_ROW_WISE: Placement.PER_HOST,
    ShardingType.TABLE_COLUMN_WISE: Placement.PER_HOST,
    ShardingType.ROW_WISE: Placement.FIXED,
    ShardingType.DATA_PARALLEL: Placement.FIXED,
}


@dataclass(frozen=True, slots=True)
class ShardEstimate:
    """The cost of one shard: its ``sizes`` [rows, cols], time and bytes.

    ``perf[c]`` is its time on a rank of device class ``c`` (see ``DeviceClasses``). Shards
    of equal size in one option share one estimate object.
    """

    sizes: tuple[int, int]
    perf: tuple[Perf, ...]
    storage: Storage


@dataclass(frozen=True, slots=True)
class ShardingOption:
    """One way to shard a table. ``shards`` are in shard order: by row for row-wise
    types, by column for column-wise types, by rank for data-parallel replicas.

    ``runs`` is the same sequence as (estimate, count) runs of consecutive equal shards: an
    option has at most three distinct shards (row-wise: full blocks, the remainder, empty
    blocks), so work that depends on shards' contents, not their positions, is done per
    run (a row-wise option on 4,096 ranks is 4,096 shards but at most 3 runs)."""

    sharding_type: ShardingType
    compute_kernel: ComputeKernel
    cache_load_factor: float | None
    runs: tuple[tuple[ShardEstimate, int], ...]
    _shards: tuple[ShardEstimate, ...] | None = field(
        init=False, default=None, repr=False, compare=False
    )

    @property
    def shards(self) -> tuple[ShardEstimate, ...]:
        """Every shard's estimate, built when first asked: stored on every option (a tuple
        of 1,024 references per row-wise option on 1,024 ranks), the garbage collector's
        full passes over them took half of enumerating 5,384 distinct shapes (issue 37)."""
        if self._shards is None:
            shards = tuple(itertools.chain.from_iterable(repeat(e, c) for e, c in self.runs))
            object.__setattr__(self, "_shards", shards)
            return shards
        return self._shards

    @property
    def num_shards(self) -> int:
        return sum(count for _, count in self.runs)

    @property
    def placement(self) -> Placement:
        return PLACEMENT[self.sharding_type]

    def offsets(self) -> list[tuple[int, int]]:
        """Each shard's [row, col] offset, derived from the sizes before it."""
        if self.sharding_type in ROW_SHARDING_TYPES:
            return _running_offsets([s.sizes[0] for s in self.shards], axis=0)
        if self.sharding_type in COLUMN_SHARDING_TYPES:
            return _running_offsets([s.sizes[1] for s in self.shards], axis=1)
        return [(0, 0)] * len(self.shards)


def _running_offsets(lengths: list[int], axis: int) -> list[tuple[int, int]]:
    offsets, position = [], 0
    for length in lengths:
        offsets.append((position, 0) if axis == 0 else (0, position))
        position += length
    return offsets


@dataclass(frozen=True, slots=True)
class TableOptions:
    table: Table
    options: tuple[ShardingOption, ...]


@dataclass(frozen=True)
class DeviceClasses:
    """Ranks grouped by the bandwidths perf depends on; class 0 has the topology's defaults.

    Only overridden ranks are listed (``overridden``: rank -> class), so building the
    classes and asking for one rank's costs the overrides, not the world size; the
    per-rank array is built once, for the solver, when first asked for."""

    specs: tuple[DeviceSpec, ...]
    overridden: dict[int, int]
    world_size: int

    @classmethod
    def of(cls, topology: Topology) -> DeviceClasses:
        default = DeviceSpec(
            rank=0,
            hbm_bytes=topology.hbm_bytes or 0,
            ddr_bytes=topology.ddr_bytes,
            hbm_bw_bytes_per_s=topology.hbm_bw_bytes_per_s,
            ddr_bw_bytes_per_s=topology.ddr_bw_bytes_per_s,
        )
        specs, index = [default], {_bandwidth_key(default): 0}
        overridden = {}
        for override in topology.rank_overrides:
            key = (
                override.hbm_bw_bytes_per_s or default.hbm_bw_bytes_per_s,
                override.ddr_bw_bytes_per_s or default.ddr_bw_bytes_per_s,
            )
            if key not in index:
                index[key] = len(specs)
                specs.append(default.model_copy(update=override.model_dump(exclude_none=True)))
            overridden[override.rank] = index[key]
        return cls(tuple(specs), overridden, topology.world_size)

    def class_of(self, rank: int) -> int:
        return self.overridden.get(rank, 0)

    @functools.cached_property
    def class_of_rank(self) -> np.ndarray:
        """Every rank's class, in rank order. numpy is imported here rather than with the
        module, which the validator loads: it is 130 ms of ``shardplan validate``'s start
        (docs/benchmarks.md, "Start-up")."""
        import numpy as np

        classes = np.zeros(self.world_size, dtype=np.int64)
        classes[list(self.overridden)] = list(self.overridden.values())
        return classes


def _bandwidth_key(device: DeviceSpec) -> tuple[float, float]:
    return device.hbm_bw_bytes_per_s, device.ddr_bw_bytes_per_s
