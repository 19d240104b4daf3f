"""The plan vocabulary: one module, imported by the service, the solver, the client and the runtime.

Names follow TorchRec (``world_size``, ``local_world_size``, ``sharding_type``,
``compute_kernel``, ``ParameterConstraints``, ``ParameterSharding``...) because our users
know them. Enums are used inside the code; their string values appear only at the JSON
edge. Every model is a frozen value with ``extra="forbid"``: an unknown field is an error,
never silently ignored. Scalars are strict (``"512"`` is not a batch size).

This module must not import torch.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    GetJsonSchemaHandler,
    SerializerFunctionWrapHandler,
    Strict,
    Tag,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

from planner_service.plan.canonical import canonical_bytes, plan_id_of, sha256_hex
from planner_service.plan.errors import RUNS_TAG, SHARD_LIST_TAG
from planner_service.plan.json_data import JsonObject
from planner_service.plan.runs import (
    expand_rank_runs,
    rank_bounds,
    rank_count,
    rank_positions,
    rank_runs_problem,
    width_runs_problem,
)
from planner_service.plan.schema_version import (
    COMPACT_SCHEMA,
    SCHEMA_VERSION,
    SCHEMA_VERSION_PATTERN,
    schema_tuple,
    schema_version_problem,
)
from planner_service.plan.text import FreeText, IdentifierText
from planner_service.plan.units import GiB, parse_byte_size

# TorchRec's public defaults (torchrec/distributed/planner/constants.py), converted to bytes/s.
DEFAULT_HBM_BYTES = 32 * GiB
DEFAULT_DDR_BYTES = 128 * GiB
DEFAULT_HBM_BW_BYTES_PER_S = float(897 * GiB)
DEFAULT_DDR_BW_BYTES_PER_S = float(51 * GiB)
DEFAULT_HBM_TO_DDR_BW_BYTES_PER_S = float(32 * GiB)
DEFAULT_INTRA_HOST_BW_BYTES_PER_S = float(600 * GiB)
DEFAULT_INTER_HOST_BW_BYTES_PER_S = float(12.5 * GiB)
DEFAULT_BATCH_SIZE = 512
DEFAULT_MIN_PARTITION = 128
DEFAULT_CACHE_LOAD_FACTOR = 0.2
DEFAULT_HBM_HEADROOM_FRACTION = 0.15
DEFAULT_TIME_LIMIT_S = 10.0
DEFAULT_GAP_LIMIT = 0.02

# The largest numbers the planner accepts (docs/plan-format.md, "Limits"). Everything it
# loops over (ranks, column widths, features) stays small enough to finish, and every byte
# count and time it derives stays within int64 and finite floats, so a hostile number is a
# 422 naming its field, never an overflow in the solver or a solve that never ends.
MAX_WORLD_SIZE = 131_072  # services cap lower (SHARDPLAN_MAX_WORLD_SIZE, default 65,536)
MAX_EMBEDDING_DIM = 65_536
MAX_NUM_EMBEDDINGS = 2**40
MAX_MEMORY_BYTES = 2**53  # 8 PiB per rank; every integer up to here is exact as a float
MIN_BANDWIDTH_BYTES_PER_S = 1e6
MAX_BANDWIDTH_BYTES_PER_S = 1e16
MAX_POOLING_FACTOR = 1e6
MAX_BATCH_SIZE = 2**24
MAX_TIME_LIMIT_S = 86_400.0  # services cap lower (SHARDPLAN_MAX_TIME_LIMIT_S, default 60)
MAX_SEED = 2**31 - 1  # CP-SAT's random_seed is an int32
MAX_MIN_PARTITION = MAX_EMBEDDING_DIM
MAX_FEATURES_PER_TABLE = 4_096
# Arrays and objects in a request or plan document nest at most this deep (they need 6).
MAX_JSON_DEPTH = 64
# A plan's per-rank byte counts: int64, as every consumer of a plan (numpy, torch, other
# languages' JSON readers) can hold them; valid plans stay within MAX_MEMORY_BYTES.
MAX_PLAN_BYTES = 2**63 - 1
# options.move_cost_ms_per_gib: at most 1,000 s of objective per GiB moved.
MAX_MOVE_COST_MS_PER_GIB = 1e6

Bool = Annotated[bool, Strict()]
# Names and versions: no control characters, bidi overrides or surrounding spaces (plan.text).
Name = Annotated[str, Strict(), Field(min_length=1, max_length=256), IdentifierText]
# Every number is strict: a JSON number, never a string ("5") or a boolean.
StrictFloat = Annotated[float, Strict()]
NonNegativeFloat = Annotated[StrictFloat, Field(ge=0.0, allow_inf_nan=False)]
PositiveFloat = Annotated[StrictFloat, Field(gt=0.0, allow_inf_nan=False)]
Fraction = Annotated[StrictFloat, Field(ge=0.0, lt=1.0, allow_inf_nan=False)]
LoadFactor = Annotated[StrictFloat, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
Sha256Hex = Annotated[str, Strict(), Field(pattern=r"^[0-9a-f]{64}$")]
WorldSize = Annotated[int, Strict(), Field(ge=1, le=MAX_WORLD_SIZE)]
Rank = Annotated[int, Strict(), Field(ge=0, lt=MAX_WORLD_SIZE)]
MemoryBytes = Annotated[int, Strict(), Field(ge=0, le=MAX_MEMORY_BYTES)]
PlanBytes = Annotated[int, Strict(), Field(ge=0, le=MAX_PLAN_BYTES)]


def _size_to_bytes(value: object) -> object:
    """A size string (``"80GiB"``) as its integer, checked against the bound here so that
    the error shows the value as written; anything else goes on to the strict int check."""
    if not isinstance(value, str):
        return value
    try:
        size = parse_byte_size(value)
    except ValueError as error:
        raise PydanticCustomError("byte_size", "{reason}", {"reason": str(error)}) from None
    if size > MAX_MEMORY_BYTES:
        raise PydanticCustomError(
            "less_than_equal",
            f"is {size:,} bytes, more than the most accepted, {MAX_MEMORY_BYTES} bytes "
            '(2^53, "8192TiB")',
        )
    return size


# A byte field of a request: an integer, or a size string (plan.units) read as its integer.
ByteSize = Annotated[
    MemoryBytes,
    BeforeValidator(_size_to_bytes),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0, "maximum": MAX_MEMORY_BYTES},
                {"type": "string", "examples": ["80GiB", "512 MB"]},
            ]
        }
    ),
]
Bandwidth = Annotated[
    StrictFloat,
    Field(ge=MIN_BANDWIDTH_BYTES_PER_S, le=MAX_BANDWIDTH_BYTES_PER_S, allow_inf_nan=False),
]
NumRows = Annotated[int, Strict(), Field(ge=0, le=MAX_NUM_EMBEDDINGS)]
NumColumns = Annotated[int, Strict(), Field(ge=0, le=MAX_EMBEDDING_DIM)]
BatchSize = Annotated[int, Strict(), Field(ge=1, le=MAX_BATCH_SIZE)]
PoolingFactor = Annotated[StrictFloat, Field(ge=0.0, le=MAX_POOLING_FACTOR, allow_inf_nan=False)]


class ShardingType(StrEnum):
    TABLE_WISE = "table_wise"
    ROW_WISE = "row_wise"
    COLUMN_WISE = "column_wise"
    TABLE_ROW_WISE = "table_row_wise"
    TABLE_COLUMN_WISE = "table_column_wise"
    DATA_PARALLEL = "data_parallel"


class ComputeKernel(StrEnum):
    DENSE = "dense"
    FUSED = "fused"
    FUSED_UVM = "fused_uvm"
    FUSED_UVM_CACHING = "fused_uvm_caching"


class ComputeDevice(StrEnum):
    CUDA = "cuda"
    CPU = "cpu"


class PoolingType(StrEnum):
    SUM = "sum"
    MEAN = "mean"
    NONE = "none"


class DataType(StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"

    @property
    def size_bytes(self) -> int:
        return _DATA_TYPE_SIZE_BYTES[self]


_DATA_TYPE_SIZE_BYTES = {DataType.FP32: 4, DataType.FP16: 2, DataType.BF16: 2, DataType.INT8: 1}


class OptimizerType(StrEnum):
    SGD = "sgd"
    ROWWISE_ADAGRAD = "rowwise_adagrad"
    ADAGRAD = "adagrad"
    ADAM = "adam"

    def state_bytes(self, rows: int, cols: int) -> int:
        """The fp32 state FBGEMM's fused optimizer keeps for ``rows`` x ``cols`` of a
        table: none (sgd), one per row (rowwise_adagrad), one per element (adagrad), two
        per element (adam)."""
        if self is OptimizerType.SGD:
            return 0
        if self is OptimizerType.ROWWISE_ADAGRAD:
            return rows * OPTIMIZER_STATE_BYTES
        if self is OptimizerType.ADAGRAD:
            return rows * cols * OPTIMIZER_STATE_BYTES
        return 2 * rows * cols * OPTIMIZER_STATE_BYTES  # adam: two moments


# Optimizer state kept by FBGEMM's fused optimizers, in fp32 elements.
OPTIMIZER_STATE_BYTES = 4


class Objective(StrEnum):
    MAX_RANK_COST = "max_rank_cost"


class CostModel(StrEnum):
    """Which estimator prices shards: ours (the default), TorchRec 1.8's reproduced, or ours
    with the coefficients a device profile measured (``calibrated``)."""

    SHARDPLAN = "shardplan"
    TORCHREC_1_8 = "torchrec-1.8"
    CALIBRATED = "calibrated"  # the coefficients of options.device_profile


class SolverStatus(StrEnum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    NO_SOLUTION_IN_TIME = "no_solution_in_time"


class BoundSource(StrEnum):
    """Which lower bound proved a plan's gap (``solver.lower_bound_source``)."""

    WORK = "work/world_size"  # the least total work, spread evenly over the ranks
    LARGEST_SHARD = "largest_shard"  # the table whose cheapest option has the dearest shard
    LP_RELAXATION = "lp_relaxation"  # options chosen fractionally (GLOP)
    OPTION_MIX = "option_mix"  # whole options, load spread fractionally (CP-SAT)
    PACKING = "packing"  # whole shards packed into ranks, constraints dropped (CP-SAT)
    CONFIGURATION = "configuration"  # what one rank holds in time and memory (LP, columns)
    CP_SAT = "cp-sat"  # the CP-SAT search on the complete model


class StopReason(StrEnum):
    """What ended the search. The first three are reproducible (the same request gives the
    same plan in every process); ``time_limit`` means the wall clock cut a stage short, so
    another run, on a less loaded machine say, may get further."""

    OPTIMAL = "optimal"  # proven optimal
    GAP_LIMIT = "gap_limit"  # proven within options.gap_limit
    WORK_BUDGET = "work_budget"  # the deterministic search budget was spent
    TIME_LIMIT = "time_limit"  # options.time_limit_s of wall clock ran out


# Sharding types whose shards all live on the ranks of a single host.
HOST_LOCAL_SHARDING_TYPES = frozenset({ShardingType.TABLE_ROW_WISE, ShardingType.TABLE_COLUMN_WISE})
# Sharding types that split columns, whose widths must be multiples of 4 (FBGEMM's alignment).
COLUMN_SHARDING_TYPES = frozenset({ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE})
ROW_SHARDING_TYPES = frozenset({ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE})
UVM_KERNELS = frozenset({ComputeKernel.FUSED_UVM, ComputeKernel.FUSED_UVM_CACHING})


class _Value(BaseModel):
    """Base for every vocabulary model: immutable, no unknown fields, no NaN/inf."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def _without_absent(data: JsonObject, names: tuple[str, ...]) -> JsonObject:
    """A model's JSON data without the optional fields ``names`` where they are unset: a
    field added later stays out of the documents that do not use it, so their bytes (and
    content addresses) are what they were before it existed."""
    for name in names:
        if data.get(name) is None:
            data.pop(name, None)
    return data


def _error(
    kind: str, message: str, *, at: str, value: object, **ctx: object
) -> PydanticCustomError:
    """A validation error whose message is ``message`` formatted with ``ctx`` (str.format).

    ``at`` is the path of the offending field below the model that raises (a model
    validator's error is otherwise placed at the model itself) and ``value`` its value;
    ``errors.problems_from_validation_error`` reads both, so the error names the field."""
    return PydanticCustomError(
        kind, message.format(**ctx), {"field_path": at, "field_value": value}
    )


# --------------------------------------------------------------------------- topology


class RankOverride(_Value):
    """Per-rank capacities or bandwidths for heterogeneous clusters; unset fields inherit."""

    rank: Rank
    hbm_bytes: ByteSize | None = None
    ddr_bytes: ByteSize | None = None
    hbm_bw_bytes_per_s: Bandwidth | None = None
    ddr_bw_bytes_per_s: Bandwidth | None = None


class DeviceSpec(_Value):
    """The resolved capacities and bandwidths of one rank (topology defaults + override)."""

    rank: Rank
    hbm_bytes: MemoryBytes
    ddr_bytes: MemoryBytes
    hbm_bw_bytes_per_s: Bandwidth
    ddr_bw_bytes_per_s: Bandwidth


class Topology(_Value):
    """The cluster a plan is made for. Capacities are per rank.

    ``local_world_size`` (ranks per host) defaults to ``world_size`` (one host), as in
    TorchRec. ``hbm_bytes`` defaults to 32 GiB on cuda and 0 on cpu, where everything
    lives in DDR.
    """

    world_size: WorldSize
    local_world_size: WorldSize | None = None
    compute_device: ComputeDevice = ComputeDevice.CUDA
    hbm_bytes: ByteSize | None = None
    ddr_bytes: ByteSize = DEFAULT_DDR_BYTES
    hbm_bw_bytes_per_s: Bandwidth = DEFAULT_HBM_BW_BYTES_PER_S
    ddr_bw_bytes_per_s: Bandwidth = DEFAULT_DDR_BW_BYTES_PER_S
    hbm_to_ddr_bw_bytes_per_s: Bandwidth = DEFAULT_HBM_TO_DDR_BW_BYTES_PER_S
    intra_host_bw_bytes_per_s: Bandwidth = DEFAULT_INTRA_HOST_BW_BYTES_PER_S
    inter_host_bw_bytes_per_s: Bandwidth = DEFAULT_INTER_HOST_BW_BYTES_PER_S
    rank_overrides: list[RankOverride] = Field(default_factory=list, max_length=MAX_WORLD_SIZE)

    @model_validator(mode="after")
    def _fill_and_check(self) -> Self:
        if self.local_world_size is None:
            object.__setattr__(self, "local_world_size", self.world_size)
        if self.hbm_bytes is None:
            cuda = self.compute_device is ComputeDevice.CUDA
            object.__setattr__(self, "hbm_bytes", DEFAULT_HBM_BYTES if cuda else 0)
        if self.num_local_ranks > self.world_size:
            raise _error(
                "local_world_size",
                "local_world_size {local_world_size} is more than world_size {world_size}; "
                "ranks per host are at most all the ranks",
                local_world_size=self.local_world_size,
                world_size=self.world_size,
                at="local_world_size",
                value=self.local_world_size,
            )
        if self.world_size % self.num_local_ranks != 0:
            raise _error(
                "local_world_size",
                "local_world_size {local_world_size} does not divide world_size {world_size}; "
                "use a divisor of world_size (ranks per host)",
                local_world_size=self.local_world_size,
                world_size=self.world_size,
                at="local_world_size",
                value=self.local_world_size,
            )
        seen: set[int] = set()
        for i, override in enumerate(self.rank_overrides):
            if override.rank >= self.world_size:
                raise _error(
                    "rank_range",
                    "rank_overrides[{i}].rank {rank} is out of range; ranks are 0..{last}",
                    i=i,
                    rank=override.rank,
                    last=self.world_size - 1,
                    at=f"rank_overrides[{i}].rank",
                    value=override.rank,
                )
            if override.rank in seen:
                raise _error(
                    "duplicate_rank",
                    "rank_overrides[{i}].rank {rank} appears twice; give one override per rank",
                    i=i,
                    rank=override.rank,
                    at=f"rank_overrides[{i}].rank",
                    value=override.rank,
                )
            seen.add(override.rank)
        return self

    @property
    def num_local_ranks(self) -> int:
        """``local_world_size`` after defaulting (typed as int for callers)."""
        return self.local_world_size or self.world_size

    @property
    def num_hosts(self) -> int:
        return self.world_size // self.num_local_ranks

    def host_of(self, rank: int) -> int:
        return rank // self.num_local_ranks

    def host_ranks(self, host: int) -> range:
        return range(host * self.num_local_ranks, (host + 1) * self.num_local_ranks)

    def device(self, rank: int) -> DeviceSpec:
        """The resolved spec of ``rank``: topology defaults with its override applied."""
        base = {
            "rank": rank,
            "hbm_bytes": self.hbm_bytes or 0,
            "ddr_bytes": self.ddr_bytes,
            "hbm_bw_bytes_per_s": self.hbm_bw_bytes_per_s,
            "ddr_bw_bytes_per_s": self.ddr_bw_bytes_per_s,
        }
        override = self._overrides_by_rank().get(rank)
        if override is not None:
            base.update(override.model_dump(exclude_none=True, exclude={"rank"}))
        return DeviceSpec(**base)

    def devices(self) -> list[DeviceSpec]:
        return [self.device(rank) for rank in range(self.world_size)]

    def _overrides_by_rank(self) -> dict[int, RankOverride]:
        return {override.rank: override for override in self.rank_overrides}


# --------------------------------------------------------------------------- tables


class Table(_Value):
    """One embedding table and the features that look it up (TorchRec's EmbeddingBagConfig).

    ``pooling_factors`` are the mean number of ids per sample, one per feature (default 1.0);
    ``batch_sizes`` (one per feature) describe variable-batch features and default to the
    request's ``batch_size``. ``feature_names`` defaults to ``[name]``.
    """

    name: Name
    num_embeddings: Annotated[NumRows, Field(ge=1)]
    embedding_dim: Annotated[NumColumns, Field(ge=1)]
    feature_names: list[Name] = Field(default_factory=list, max_length=MAX_FEATURES_PER_TABLE)
    pooling: PoolingType = PoolingType.SUM
    pooling_factors: list[PoolingFactor] | None = Field(None, max_length=MAX_FEATURES_PER_TABLE)
    batch_sizes: list[BatchSize] | None = Field(None, max_length=MAX_FEATURES_PER_TABLE)
    data_type: DataType = DataType.FP32
    is_weighted: Bool = False
    optimizer: OptimizerType = OptimizerType.SGD

    @model_validator(mode="after")
    def _fill_and_check(self) -> Self:
        if not self.feature_names:
            object.__setattr__(self, "feature_names", [self.name])
        n = len(self.feature_names)
        counts = Counter(self.feature_names)
        duplicates = sorted(feature for feature, count in counts.items() if count > 1)
        if duplicates:
            raise _error(
                "duplicate_feature",
                "feature_names of table {table!r} lists {dups} more than once",
                table=self.name,
                dups=", ".join(map(repr, duplicates)),
                at="feature_names",
                value=duplicates[0],
            )
        if self.is_weighted and self.pooling is PoolingType.NONE:
            raise _error(
                "weighted_sequence",
                "table {table!r} has is_weighted true with pooling none; per-id weights "
                "scale ids inside a pooled bag, so use pooling sum or mean, or is_weighted false",
                table=self.name,
                at="is_weighted",
                value=True,
            )
        if self.pooling_factors is None:
            object.__setattr__(self, "pooling_factors", [1.0] * n)
        for field in ("pooling_factors", "batch_sizes"):
            values = getattr(self, field)
            if values is not None and len(values) != n:
                raise _error(
                    "length_mismatch",
                    "{field} of table {table!r} has {got} entries but the table has {n} "
                    "feature_names; give one per feature",
                    field=field,
                    table=self.name,
                    got=len(values),
                    n=n,
                    at=field,
                    value=values,
                )
        return self

    @property
    def num_features(self) -> int:
        return len(self.feature_names)


# --------------------------------------------------------------------------- constraints


class ParameterConstraints(_Value):
    """Per-table constraints (TorchRec's ParameterConstraints). Unset means unconstrained."""

    sharding_types: list[ShardingType] | None = Field(default=None, min_length=1)
    compute_kernels: list[ComputeKernel] | None = Field(default=None, min_length=1)
    ranks: list[Rank] | None = Field(default=None, min_length=1, max_length=MAX_WORLD_SIZE)
    min_partition: Annotated[int, Strict(), Field(ge=1, le=MAX_MIN_PARTITION)] | None = None
    cache_load_factor: LoadFactor | None = None


def _each_table_once(group: list[str], info: ValidationInfo) -> list[str]:
    """A table twice in a colocate or separate group is a mistake (and in a separate group,
    one no plan can honour: a table always shares its ranks with itself)."""
    seen: set[str] = set()
    for name in group:  # a set, not group[:i]: a group may list 100,000 tables
        if name in seen:
            raise _error(
                "duplicate_table",
                "names table {name!r} twice; list each table of a {field} group once",
                name=name,
                field=info.field_name,
                at="",
                value=name,
            )
        seen.add(name)
    return group


TableGroup = Annotated[list[Name], Field(min_length=2), AfterValidator(_each_table_once)]


class Constraints(_Value):
    """Per-table constraints plus model-wide ones.

    ``colocate``: every table in a group uses the same set of ranks. ``separate``: no two
    tables of a group share a rank. ``hbm_headroom_fraction`` of each rank's HBM and
    ``dense_bytes_per_rank`` (dense parameters, activations) are reserved, not planned.
    """

    tables: dict[Name, ParameterConstraints] = Field(default_factory=dict)
    hbm_headroom_fraction: Fraction = DEFAULT_HBM_HEADROOM_FRACTION
    dense_bytes_per_rank: ByteSize = 0
    colocate: list[TableGroup] = Field(default_factory=list)
    separate: list[TableGroup] = Field(default_factory=list)

    def for_table(self, name: str) -> ParameterConstraints:
        return self.tables.get(name) or _NO_CONSTRAINTS


_NO_CONSTRAINTS = ParameterConstraints()


# --------------------------------------------------------------------------- device profiles
#
# A device profile (docs/cost-model.md, "Calibrating for your hardware") holds what
# ``shardplan calibrate`` measured on one kind of machine: the cost of FBGEMM's kernels, of
# the collectives the runtime issues and of the runtime's own work, as coefficients of the
# ``calibrated`` cost model (``costs/calibrated.py``), each fit with its quality. Every
# number has a bound: a profile can make the model slow or fast, never NaN, negative or
# large enough to overflow the solver's arithmetic.

# 1.1: the weighted backward's own terms (weighted_bwd_*); 1.2: the runtime's placement of
# sequence rows (``RuntimeCoefficients.placement_ns_per_byte``)
PROFILE_SCHEMA_VERSION = "1.2"
PROFILE_SCHEMA_VERSIONS = ("1.0", "1.1", PROFILE_SCHEMA_VERSION)
# The terms each schema version added (``kernels``: in every kernel entry; ``runtime``: in
# the runtime coefficients). A profile of an older version may not set them, and is written,
# so addressed (``profile_id_of``), without them: as the shardplan that measured it wrote it.
PROFILE_TERMS_SINCE: dict[str, dict[str, tuple[str, ...]]] = {
    "1.1": {
        "kernels": (
            "weighted_bwd_us_per_id",
            "weighted_bwd_ns_per_byte",
            "weighted_bwd_ns_per_miss_byte",
        )
    },
    "1.2": {"runtime": ("placement_ns_per_byte", "fit_placement")},
}


def _later_terms(version: str) -> list[tuple[str, str, str]]:
    """(version, part, term) of the terms that versions after ``version`` added."""
    mine = PROFILE_SCHEMA_VERSIONS.index(version)
    return [
        (later, part, term)
        for later, parts in PROFILE_TERMS_SINCE.items()
        if PROFILE_SCHEMA_VERSIONS.index(later) > mine
        for part, terms in parts.items()
        for term in terms
    ]


MAX_US_PER_ID = 1e3  # a millisecond per id looked up: slower than any kernel measured
MAX_NS_PER_BYTE = 1e3  # a microsecond per byte (1 MB/s)
MAX_FIXED_MS = 1e4  # ten seconds of fixed cost per call, collective or step
MAX_PROFILE_ENTRIES = 256
MAX_FIT_SAMPLES = 10**7
MAX_PROFILE_RELATIVE_ERROR = 1e6
MAX_WEIGHTED_FACTOR = 100.0
MAX_RUNTIME_SCALE = 100.0

# A coefficient of the calibrated model: finite, non-negative, bounded.
UsPerId = Annotated[StrictFloat, Field(ge=0.0, le=MAX_US_PER_ID, allow_inf_nan=False)]
NsPerByte = Annotated[StrictFloat, Field(ge=0.0, le=MAX_NS_PER_BYTE, allow_inf_nan=False)]
FixedMs = Annotated[StrictFloat, Field(ge=0.0, le=MAX_FIXED_MS, allow_inf_nan=False)]
RelativeError = Annotated[
    StrictFloat, Field(ge=0.0, le=MAX_PROFILE_RELATIVE_ERROR, allow_inf_nan=False)
]
Text = Annotated[str, Strict(), Field(max_length=1024), FreeText]
WeightedFactor = Annotated[StrictFloat, Field(ge=1.0, le=MAX_WEIGHTED_FACTOR, allow_inf_nan=False)]
RuntimeScale = Annotated[StrictFloat, Field(ge=0.0, le=MAX_RUNTIME_SCALE, allow_inf_nan=False)]


class Collective(StrEnum):
    """The collectives the runtime issues (``runtime.comm``)."""

    ALL_TO_ALL = "all_to_all"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    ALL_REDUCE = "all_reduce"


class FitQuality(_Value):
    """How well a fitted group of coefficients reproduces its measurements: ``samples``
    measurements, ``r2`` the coefficient of determination, the root-mean-square residual,
    and the median and largest relative residual |predicted − measured| / measured."""

    samples: Annotated[int, Strict(), Field(ge=1, le=MAX_FIT_SAMPLES)]
    r2: Annotated[StrictFloat, Field(ge=-MAX_PROFILE_RELATIVE_ERROR, le=1.0, allow_inf_nan=False)]
    rms_residual_ms: FixedMs
    median_relative_error: RelativeError
    max_relative_error: RelativeError


class KernelCoefficients(_Value):
    """One FBGEMM kernel's forward and backward (with the fused optimizer) per step, for
    ``ids`` ids looked up, ``bags`` bags produced, ``row bytes`` = columns × element bytes:

    - ``fwd = call_fwd_ms + fwd_us_per_id · ids + fwd_ns_per_byte · ids · row bytes +
      fwd_ns_per_out_byte · bags · columns · 4``
    - ``bwd = call_bwd_ms + bwd_us_per_id · ids + bwd_ns_per_byte · ids · row bytes +
      bwd_ns_per_row_byte · rows touched · (row bytes + optimizer state bytes per row)``

    Reads from a shard larger than the processor keeps close cost more:
    ``miss = 1 − resident_bytes / shard bytes`` (0 for a shard that fits) of each id's row
    bytes cost another ``fwd_ns_per_miss_byte`` forward and ``bwd_ns_per_miss_byte``
    backward (``resident_bytes``: the last-level cache on cpu, L2 on cuda).

    A weighted table (per-sample weights) costs ``weighted_fwd_factor`` and
    ``weighted_bwd_factor`` times as much, and its backward another ``weighted_bwd_us_per_id
    · ids + weighted_bwd_ns_per_byte · ids · row bytes + weighted_bwd_ns_per_miss_byte · ids ·
    row bytes · miss``: the gradient of the weights reads every id's row again, so what it
    adds grows with the bytes read (and missed), not with the rest of the backward (profiles
    of schema 1.1 fit these terms and leave ``weighted_bwd_factor`` at 1; 1.0 profiles have
    the factor only). On cpu every table has its own kernel (so the call costs are per
    shard); on cuda one kernel batches a rank's tables of one key.

    ``cache_hit_rate``: set on ``fused_uvm_caching`` entries only, the share of ids that hit
    the cache when they were measured. ``pooled: false``: FBGEMM's unpooled kernel, which
    sequence tables use (a row out per id; its backward costs far more than the pooled
    one's); a profile without one prices sequence tables with the pooled entry."""

    compute_kernel: ComputeKernel
    cache_hit_rate: Fraction | None = None
    pooled: Bool = True
    resident_bytes: MemoryBytes = 0
    fwd_ns_per_miss_byte: NsPerByte = 0.0
    bwd_ns_per_miss_byte: NsPerByte = 0.0
    weighted_fwd_factor: WeightedFactor = 1.0
    weighted_bwd_factor: WeightedFactor = 1.0
    weighted_bwd_us_per_id: UsPerId = 0.0
    weighted_bwd_ns_per_byte: NsPerByte = 0.0
    weighted_bwd_ns_per_miss_byte: NsPerByte = 0.0
    call_fwd_ms: FixedMs
    call_bwd_ms: FixedMs
    fwd_us_per_id: UsPerId
    fwd_ns_per_byte: NsPerByte
    fwd_ns_per_out_byte: NsPerByte
    bwd_us_per_id: UsPerId
    bwd_ns_per_byte: NsPerByte
    bwd_ns_per_row_byte: NsPerByte
    fit_fwd: FitQuality
    fit_bwd: FitQuality

    @model_validator(mode="after")
    def _hit_rate_on_caching_only(self) -> Self:
        caching = self.compute_kernel is ComputeKernel.FUSED_UVM_CACHING
        if caching != (self.cache_hit_rate is not None):
            raise _error(
                "cache_hit_rate",
                "cache_hit_rate is given with compute_kernel fused_uvm_caching, and only with "
                "it (got {rate} for {kernel})",
                rate=self.cache_hit_rate,
                kernel=self.compute_kernel.value,
                at="cache_hit_rate",
                value=self.cache_hit_rate,
            )
        return self


class CollectiveCoefficients(_Value):
    """One collective over ``world_size`` ranks, ``ranks_per_host`` of them on each host,
    as measured: ``latency_ms + ns_per_byte · bytes`` a rank sends."""

    collective: Collective
    world_size: WorldSize
    ranks_per_host: WorldSize
    latency_ms: FixedMs
    ns_per_byte: NsPerByte
    fit: FitQuality


class RuntimeCoefficients(_Value):
    """shardplan's runtime's own work around the kernels and collectives (bucketing ids,
    permutes, copies), per step: ``step_ms`` whatever the plan, ``input_us_per_id`` per id a
    rank receives, ``output_ns_per_byte`` per byte of output it stitches,
    ``placement_ns_per_byte`` per byte of a sequence table's rows it puts in batch order
    (rows that came back from row blocks or from data-parallel replicas: a gather forward,
    another backward; 0 in profiles before schema 1.2; its fit: ``fit_placement``), and
    ``sharding_type_ms`` for each sharding type a plan uses at all (its own exchanges).

    Whole steps (``fit_steps``: measured plans) scale what the parts predict: a shard's
    compute by ``compute_scale``, its output exchange by ``comms_scale``, its input
    distribution by ``input_scale`` (ranks waiting for each other, caches colder or warmer
    than in the microbenchmarks, ranks sharing cores)."""

    step_ms: FixedMs
    input_us_per_id: UsPerId
    output_ns_per_byte: NsPerByte
    placement_ns_per_byte: NsPerByte = 0.0
    sharding_type_ms: dict[ShardingType, FixedMs] = Field(default_factory=dict)
    fit: FitQuality
    compute_scale: RuntimeScale = 1.0
    comms_scale: RuntimeScale = 1.0
    input_scale: RuntimeScale = 1.0
    fit_steps: FitQuality | None = None
    fit_placement: FitQuality | None = None


class MachineInfo(_Value):
    """Where a profile was measured (for people; the planner reads only ``kind``)."""

    hostname: Text = ""
    device_name: Text = ""
    cpu_count: Annotated[int, Strict(), Field(ge=1, le=1_000_000)]
    threads_per_rank: Annotated[int, Strict(), Field(ge=1, le=1_000_000)]
    shardplan_version: Text = ""
    torch_version: Text = ""
    fbgemm_gpu_version: Text = ""
    python_version: Text = ""


class DeviceProfile(_Value):
    """A machine's calibrated costs (``shardplan calibrate``), read by the ``calibrated``
    cost model. Its content address (``profile_id_of``) names it in the service."""

    schema_version: Annotated[str, Strict(), Field(max_length=32)] = PROFILE_SCHEMA_VERSION
    name: Name
    compute_device: ComputeDevice
    measured_at: Text = ""
    machine: MachineInfo
    budget_s: Annotated[StrictFloat, Field(ge=0.0, le=MAX_TIME_LIMIT_S, allow_inf_nan=False)] = 0.0
    wall_s: Annotated[StrictFloat, Field(ge=0.0, le=MAX_TIME_LIMIT_S, allow_inf_nan=False)] = 0.0
    kernels: list[KernelCoefficients] = Field(min_length=1, max_length=MAX_PROFILE_ENTRIES)
    collectives: list[CollectiveCoefficients] = Field(max_length=MAX_PROFILE_ENTRIES)
    runtime: RuntimeCoefficients

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, version: str) -> str:
        if version not in PROFILE_SCHEMA_VERSIONS:
            raise _error(
                "schema_version",
                "device profile schema_version {version!r} is not one this planner reads "
                "({known}); calibrate again with this version's shardplan",
                version=version,
                known=", ".join(PROFILE_SCHEMA_VERSIONS),
                at="",
                value=version,
            )
        return version

    @model_validator(mode="after")
    def _terms_of_its_version(self) -> Self:
        for later, part, term in _later_terms(self.schema_version):
            entries = (
                [(f"kernels[{i}]", k) for i, k in enumerate(self.kernels)]
                if part == "kernels"
                else [("runtime", self.runtime)]
            )
            for at, entry in entries:
                value = getattr(entry, term)
                if value != type(entry).model_fields[term].default:
                    raise _error(
                        "term_of_later_schema",
                        "{where} is a term of device profile schema {later}; this "
                        "profile's schema_version is {version}: set it to {later}, or drop "
                        "the term",
                        at=f"{at}.{term}",
                        value=value,
                        where=f"{at}.{term}",
                        later=later,
                        version=self.schema_version,
                    )
        return self

    @model_serializer(mode="wrap")
    def _as_its_version_writes_it(self, handler: SerializerFunctionWrapHandler) -> JsonObject:
        data: JsonObject = handler(self)
        for _, part, term in _later_terms(self.schema_version):
            entries = data.get(part)
            for entry in entries if isinstance(entries, list) else [entries]:
                if isinstance(entry, dict):
                    entry.pop(term, None)
        return data

    @model_validator(mode="after")
    def _complete(self) -> Self:
        needed = PROFILE_KERNELS[self.compute_device]
        have = {k.compute_kernel for k in self.kernels if k.pooled}
        missing = sorted(k.value for k in needed - have)
        if missing:
            raise _error(
                "missing_kernel",
                "a {device} profile needs coefficients for every kernel of the device "
                "({needed}); it has none for {missing}",
                device=self.compute_device.value,
                needed=", ".join(sorted(k.value for k in needed)),
                missing=", ".join(missing),
                at="kernels",
                value=missing[0],
            )
        wrong = sorted(k.value for k in {k.compute_kernel for k in self.kernels} - needed)
        if wrong:
            raise _error(
                "kernel_device",
                "compute kernel {kernel} does not run on {device} (its kernels: {needed})",
                kernel=wrong[0],
                device=self.compute_device.value,
                needed=", ".join(sorted(k.value for k in needed)),
                at="kernels",
                value=wrong[0],
            )
        keys: Counter[tuple[object, ...]] = Counter(
            (k.compute_kernel, k.cache_hit_rate, k.pooled) for k in self.kernels
        )
        keys.update((c.collective, c.world_size, c.ranks_per_host) for c in self.collectives)
        twice = [key for key, count in keys.items() if count > 1]
        if twice:
            raise _error(
                "duplicate_entry",
                "the profile has two entries for {key}; give each kernel (and hit rate) and "
                "each collective (at a world size and ranks per host) once",
                key=", ".join(str(getattr(part, "value", part)) for part in twice[0]),
                at="kernels" if isinstance(twice[0][0], ComputeKernel) else "collectives",
                value=str(twice[0]),
            )
        for i, entry in enumerate(self.collectives):
            if entry.ranks_per_host > entry.world_size:
                raise _error(
                    "ranks_per_host",
                    "collectives[{i}].ranks_per_host {local} is more than its world_size {world}",
                    i=i,
                    local=entry.ranks_per_host,
                    world=entry.world_size,
                    at=f"collectives[{i}].ranks_per_host",
                    value=entry.ranks_per_host,
                )
        return self


PROFILE_KERNELS = {
    ComputeDevice.CPU: frozenset({ComputeKernel.FUSED, ComputeKernel.DENSE}),
    ComputeDevice.CUDA: frozenset(ComputeKernel),
}


def profile_id_of(profile: DeviceProfile) -> str:
    """A profile's content address: the sha256 of its canonical JSON."""
    return sha256_hex(canonical_bytes(profile))


class PlanOptions(_Value):
    """How to solve: time budget, random seed, objective, and the cost model that prices
    shards (``shardplan``, or ``torchrec-1.8`` to judge plans on TorchRec's own terms).

    ``gap_limit`` (default 0.02): stop searching once the plan is proven within this
    relative gap of the optimum (0.02: at most 2% slower than the best plan there is). 0
    searches until the plan is proven optimal or ``time_limit_s`` is spent."""

    time_limit_s: Annotated[
        StrictFloat, Field(gt=0.0, le=MAX_TIME_LIMIT_S, allow_inf_nan=False)
    ] = DEFAULT_TIME_LIMIT_S
    gap_limit: Fraction = DEFAULT_GAP_LIMIT
    seed: Annotated[int, Strict(), Field(ge=0, le=MAX_SEED)] = 0
    objective: Objective = Objective.MAX_RANK_COST
    cost_model: CostModel = CostModel.SHARDPLAN
    # Incremental re-planning (docs/requests.md, "Re-planning a changed model"). Absent
    # from the JSON form when unset, so requests without them hash and dump as before.
    previous_plan_id: Sha256Hex | None = None
    previous_plan: ShardingPlan | None = None
    max_moved_bytes: ByteSize | None = None
    move_cost_ms_per_gib: (
        Annotated[StrictFloat, Field(ge=0.0, le=MAX_MOVE_COST_MS_PER_GIB, allow_inf_nan=False)]
        | None
    ) = None
    # The calibrated model's coefficients (docs/cost-model.md, "Calibrating for your
    # hardware"): inline, or by id from the service, which fills in the profile. An inline
    # profile's id is filled in, so both forms of one request hash alike.
    device_profile_id: Sha256Hex | None = None
    device_profile: DeviceProfile | None = None

    @model_validator(mode="after")
    def _check_profile(self) -> Self:
        profile, given_id = self.device_profile, self.device_profile_id
        calibrated = self.cost_model is CostModel.CALIBRATED
        if not calibrated and (profile is not None or given_id is not None):
            raise _error(
                "profile_without_calibrated",
                "a device profile prices shards only under cost_model 'calibrated' (this "
                "request's is {model!r}); set cost_model to 'calibrated' or drop the profile",
                model=self.cost_model.value,
                at="device_profile" if profile is not None else "device_profile_id",
                value=self.cost_model.value,
            )
        if calibrated and profile is None and given_id is None:
            raise _error(
                "calibrated_needs_profile",
                "cost_model 'calibrated' needs a device profile: give device_profile (from "
                "shardplan calibrate) or, to the service, device_profile_id",
                at="cost_model",
                value=self.cost_model.value,
            )
        if profile is not None:
            actual = profile_id_of(profile)
            if given_id is not None and given_id != actual:
                raise _error(
                    "profile_mismatch",
                    "device_profile_id {given} is not the content address of device_profile "
                    "({actual}); give one of them, or both naming the same profile",
                    given=given_id,
                    actual=actual,
                    at="device_profile_id",
                    value=given_id,
                )
            object.__setattr__(self, "device_profile_id", actual)
        return self

    @model_validator(mode="after")
    def _check_previous(self) -> Self:
        previous = self.previous_plan
        if previous is not None:
            reason = schema_version_problem(previous.schema_version)
            if reason is not None:
                raise _error(
                    "schema_version",
                    "previous_plan: {reason}",
                    reason=reason,
                    at="previous_plan.schema_version",
                    value=previous.schema_version,
                )
            actual = plan_id_of(previous.model_dump(mode="json"))
            if actual != previous.plan_id:
                raise _error(
                    "plan_id_mismatch",
                    "previous_plan's content does not match its plan_id {claimed}: its "
                    "content address is {actual}; send the stored plan unchanged",
                    claimed=previous.plan_id,
                    actual=actual,
                    at="previous_plan.plan_id",
                    value=previous.plan_id,
                )
            check_previous_layout(previous, "previous_plan.")
            if self.previous_plan_id is not None and self.previous_plan_id != previous.plan_id:
                raise _error(
                    "previous_plan_mismatch",
                    "previous_plan_id {given} is not the plan_id of previous_plan ({inline}); "
                    "give one of them, or both naming the same plan",
                    given=self.previous_plan_id,
                    inline=previous.plan_id,
                    at="previous_plan_id",
                    value=self.previous_plan_id,
                )
        elif self.previous_plan_id is None:
            for name in ("max_moved_bytes", "move_cost_ms_per_gib"):
                if getattr(self, name) is not None:
                    raise _error(
                        "needs_previous_plan",
                        "{name} limits or prices moves from a previous plan; give "
                        "previous_plan_id (or previous_plan) with it",
                        name=name,
                        at=name,
                        value=getattr(self, name),
                    )
        return self

    @model_serializer(mode="wrap")
    def _omit_unset_incremental(self, handler: SerializerFunctionWrapHandler) -> JsonObject:
        return _without_absent(handler(self), INCREMENTAL_OPTIONS + PROFILE_OPTIONS)

    @property
    def incremental(self) -> bool:
        """Whether the request re-plans from a previous plan."""
        return self.previous_plan is not None or self.previous_plan_id is not None


INCREMENTAL_OPTIONS = (
    "previous_plan_id",
    "previous_plan",
    "max_moved_bytes",
    "move_cost_ms_per_gib",
)
PROFILE_OPTIONS = ("device_profile_id", "device_profile")


class PlanRequest(_Value):
    """Everything the planner needs: topology, tables, constraints, batch size, options."""

    topology: Topology
    tables: list[Table] = Field(min_length=1)
    constraints: Constraints = Field(default_factory=Constraints)
    batch_size: BatchSize = DEFAULT_BATCH_SIZE
    options: PlanOptions = Field(default_factory=PlanOptions)

    @field_validator("tables")
    @classmethod
    def _unique_names(cls, tables: list[Table]) -> list[Table]:
        first_table: dict[str, int] = {}
        first_feature: dict[str, int] = {}
        for i, table in enumerate(tables):
            if table.name in first_table:
                raise _error(
                    "duplicate_table",
                    "tables[{i}].name {name!r} duplicates tables[{j}].name; table names must "
                    "be unique",
                    i=i,
                    j=first_table[table.name],
                    name=table.name,
                    at=f"[{i}].name",
                    value=table.name,
                )
            first_table[table.name] = i
            for feature in table.feature_names:
                if feature in first_feature:
                    raise _error(
                        "duplicate_feature",
                        "tables[{i}] ({name!r}) uses feature {feature!r}, already used by "
                        "tables[{j}]; each feature looks up exactly one table",
                        i=i,
                        j=first_feature[feature],
                        name=table.name,
                        feature=feature,
                        at=f"[{i}].feature_names",
                        value=feature,
                    )
                first_feature[feature] = i
        return tables

    @model_validator(mode="after")
    def _check_profile_device(self) -> Self:
        profile = self.options.device_profile
        device = self.topology.compute_device
        if profile is not None and profile.compute_device is not device:
            raise _error(
                "profile_device",
                "options.device_profile describes a {profile} machine, but the topology's "
                "compute_device is {device}; calibrate on a {device} machine",
                profile=profile.compute_device.value,
                device=device.value,
                at="options.device_profile.compute_device",
                value=profile.compute_device.value,
            )
        return self

    @model_validator(mode="after")
    def _check_references(self) -> Self:
        names = {table.name for table in self.tables}
        world = self.topology.world_size
        for name, constraint in self.constraints.tables.items():
            if name not in names:
                raise _unknown_table(f"constraints.tables.{name}", name, names)
            _check_pinned_ranks(name, constraint.ranks or [], world)
        for field in ("colocate", "separate"):
            for g, group in enumerate(getattr(self.constraints, field)):
                for name in group:
                    if name not in names:
                        raise _unknown_table(f"constraints.{field}[{g}]", name, names)
        return self


def _check_pinned_ranks(name: str, ranks: list[int], world: int) -> None:
    """Pinned ranks are distinct ranks of the topology, so there are at most world_size."""
    seen: set[int] = set()
    for rank in ranks:
        if rank >= world:
            raise _error(
                "rank_range",
                "constraints.tables.{name}.ranks has rank {rank}, out of range for "
                "world_size {world}; ranks are 0..{last}",
                name=name,
                rank=rank,
                world=world,
                last=world - 1,
                at=f"constraints.tables.{name}.ranks",
                value=rank,
            )
        if rank in seen:
            raise _error(
                "duplicate_rank",
                "constraints.tables.{name}.ranks lists rank {rank} more than once; list each "
                "rank once (at most world_size {world} ranks)",
                name=name,
                rank=rank,
                world=world,
                at=f"constraints.tables.{name}.ranks",
                value=rank,
            )
        seen.add(rank)


def _unknown_table(where: str, name: str, names: set[str]) -> PydanticCustomError:
    known = ", ".join(sorted(names)[:10]) + (", ..." if len(names) > 10 else "")
    return _error(
        "unknown_table",
        "{where} names table {name!r}, which is not in tables; known tables: {known}",
        where=where,
        name=name,
        known=known,
        at=where,
        value=name,
    )


# --------------------------------------------------------------------------- plans


class Shard(_Value):
    """One rectangular piece of a table: ``offsets`` [row, col] and ``sizes`` [rows, cols]."""

    offsets: tuple[NumRows, NumColumns]
    sizes: tuple[NumRows, NumColumns]
    rank: Rank


class ParameterSharding(_Value):
    """How one table is sharded (TorchRec's ParameterSharding, with explicit shards).

    ``ranks`` lists the rank of each shard in shard order; ``cache_load_factor`` is set only
    for ``fused_uvm_caching``.
    """

    sharding_type: ShardingType
    compute_kernel: ComputeKernel
    ranks: list[Rank]
    shards: list[Shard] = Field(min_length=1)
    cache_load_factor: LoadFactor | None = None

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def shards_on(self, rank: int) -> list[tuple[int, Shard]]:
        """The shards on ``rank``, each with its index in shard order."""
        return [(i, shard) for i, shard in enumerate(self.shards) if shard.rank == rank]

    def placed_ranks(self) -> frozenset[int]:
        """The ranks that hold a shard of the table."""
        return frozenset(shard.rank for shard in self.shards)


# A rank in a 2.0 plan's rank list: itself, or the consecutive ranks [first, last] (runs.py).
RankRunItem = Annotated[Rank | tuple[Rank, Rank], Field(union_mode="left_to_right")]
ShardCount = Annotated[int, Strict(), Field(ge=1, le=MAX_WORLD_SIZE)]
# [width, count]: ``count`` consecutive column shards ``width`` columns wide.
WidthRunItem = tuple[NumColumns, ShardCount]


class CompactSharding(_Value):
    """How one table is sharded in plan schema 2.0: a split rule and a rank list, so a
    table on 4,096 ranks is a few dozen bytes, not 4,096 shard records.

    ``shape`` is the table's [rows, columns]; ``ranks`` (``rank_runs`` here) the rank of
    each shard in shard order, consecutive ranks written as [first, last] runs
    (``plan.runs``). The shards follow from the sharding type:

    - ``table_wise``: one shard, the whole table;
    - ``row_wise``, ``table_row_wise``: full-width row blocks of ``rows_per_shard`` rows in
      order, the last one that has rows holding the remainder, any after it none;
    - ``column_wise``, ``table_column_wise``: full-height column blocks left to right, of
      the widths ``column_widths`` gives as [width, count] runs;
    - ``data_parallel``: a whole replica on each rank.

    ``shards``, ``ranks`` expand them (once, kept); ``shards_on(rank)`` expands one rank's
    only, which is what a training rank needs of a table spread over every rank.
    """

    model_config = ConfigDict(serialize_by_alias=True)

    sharding_type: ShardingType
    compute_kernel: ComputeKernel
    shape: tuple[NumRows, NumColumns]
    rank_runs: list[RankRunItem] = Field(alias="ranks", min_length=1, max_length=MAX_WORLD_SIZE)
    rows_per_shard: NumRows | None = None
    column_widths: list[WidthRunItem] | None = Field(
        default=None, min_length=1, max_length=MAX_EMBEDDING_DIM
    )
    cache_load_factor: LoadFactor | None = None

    @model_validator(mode="after")
    def _check_runs(self) -> Self:
        """What the shards are built from is all there, consistent and in its one
        spelling; checked on the runs, never by listing the ranks. A table on one rank
        (most of a plan's) takes the short way: a load_plan of 10,000 tables checks them
        all."""
        runs = self.rank_runs
        count = 1 if len(runs) == 1 and isinstance(runs[0], int) else _check_rank_runs(self)
        _check_split_rule(self, count)
        return self

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler: SerializerFunctionWrapHandler) -> JsonObject:
        return _without_absent(
            handler(self), ("rows_per_shard", "column_widths", "cache_load_factor")
        )

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy whose expansions are made again from its own runs, not the original's."""
        copied = super().model_copy(update=update, deep=deep)
        for expanded in _EXPANSIONS:
            copied.__dict__.pop(expanded, None)
        return copied

    @property
    def num_shards(self) -> int:
        return rank_count(self.rank_runs)

    @functools.cached_property
    def ranks(self) -> list[int]:
        """The rank of each shard, in shard order (as ``ParameterSharding.ranks``)."""
        return expand_rank_runs(self.rank_runs)

    @functools.cached_property
    def shards(self) -> list[Shard]:
        """Every shard, in shard order (as ``ParameterSharding.shards``)."""
        return [self.shard(i, rank) for i, rank in enumerate(self.ranks)]

    def shards_on(self, rank: int) -> list[tuple[int, Shard]]:
        """The shards on ``rank``, each with its index in shard order, without expanding
        the others."""
        return [(i, self.shard(i, rank)) for i in rank_positions(self.rank_runs, rank)]

    def placed_ranks(self) -> frozenset[int]:
        """The ranks that hold a shard of the table."""
        return frozenset(self.ranks)

    def shard(self, index: int, rank: int) -> Shard:
        """Shard ``index`` (of ``num_shards``), placed on ``rank``."""
        rows, cols = self.shape
        if self.rows_per_shard is not None:
            start = min(index * self.rows_per_shard, rows)
            offsets, sizes = (start, 0), (min(self.rows_per_shard, rows - start), cols)
        elif self.column_widths is not None:
            start, width = self._column_block(index)
            offsets, sizes = (0, start), (rows, width)
        else:
            offsets, sizes = (0, 0), self.shape
        return Shard.model_construct(offsets=offsets, sizes=sizes, rank=rank)

    def _column_block(self, index: int) -> tuple[int, int]:
        """(first column, width) of column shard ``index``."""
        assert self.column_widths is not None
        start = 0
        for width, count in self.column_widths:
            if index < count:
                return start + index * width, width
            start += width * count
            index -= count
        raise IndexError(f"column shard {index} past the last")


_EXPANSIONS = ("ranks", "shards")  # CompactSharding's cached properties
TableShardingModel = ParameterSharding | CompactSharding
# A plan's table: explicit shards (schemas 1.x) or runs (2.0), told apart by a "shards" key.
TableSharding = Annotated[
    Annotated[ParameterSharding, Tag(SHARD_LIST_TAG)] | Annotated[CompactSharding, Tag(RUNS_TAG)],
    Discriminator(lambda value: _sharding_form(value)),
]


def _sharding_form(value: object) -> str:
    """Which model a table's sharding is: explicit shards (schemas 1.x) or runs (2.0)."""
    if isinstance(value, dict):
        return SHARD_LIST_TAG if "shards" in value else RUNS_TAG
    return RUNS_TAG if isinstance(value, CompactSharding) else SHARD_LIST_TAG


def _check_rank_runs(sharding: CompactSharding) -> int:
    """The number of ranks (shards) the runs stand for, once checked."""
    problem = rank_runs_problem(sharding.rank_runs)
    if problem is not None:
        raise _error("rank_runs", "{problem}", problem=problem, at="ranks", value=None)
    count = sharding.num_shards
    if count > MAX_WORLD_SIZE:
        raise _error(
            "rank_runs",
            "the ranks name {count} shards; a table has at most {most} (MAX_WORLD_SIZE)",
            count=count,
            most=MAX_WORLD_SIZE,
            at="ranks",
            value=count,
        )
    if sharding.sharding_type is ShardingType.TABLE_WISE and count != 1:
        raise _error(
            "rank_runs",
            "table_wise has one shard on one rank; ranks names {count}",
            count=count,
            at="ranks",
            value=count,
        )
    return count


def _check_split_rule(sharding: CompactSharding, count: int) -> None:
    """Row types have ``rows_per_shard`` and column types ``column_widths``, the others
    neither; blocks cover the table's rows, widths add up to its columns, one per rank."""
    kind = sharding.sharding_type
    for field, types in _SPLIT_FIELDS:
        if (getattr(sharding, field) is None) == (kind in types):
            raise _error(
                "split_rule",
                "{field} is {what} for sharding_type {sharding_type}",
                field=field,
                what="required" if kind in types else "not a field",
                sharding_type=kind.value,
                at=field,
                value=None,
            )
    rows, cols = sharding.shape
    if sharding.rows_per_shard is not None and sharding.rows_per_shard * count < rows:
        raise _error(
            "split_rule",
            "{count} blocks of rows_per_shard {block} cover {covered} of the table's {rows} "
            "rows; use rows_per_shard of at least ceil(rows / shards) = {least}",
            count=count,
            block=sharding.rows_per_shard,
            covered=sharding.rows_per_shard * count,
            rows=rows,
            least=-(-rows // count),
            at="rows_per_shard",
            value=sharding.rows_per_shard,
        )
    if sharding.column_widths is not None:
        _check_width_runs(sharding.column_widths, cols, count)


_SPLIT_FIELDS = (
    ("rows_per_shard", ROW_SHARDING_TYPES),
    ("column_widths", COLUMN_SHARDING_TYPES),
)


def _check_width_runs(runs: list[tuple[int, int]], cols: int, count: int) -> None:
    problem = width_runs_problem(runs)
    shards = sum(run_count for _, run_count in runs)
    width = sum(run_width * run_count for run_width, run_count in runs)
    if problem is None and shards != count:
        problem = f"the runs make {shards} column shards but ranks names {count}"
    if problem is None and width != cols:
        problem = f"the widths add up to {width} columns, not the table's {cols}"
    if problem is not None:
        raise _error("split_rule", "{problem}", problem=problem, at="column_widths", value=None)


class Perf(_Value):
    """Estimated milliseconds per training iteration, by component.

    ``total`` is the rating the planner balances; which components it sums depends on the
    cost model (TorchRec's excludes ``input_dist``).
    """

    fwd_compute: NonNegativeFloat = 0.0
    fwd_comms: NonNegativeFloat = 0.0
    bwd_compute: NonNegativeFloat = 0.0
    bwd_comms: NonNegativeFloat = 0.0
    prefetch: NonNegativeFloat = 0.0
    input_dist: NonNegativeFloat = 0.0
    total: NonNegativeFloat = 0.0


PERF_FIELDS = tuple(Perf.model_fields)  # the components, then ``total``
PERF_COMPONENTS = PERF_FIELDS[:-1]  # what a cost model may sum into ``total``
assert PERF_FIELDS[-1] == "total"


class RankStats(_Value):
    """What a plan puts on one rank: bytes per memory tier and estimated time."""

    rank: Rank
    hbm_bytes: PlanBytes
    ddr_bytes: PlanBytes
    perf: Perf = Field(default_factory=Perf)


# Schema 2.0 writes ``rank_stats`` as columns: one list per field, the n-th entries of all
# lists one rank's stats. On 4,096 ranks the field names repeated per rank were a fifth of
# the plan (0.5 of 2.3 MB); in memory it stays a list of ``RankStats``.
_STATS_FIELDS = ("rank", "hbm_bytes", "ddr_bytes")


class PerfColumns(_Value):
    """Schema 2.0's ``rank_stats.perf``: each component's milliseconds, one entry per rank."""

    fwd_compute: list[NonNegativeFloat]
    fwd_comms: list[NonNegativeFloat]
    bwd_compute: list[NonNegativeFloat]
    bwd_comms: list[NonNegativeFloat]
    prefetch: list[NonNegativeFloat]
    input_dist: list[NonNegativeFloat]
    total: list[NonNegativeFloat]


class RankStatsColumns(_Value):
    """Schema 2.0's ``rank_stats``: lists of one length, the n-th entries one rank's stats.
    Only the JSON edge has this form (its JSON Schema, for OpenAPI); in memory a plan
    holds a list of ``RankStats``."""

    rank: list[Rank]
    hbm_bytes: list[PlanBytes]
    ddr_bytes: list[PlanBytes]
    perf: PerfColumns


assert tuple(PerfColumns.model_fields) == PERF_FIELDS
assert tuple(RankStatsColumns.model_fields) == (*_STATS_FIELDS, "perf")


class _RankStatsEitherForm:
    """The JSON Schema of ``ShardingPlan.rank_stats``: one object per rank (schema 1.x) or
    columns (2.0); which one the plan's ``schema_version`` says."""

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        rows = handler(core_schema)
        columns = handler(RankStatsColumns.__pydantic_core_schema__)
        return {
            "anyOf": [rows, columns],
            "description": "one object per rank (schema 1.x) or columns (schema 2.0)",
        }


def rank_stats_columns(rows: list[JsonObject]) -> JsonObject:
    """``rank_stats`` JSON data, one object per rank, as columns (schema 2.0's form)."""
    columns: JsonObject = {field: [row[field] for row in rows] for field in _STATS_FIELDS}
    columns["perf"] = {name: [row["perf"][name] for row in rows] for name in PERF_FIELDS}
    return columns


def rank_stats_rows(columns: object) -> object:
    """Schema 2.0's ``rank_stats`` columns as one object per rank; what is not columns of
    one length is left as it is, for validation to name."""
    if not isinstance(columns, dict) or set(columns) != {*_STATS_FIELDS, "perf"}:
        return columns
    perf = columns["perf"]
    lists = [columns[field] for field in _STATS_FIELDS]
    if not isinstance(perf, dict) or set(perf) != set(PERF_FIELDS):
        return columns
    lists += [perf[name] for name in PERF_FIELDS]
    if not all(isinstance(values, list) for values in lists):
        return columns
    if len({len(values) for values in lists}) != 1:
        return columns
    perfs = [dict(zip(PERF_FIELDS, values, strict=True)) for values in zip(*lists[3:], strict=True)]
    return [
        {"rank": rank, "hbm_bytes": hbm, "ddr_bytes": ddr, "perf": one}
        for rank, hbm, ddr, one in zip(*lists[:3], perfs, strict=True)
    ]


class SolverReport(_Value):
    """How good the plan is and how sure we are.

    ``objective`` is the max over ranks of summed shard ``perf.total`` (ms);
    ``lower_bound`` the best proven bound (``lower_bound_source`` says which);
    ``gap`` = (objective - lower_bound) / objective; ``critical_path`` the sum over perf
    components of their max over ranks (ranks wait for each other at every collective);
    ``stop_reason`` what ended the search (absent from plans of schema 1.0, which predate
    it, and then left out of their canonical form so their ids still verify).
    The solve's wall time is not part of the plan (it would make equal plans differ
    byte-for-byte); it travels beside the plan.
    """

    status: SolverStatus
    objective: NonNegativeFloat
    lower_bound: NonNegativeFloat
    gap: NonNegativeFloat
    lower_bound_source: BoundSource | None = None
    critical_path: NonNegativeFloat = 0.0
    stop_reason: StopReason | None = None

    @model_serializer(mode="wrap")
    def _omit_absent_stop_reason(self, handler: SerializerFunctionWrapHandler) -> JsonObject:
        return _without_absent(handler(self), ("stop_reason",))


class RankMoves(_Value):
    """The bytes one rank sends and receives to go from the previous plan to this one."""

    rank: Rank
    sent_bytes: PlanBytes
    received_bytes: PlanBytes


class Migration(_Value):
    """How far a plan re-planned from a previous one is from it (schema 1.2): the bytes of
    weights and optimizer state that move between ranks (``plan.transfers.plan_moves``), per rank
    (ranks that send or receive nothing are left out), and the limits it was planned under.
    ``moved_bytes`` is the sum of ``received_bytes`` (and of ``sent_bytes``)."""

    previous_plan_id: Sha256Hex
    moved_bytes: PlanBytes
    tables_moved: Annotated[int, Strict(), Field(ge=0)]
    ranks: list[RankMoves]
    max_moved_bytes: PlanBytes | None = None
    move_cost_ms_per_gib: NonNegativeFloat | None = None


class ShardingPlan(_Value):
    """A complete, content-addressed sharding plan.

    ``plan_id`` is the sha256 of the canonical JSON of every other field, so a plan's
    identity is its content (see ``plan.canonical``). ``migration`` is present only in plans
    re-planned from a previous plan (and absent from their JSON otherwise).
    """

    schema_version: Annotated[str, Strict(), Field(pattern=SCHEMA_VERSION_PATTERN)] = SCHEMA_VERSION
    plan_id: Sha256Hex
    request_hash: Sha256Hex
    planner_version: Name
    world_size: WorldSize
    tables: dict[Name, TableSharding] = Field(min_length=1)
    rank_stats: Annotated[list[RankStats], _RankStatsEitherForm()]
    solver: SolverReport
    migration: Migration | None = None

    @model_validator(mode="after")
    def _check_consistent(self) -> Self:
        """What a plan says about itself that no request is needed to check: its schema
        has its fields and its migration adds up (the validator checks its shards against
        the request; ``check_previous_layout`` checks them without one)."""
        _check_schema_fields(self)
        if self.migration is not None:
            _check_migration(self.migration, self.world_size, len(self.tables))
        return self

    @field_validator("rank_stats", mode="before")
    @classmethod
    def _rank_stats_from_columns(cls, stats: object, info: ValidationInfo) -> object:
        """Schema 2.0 writes ``rank_stats`` as columns, 1.x as one object per rank. A
        field validator, not the model's: only this field is read into Python objects
        before validation, the tables stay on pydantic's JSON path."""
        version = info.data.get("schema_version")
        if version is None:  # refused already
            return stats
        columns = schema_tuple(version) >= COMPACT_SCHEMA
        if columns != isinstance(stats, dict):
            raise PydanticCustomError(
                "schema_field",
                f"plan schema {version!r} writes rank_stats as "
                f"{'columns: an object of lists' if columns else 'a list of objects'}",
            )
        if not columns:
            return stats
        rows = rank_stats_rows(stats)
        if rows is stats:
            raise PydanticCustomError(
                "rank_stats_columns",
                "rank_stats columns are rank, hbm_bytes, ddr_bytes and perf (an object of "
                f"{', '.join(PERF_FIELDS)}), lists of one length",
            )
        return rows

    @model_serializer(mode="wrap")
    def _omit_absent_migration(self, handler: SerializerFunctionWrapHandler) -> JsonObject:
        data = _without_absent(handler(self), ("migration",))
        if schema_tuple(self.schema_version) >= COMPACT_SCHEMA:
            data["rank_stats"] = rank_stats_columns(data["rank_stats"])
        return data


def _check_schema_fields(plan: ShardingPlan) -> None:
    """A field exists from the schema that added it on: 1.0 plans have no
    ``solver.stop_reason``, plans before 1.2 no ``migration``; tables are shard lists
    before 2.0 and runs from 2.0 on."""
    version = schema_tuple(plan.schema_version)
    if plan.solver.stop_reason is not None and version < (1, 1):
        raise _error(
            "schema_field",
            "solver.stop_reason is a field of plan schema 1.1 and later; this plan says "
            "schema_version {version!r}",
            version=plan.schema_version,
            at="solver.stop_reason",
            value=plan.solver.stop_reason.value,
        )
    compact = version >= COMPACT_SCHEMA
    for name, sharding in plan.tables.items():
        if isinstance(sharding, CompactSharding) != compact:
            raise _error(
                "schema_field",
                "plan schema {version!r} writes each table's shards as {form}; table "
                "{name!r} has {other}",
                version=plan.schema_version,
                form="a split rule and ranks" if compact else "a shards list",
                other="a shards list" if compact else "a split rule and ranks",
                name=name,
                at=f"tables.{name}",
                value=None,
            )
    if plan.migration is not None and version < (1, 2):
        raise _error(
            "schema_field",
            "migration is a field of plan schema 1.2 and later; this plan says "
            "schema_version {version!r}",
            version=plan.schema_version,
            at="migration",
            value=plan.schema_version,
        )


def _check_rank(rank: int, world_size: int, at: str) -> None:
    if rank >= world_size:
        raise _error(
            "rank_range",
            "{where} is rank {rank}, out of range for the plan's world_size {world}; ranks "
            "are 0..{last}",
            where=at,
            at=at,
            rank=rank,
            world=world_size,
            last=world_size - 1,
            value=rank,
        )


def check_previous_layout(plan: ShardingPlan, at: str) -> None:
    """A plan given without its request (``options.previous_plan``: its request is gone)
    checked as far as it can be: every rank it names exists, and each table's shards tile
    the rectangle they span, so nothing is computed from a shard on rank 100 of 4."""
    for name, sharding in plan.tables.items():
        _check_shards(name, sharding, plan.world_size, at)
    for i, stats in enumerate(plan.rank_stats):
        _check_rank(stats.rank, plan.world_size, f"{at}rank_stats[{i}].rank")


def _check_shards(name: str, sharding: TableShardingModel, world_size: int, at: str) -> None:
    """Shards on the plan's ranks that cover the rectangle they span exactly once by area
    (the validator, with the request, checks the tiling itself); data-parallel shards are
    each the whole table. Runs tile by construction (their model checks them): only their
    ranks' range is left to check, on the runs."""
    if isinstance(sharding, CompactSharding):
        _check_rank(rank_bounds(sharding.rank_runs)[1], world_size, f"{at}tables.{name}.ranks")
        return
    for i, rank in enumerate(sharding.ranks):
        _check_rank(rank, world_size, f"{at}tables.{name}.ranks[{i}]")
    for i, shard in enumerate(sharding.shards):
        _check_rank(shard.rank, world_size, f"{at}tables.{name}.shards[{i}].rank")
    rows = max(shard.offsets[0] + shard.sizes[0] for shard in sharding.shards)
    cols = max(shard.offsets[1] + shard.sizes[1] for shard in sharding.shards)
    if sharding.sharding_type is ShardingType.DATA_PARALLEL:
        whole = ((0, 0), (rows, cols))
        tiled = all((shard.offsets, shard.sizes) == whole for shard in sharding.shards)
    else:
        tiled = sum(shard.sizes[0] * shard.sizes[1] for shard in sharding.shards) == rows * cols
    if not tiled:
        raise _error(
            "tiling",
            "the shards of table {name!r} do not tile the {rows} x {cols} rectangle they "
            "span: each row and column of a table is in exactly one shard (every shard the "
            "whole table, for data_parallel)",
            name=name,
            rows=rows,
            cols=cols,
            at=f"{at}tables.{name}.shards",
            value=len(sharding.shards),
        )


def _check_migration(migration: Migration, world_size: int, num_tables: int) -> None:
    """Per-rank moves on the plan's ranks, each rank once, in order, summing to
    ``moved_bytes`` both ways; at most every table moved."""
    previous = -1
    for i, moves in enumerate(migration.ranks):
        _check_rank(moves.rank, world_size, f"migration.ranks[{i}].rank")
        if moves.rank <= previous:
            raise _error(
                "rank_order",
                "migration.ranks[{i}].rank {rank} is not after the rank before it; list each "
                "rank once, in rank order",
                i=i,
                rank=moves.rank,
                at=f"migration.ranks[{i}].rank",
                value=moves.rank,
            )
        previous = moves.rank
    for field in ("received_bytes", "sent_bytes"):
        total = sum(getattr(moves, field) for moves in migration.ranks)
        if total != migration.moved_bytes:
            raise _error(
                "migration_sum",
                "migration.moved_bytes {moved} is not the sum of the ranks' {field}, {total}",
                moved=migration.moved_bytes,
                field=field,
                total=total,
                at="migration.moved_bytes",
                value=migration.moved_bytes,
            )
    if migration.tables_moved > num_tables:
        raise _error(
            "tables_moved",
            "migration.tables_moved {moved} is more than the plan's {count} tables",
            moved=migration.tables_moved,
            count=num_tables,
            at="migration.tables_moved",
            value=migration.tables_moved,
        )
    if (migration.moved_bytes == 0) != (migration.tables_moved == 0):
        raise _error(
            "tables_moved",
            "migration.tables_moved {moved} with moved_bytes {moved_bytes}: tables move "
            "exactly when bytes do",
            moved=migration.tables_moved,
            moved_bytes=migration.moved_bytes,
            at="migration.tables_moved",
            value=migration.tables_moved,
        )


PlanOptions.model_rebuild()
PlanRequest.model_rebuild()


def gap(objective: float, lower_bound: float) -> float:
    """Relative optimality gap, 0 when the objective is 0 (nothing to do is optimal)."""
    if objective <= 0.0 or not math.isfinite(objective):
        return 0.0
    return max(0.0, (objective - lower_bound) / objective)


# --------------------------------------------------------------------------- validation


class ViolationCode(StrEnum):
    PLAN_ID_MISMATCH = "plan_id_mismatch"
    REQUEST_HASH_MISMATCH = "request_hash_mismatch"
    WORLD_SIZE_MISMATCH = "world_size_mismatch"
    TABLE_MISSING = "table_missing"
    TABLE_UNKNOWN = "table_unknown"
    KERNEL_INCOMPATIBLE = "kernel_incompatible"
    RANK_OUT_OF_RANGE = "rank_out_of_range"
    RANKS_MISMATCH = "ranks_mismatch"
    TILING = "tiling"
    SHARD_LAYOUT = "shard_layout"
    COLUMN_WIDTH = "column_width"
    NOT_ONE_HOST = "not_one_host"
    RANK_STATS = "rank_stats"
    HBM_CAPACITY = "hbm_capacity"
    DDR_CAPACITY = "ddr_capacity"
    SHARDING_TYPE_NOT_ALLOWED = "sharding_type_not_allowed"
    COMPUTE_KERNEL_NOT_ALLOWED = "compute_kernel_not_allowed"
    PINNED_RANKS = "pinned_ranks"
    MIN_PARTITION = "min_partition"
    CACHE_LOAD_FACTOR = "cache_load_factor"
    COLOCATE = "colocate"
    SEPARATE = "separate"
    SOLVER_REPORT = "solver_report"
    MIGRATION = "migration"


class TableProblemCode(StrEnum):
    NO_ALLOWED_OPTION = "no_allowed_option"
    DOES_NOT_FIT = "does_not_fit"


class TableProblem(_Value):
    """Why a table cannot be placed at all, with the numbers to act on."""

    code: TableProblemCode
    table: str
    message: str
    smallest_option: str | None = None
    needed_hbm_bytes: int | None = None
    needed_ddr_bytes: int | None = None
    largest_rank_hbm_bytes: int | None = None
    largest_rank_ddr_bytes: int | None = None


class InfeasibilityCode(StrEnum):
    TABLE_DOES_NOT_FIT = "table_does_not_fit"
    NO_ALLOWED_OPTION = "no_allowed_option"
    TOTAL_MEMORY = "total_memory"
    PINNED_RANKS_OVERLOADED = "pinned_ranks_overloaded"
    NO_FEASIBLE_COMBINATION = "no_feasible_combination"
    TIMED_OUT = "timed_out"
    MOVE_BUDGET = "move_budget"  # no plan found within options.max_moved_bytes


class InfeasibilityReason(_Value):
    """One reason no plan exists, in terms a user can act on."""

    code: InfeasibilityCode
    message: str
    tables: list[str] = Field(default_factory=list)
    ranks: list[int] = Field(default_factory=list)
    needed_bytes: int | None = None
    available_bytes: int | None = None


class SmallestFixes(_Value):
    """What relaxed re-solves found would make the request plannable."""

    min_world_size: int | None = None
    min_world_size_searched_up_to: int | None = None
    tables_fit_with_uvm_caching: list[str] = Field(default_factory=list)
    uvm_caching_makes_it_fit: bool = False


class ExplainCheck(StrEnum):
    """A part of the explanation of a request without a plan, which the time limit may
    leave unchecked (``Infeasibility.not_checked``)."""

    MEMORY_TOTALS = "memory_totals"  # all tables' least bytes against all (pinned) ranks
    LARGER_WORLD_SIZES = "larger_world_sizes"  # the search for the least world size
    UVM_CACHING = "uvm_caching"  # re-planning with fused_uvm_caching allowed


class Infeasibility(_Value):
    """Why a request has no plan (``infeasible``: proven; ``no_solution_in_time``: none
    found within the time limit, not proven impossible), and the smallest fixes found.
    ``not_checked``: what the explanation did not get to within ``time_limit_s`` (absent
    when it checked everything), so that a missing reason or fix is not read as ruled out."""

    status: SolverStatus
    reasons: list[InfeasibilityReason]
    fixes: SmallestFixes = Field(default_factory=SmallestFixes)
    not_checked: list[ExplainCheck] | None = None

    @model_serializer(mode="wrap")
    def _omit_absent_not_checked(self, handler: SerializerFunctionWrapHandler) -> JsonObject:
        return _without_absent(handler(self), ("not_checked",))

    def not_checked_lines(self) -> list[str]:
        """What the explanation did not get to, in words."""
        lines = []
        for check in self.not_checked or []:
            if check is ExplainCheck.MEMORY_TOTALS:
                lines.append("memory totals over all ranks were not checked within time_limit_s")
            elif check is ExplainCheck.LARGER_WORLD_SIZES:
                tried = self.fixes.min_world_size_searched_up_to
                above = f" above {tried}" if tried is not None else ""
                lines.append(f"world sizes{above} were not tried within time_limit_s")
            else:
                lines.append("allowing fused_uvm_caching was not tried within time_limit_s")
        return lines

    def render(self) -> str:
        title = (
            "no plan exists"
            if self.status is SolverStatus.INFEASIBLE
            else "no plan found within the time limit"
        )
        lines = [f"{title}:"]
        lines += [f"  - {reason.message}" for reason in self.reasons]
        fixes = self.fixes
        if fixes.min_world_size is not None:
            lines.append(f"  fix: world_size {fixes.min_world_size} (same devices) fits")
        elif fixes.min_world_size_searched_up_to is not None and not self._cut(
            ExplainCheck.LARGER_WORLD_SIZES
        ):
            lines.append(f"  no world size up to {fixes.min_world_size_searched_up_to} fits either")
        if fixes.tables_fit_with_uvm_caching:
            verdict = (
                "and then the whole model fits"
                if fixes.uvm_caching_makes_it_fit
                else ("(not enough on its own)")
            )
            lines.append(
                "  fix: allow fused_uvm_caching for "
                f"{', '.join(fixes.tables_fit_with_uvm_caching)} {verdict}"
            )
        lines += [f"  {line}" for line in self.not_checked_lines()]
        return "\n".join(lines)

    def _cut(self, check: ExplainCheck) -> bool:
        return check in (self.not_checked or [])


class Violation(_Value):
    """One way a plan breaks its request, naming the table, the rank and the numbers."""

    code: ViolationCode
    message: str
    table: str | None = None
    rank: int | None = None
