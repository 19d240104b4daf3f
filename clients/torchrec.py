"""TorchRec interop, both ways: a plan request from TorchRec's own configs, and a TorchRec
``ShardingPlan`` from a shardplan plan (docs/from-torchrec.md).

``from_torchrec`` reads TorchRec's objects by attribute and imports neither torch nor
torchrec, so a request can be built wherever the model's configs can, and it refuses, naming
the setting, what the request cannot say (a plan made without it would be priced or placed
differently from what TorchRec would do). ``to_torchrec_plan`` needs TorchRec, and imports it
only when called.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from planner_service.plan.codec import parse_plan, parse_request, request_hash
from planner_service.plan.errors import FieldProblem, InputError, problems_from_validation_error
from planner_service.plan.types import (
    DEFAULT_BATCH_SIZE,
    ComputeDevice,
    ComputeKernel,
    DataType,
    OptimizerType,
    PlanOptions,
    PlanRequest,
    ShardingPlan,
    ShardingType,
)

__all__ = ["from_torchrec", "to_torchrec_plan"]

SOURCE = "from_torchrec"
MS_PER_S = 1000  # TorchRec's bandwidths are bytes per ms, ours bytes per s
# TorchRec 1.8's defaults for what our cost models hold constant (planner/constants.py).
FIXED_TOPOLOGY_SETTINGS = {
    "bwd_compute_multiplier": 2.0,
    "weighted_feature_bwd_compute_multiplier": 1.0,
    "uneven_sharding_perf_multiplier": 1.0,
}
BANDWIDTHS = {  # TorchRec's Topology attribute -> our topology field
    "hbm_mem_bw": "hbm_bw_bytes_per_s",
    "ddr_mem_bw": "ddr_bw_bytes_per_s",
    "hbm_to_ddr_mem_bw": "hbm_to_ddr_bw_bytes_per_s",
    "intra_host_bw": "intra_host_bw_bytes_per_s",
    "inter_host_bw": "inter_host_bw_bytes_per_s",
}
# fbgemm's EmbOptimType values -> the optimizer whose state the planner counts.
OPTIMIZERS = {
    "sgd": OptimizerType.SGD,
    "exact_sgd": OptimizerType.SGD,
    "row_wise_adagrad": OptimizerType.ROWWISE_ADAGRAD,
    "exact_row_wise_adagrad": OptimizerType.ROWWISE_ADAGRAD,
    "rowwise_adagrad": OptimizerType.ROWWISE_ADAGRAD,
    "adagrad": OptimizerType.ADAGRAD,
    "exact_adagrad": OptimizerType.ADAGRAD,
    "adam": OptimizerType.ADAM,
}
TORCHREC_POOLED = ("sum", "mean")
# What TorchRec's EmbeddingCollection runs: a request made for TorchRec plans its sequence
# tables within these (the planner also offers table-row-wise and table-column-wise, which
# only shardplan's runtime runs for them).
TORCHREC_SEQUENCE_SHARDING_TYPES = ("data_parallel", "table_wise", "column_wise", "row_wise")


# --------------------------------------------------------------------------- from TorchRec


@dataclass
class _Problems:
    """Everything that cannot be carried over, collected so that one error lists it all."""

    found: list[FieldProblem] = field(default_factory=list)

    def add(self, path: str, message: str, value: Any) -> None:
        self.found.append(FieldProblem(path, message, value))

    def raise_any(self) -> None:
        if self.found:
            raise InputError(SOURCE, self.found)


@dataclass(frozen=True)
class _Source:
    """One table config and what its module says about it."""

    config: Any
    pooled: bool
    is_weighted: bool | None  # the EmbeddingBagCollection's flag; None: no module said


def from_torchrec(
    tables: Any,
    constraints: Mapping[str, Any] | None = None,
    topology: Any = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    *,
    fused_params: Mapping[str, Any] | None = None,
    options: PlanOptions | None = None,
) -> PlanRequest:
    """A plan request from what TorchRec's ``EmbeddingShardingPlanner`` is given.

    ``tables``: ``EmbeddingBagConfig`` (pooled) and ``EmbeddingConfig`` (sequence, pooling
    none) objects, or the ``EmbeddingBagCollection``/``EmbeddingCollection`` modules that hold
    them (a collection's ``is_weighted()`` applies to its tables), or a list of any of these.
    ``constraints``: TorchRec's ``ParameterConstraints`` by table name. ``topology``: TorchRec's
    ``Topology``; None, as in TorchRec's planner, describes the running process group
    (``torch.distributed`` initialised; ranks per host from ``LOCAL_WORLD_SIZE``).
    ``batch_size`` is per rank, as in TorchRec. ``fused_params`` (the sharder's) give the
    optimizer whose state is counted and the default ``cache_load_factor``. ``options``: how to
    solve, e.g. ``PlanOptions(cost_model="torchrec-1.8")`` to price shards as TorchRec does.

    Raises ``InputError`` listing every setting that cannot be carried over, and why.
    """
    problems = _Problems()
    sources = _sources(tables, problems)
    constraints = dict(constraints or {})
    _check_constraint_names(constraints, sources, problems)
    topology_json = _topology(topology, problems)
    defaults = _fused_defaults(fused_params or {}, problems)
    device = topology_json.get("compute_device")
    tables_json, limits = [], {}
    for source in sources:
        name = _name(source.config)
        table = _table(source, constraints.get(name), batch_size, problems) | defaults.table
        tables_json.append(table)
        limit = defaults.constraint | _constraint(
            name, constraints.get(name), device, table, problems
        )
        if not source.pooled:
            limit.setdefault("sharding_types", list(TORCHREC_SEQUENCE_SHARDING_TYPES))
        if limit:
            limits[name] = limit
    problems.raise_any()
    document = {
        "topology": topology_json,
        "tables": tables_json,
        "constraints": {"tables": limits},
        "batch_size": batch_size,
        "options": (options or PlanOptions()).model_dump(mode="json"),
    }
    try:
        return PlanRequest.model_validate(document)
    except ValidationError as error:
        raise InputError(SOURCE, problems_from_validation_error(error, PlanRequest)) from None


def _check_constraint_names(
    constraints: Mapping[str, Any], sources: list[_Source], problems: _Problems
) -> None:
    names = {_name(source.config) for source in sources}
    for name in constraints:
        if name not in names:
            problems.add(
                f"constraints[{name!r}]",
                "names no table given; the tables are " + ", ".join(sorted(names)),
                name,
            )


def _sources(tables: Any, problems: _Problems) -> list[_Source]:
    """The table configs of ``tables``: configs, collections, or a list of either."""
    items = [tables] if _is_config(tables) or _is_collection(tables) else tables
    if isinstance(items, str | bytes) or not isinstance(items, Iterable):
        problems.add(
            "tables",
            "is not a TorchRec config, collection or list of them; pass EmbeddingBagConfig or "
            "EmbeddingConfig objects, or the EmbeddingBagCollection/EmbeddingCollection",
            type(tables).__name__,
        )
        problems.raise_any()
    sources: list[_Source] = []
    for i, item in enumerate(items):
        if _is_config(item):
            sources.append(
                _Source(item, hasattr(item, "pooling"), getattr(item, "is_weighted", None))
            )
        elif hasattr(item, "embedding_bag_configs"):
            weighted = bool(item.is_weighted()) if hasattr(item, "is_weighted") else None
            sources += [_Source(c, True, weighted) for c in item.embedding_bag_configs()]
        elif hasattr(item, "embedding_configs"):
            sources += [_Source(c, False, None) for c in item.embedding_configs()]
        else:
            problems.add(
                f"tables[{i}]",
                "is neither a table config (EmbeddingBagConfig, EmbeddingConfig) nor a "
                "collection of them (EmbeddingBagCollection, EmbeddingCollection)",
                type(item).__name__,
            )
    return sources


def _is_config(item: Any) -> bool:
    return hasattr(item, "num_embeddings") and hasattr(item, "embedding_dim")


def _is_collection(item: Any) -> bool:
    return hasattr(item, "embedding_bag_configs") or hasattr(item, "embedding_configs")


def _name(config: Any) -> str:
    return str(getattr(config, "name", ""))


def _value(item: Any) -> Any:
    """An enum's value (TorchRec passes enums and their string values interchangeably)."""
    return getattr(item, "value", item)


def _table(
    source: _Source, constraint: Any, batch_size: int, problems: _Problems
) -> dict[str, Any]:
    config = source.config
    name = _name(config)
    at = f"tables[{name!r}]"
    features = list(getattr(config, "feature_names", None) or [name])
    table: dict[str, Any] = {
        "name": name,
        "num_embeddings": config.num_embeddings,
        "embedding_dim": config.embedding_dim,
        "feature_names": features,
        "pooling": _pooling(source, at, problems),
        "data_type": _data_type(getattr(config, "data_type", "FP32"), f"{at}.data_type", problems),
    }
    if getattr(config, "use_virtual_table", False):
        problems.add(
            f"{at}.use_virtual_table",
            "virtual tables (key-value kernels, ids beyond num_embeddings) have no "
            "counterpart in a plan; plan this table without it",
            True,
        )
    weighted = source.is_weighted
    if weighted is None:
        weighted = bool(getattr(constraint, "is_weighted", False))
    if weighted:
        table["is_weighted"] = True
    if constraint is not None:
        table.update(_load(name, constraint, features, batch_size, problems))
    return table


def _pooling(source: _Source, at: str, problems: _Problems) -> str:
    if not source.pooled:
        return "none"
    pooling = str(_value(getattr(source.config, "pooling", "SUM"))).lower()
    if pooling not in TORCHREC_POOLED:
        problems.add(
            f"{at}.pooling",
            "an EmbeddingBagConfig pools its bags; accepted: SUM, MEAN (a sequence table is "
            "an EmbeddingConfig)",
            pooling.upper(),
        )
    return pooling


def _data_type(data_type: Any, at: str, problems: _Problems) -> str:
    name = str(_value(data_type)).lower()
    if name not in {member.value for member in DataType}:
        accepted = ", ".join(t.upper() for t in DataType)
        problems.add(at, f"has no counterpart here; accepted: {accepted}", name.upper())
    return name


def _load(
    name: str, constraint: Any, features: list[str], batch_size: int, problems: _Problems
) -> dict[str, Any]:
    """Per-feature pooling factors and batch sizes from TorchRec's ``pooling_factors``,
    ``num_poolings`` and ``batch_sizes``: a feature pooled ``n`` times per sample of a batch
    of ``b`` makes ``n * b`` bags, which is what our ``batch_sizes`` count."""
    at = f"constraints[{name!r}]"
    num_features = len(features)
    factors = [float(f) for f in getattr(constraint, "pooling_factors", None) or [1.0]]
    poolings = getattr(constraint, "num_poolings", None)
    batches = getattr(constraint, "batch_sizes", None)
    if factors == [1.0] and poolings is None and batches is None and num_features > 1:
        return {}  # TorchRec's default: 1.0 per feature here (docs/from-torchrec.md)
    given = {"pooling_factors": factors, "num_poolings": poolings, "batch_sizes": batches}
    for attribute, values in given.items():
        if values is not None and len(values) != num_features:
            problems.add(
                f"{at}.{attribute}",
                f"has {len(values)} entries for a table of {num_features} features "
                f"{features}; give one per feature, in feature_names order",
                list(values),
            )
            return {}
    load: dict[str, Any] = {"pooling_factors": factors}
    if poolings is None and batches is None:
        return load
    poolings = [float(n) for n in poolings or [1.0] * num_features]
    batches = list(batches or [batch_size] * num_features)
    bags = [n * b for n, b in zip(poolings, batches, strict=True)]
    for i, count in enumerate(bags):
        if not count.is_integer():
            problems.add(
                f"{at}.num_poolings[{i}]",
                f"times batch size {batches[i]} makes {count:g} bags per iteration; shardplan "
                "counts whole bags (batch_sizes), so make the product a whole number",
                poolings[i],
            )
    load["batch_sizes"] = [int(count) for count in bags]
    return load


def _constraint(
    name: str,
    constraint: Any,
    device: str | None,
    table: dict[str, Any],
    problems: _Problems,
) -> dict[str, Any]:
    """Our per-table constraint from TorchRec's ``ParameterConstraints``; the settings that
    only tune the kernel at run time (stochastic rounding, bounds checks, enforce_hbm, the
    cache's algorithm, reserved memory and precision) do not change a plan and are dropped."""
    if constraint is None:
        return {}
    at = f"constraints[{name!r}]"
    limits: dict[str, Any] = {}
    for attribute, kind in (("sharding_types", ShardingType), ("compute_kernels", ComputeKernel)):
        chosen = getattr(constraint, attribute, None)
        if chosen:
            limits[attribute] = _allowed(chosen, kind, f"{at}.{attribute}", problems)
    min_partition = getattr(constraint, "min_partition", None)
    if min_partition is not None:
        limits["min_partition"] = min_partition
    cache = getattr(constraint, "cache_params", None)
    if cache is not None:
        limits.update(_cache(cache, f"{at}.cache_params", problems))
    _refuse_unplannable(constraint, at, device, table, problems)
    return limits


def _allowed(
    chosen: Iterable[Any],
    kind: type[ShardingType] | type[ComputeKernel],
    at: str,
    problems: _Problems,
) -> list[str]:
    values = [str(_value(item)) for item in chosen]
    accepted = {member.value for member in kind}
    for value in values:
        if value not in accepted:
            problems.add(
                at,
                "has no counterpart in a shardplan plan; accepted: " + ", ".join(sorted(accepted)),
                value,
            )
    return [value for value in values if value in accepted]


def _cache(cache: Any, at: str, problems: _Problems) -> dict[str, Any]:
    if getattr(cache, "prefetch_pipeline", None):
        problems.add(
            f"{at}.prefetch_pipeline",
            "prefetch pipelining changes TorchRec's prices and is not modelled; leave it unset "
            "for planning",
            True,
        )
    if getattr(cache, "stats", None) is not None:
        problems.add(
            f"{at}.stats",
            "measured cache statistics price prefetching in TorchRec and are not modelled; "
            "leave them unset for planning",
            type(cache.stats).__name__,
        )
    load_factor = getattr(cache, "load_factor", None)
    return {} if load_factor is None else {"cache_load_factor": float(load_factor)}


def _refuse_unplannable(
    constraint: Any, at: str, device: str | None, table: dict[str, Any], problems: _Problems
) -> None:
    features = getattr(constraint, "feature_names", None)
    if features is not None and list(features) != table["feature_names"]:
        problems.add(
            f"{at}.feature_names",
            f"differs from the table's feature_names {table['feature_names']}; leave it unset "
            "or equal",
            list(features),
        )
    output = getattr(constraint, "output_dtype", None)
    if output is not None and str(_value(output)).lower() != table["data_type"]:
        problems.add(
            f"{at}.output_dtype",
            f"differs from the table's data type {table['data_type'].upper()}; outputs are "
            "priced in the table's type, so leave it unset or equal",
            str(_value(output)),
        )
    group = getattr(constraint, "device_group", None)
    if group is not None and group != device:
        problems.add(
            f"{at}.device_group",
            f"is not the topology's compute_device {device!r}; TorchRec plans such tables "
            "separately, so put them in a request of their own",
            group,
        )
    if getattr(constraint, "key_value_params", None) is not None:
        problems.add(
            f"{at}.key_value_params",
            "key-value (SSD) kernels have no counterpart in a shardplan plan; leave it unset",
            type(constraint.key_value_params).__name__,
        )


@dataclass(frozen=True)
class _FusedDefaults:
    """What a sharder's ``fused_params`` give every table and its constraint."""

    table: dict[str, Any] = field(default_factory=dict)
    constraint: dict[str, Any] = field(default_factory=dict)


def _fused_defaults(fused_params: Mapping[str, Any], problems: _Problems) -> _FusedDefaults:
    """The optimizer (whose state our cost model counts) and the default cache load factor;
    the rest of ``fused_params`` tunes the kernel."""
    defaults = _FusedDefaults()
    optimizer = fused_params.get("optimizer")
    if optimizer is not None:
        name = str(_value(optimizer)).lower()
        if name in OPTIMIZERS:
            defaults.table["optimizer"] = OPTIMIZERS[name].value
        else:
            problems.add(
                "fused_params['optimizer']",
                "has no counterpart here; accepted: " + ", ".join(sorted(OPTIMIZERS)),
                name,
            )
    if fused_params.get("cache_load_factor") is not None:
        defaults.constraint["cache_load_factor"] = float(fused_params["cache_load_factor"])
    if fused_params.get("prefetch_pipeline"):
        problems.add(
            "fused_params['prefetch_pipeline']",
            "prefetch pipelining changes TorchRec's prices and is not modelled; leave it unset "
            "for planning",
            True,
        )
    return defaults


def _topology(topology: Any, problems: _Problems) -> dict[str, Any]:
    if topology is None:
        return _running_topology()
    device = str(_value(getattr(topology, "compute_device", "cuda")))
    world = topology.world_size
    local = getattr(topology, "local_world_size", None) or world
    result: dict[str, Any] = {"world_size": world, "local_world_size": local}
    result["compute_device"] = device
    if device not in {member.value for member in ComputeDevice}:
        problems.add(
            "topology.compute_device",
            "has no counterpart here; accepted: " + ", ".join(ComputeDevice),
            device,
        )
    group = getattr(topology, "intra_group_size", local)
    if group != local:
        problems.add(
            "topology.pod_size",
            f"groups {group} ranks for table_row_wise where a host has {local}; shardplan "
            "groups by host, so leave pod_size unset",
            group // local,
        )
    for attribute, default in FIXED_TOPOLOGY_SETTINGS.items():
        value = getattr(topology, attribute, default)
        if value != default:
            problems.add(
                f"topology.{attribute}",
                f"shardplan's cost models use TorchRec's default {default:g}; leave it unset",
                value,
            )
    comms = getattr(topology, "comms_bandwidths", None)
    if comms is not None and type(comms).__name__ != "BasicCommsBandwidths":
        problems.add(
            "topology.generalized_comms_bandwidths",
            "custom collective bandwidths are not modelled; give intra_host_bw and "
            "inter_host_bw instead",
            type(comms).__name__,
        )
    for attribute, ours in BANDWIDTHS.items():
        value = getattr(topology, attribute, None)
        if value is not None:
            result[ours] = float(value) * MS_PER_S
    result.update(_capacities(getattr(topology, "devices", None) or []))
    return result


def _capacities(devices: list[Any]) -> dict[str, Any]:
    """Per-rank HBM and DDR: the most common as the topology's, the others as overrides."""
    if not devices:
        return {}
    capacities = [(int(d.storage.hbm), int(d.storage.ddr)) for d in devices]
    hbm, ddr = Counter(capacities).most_common(1)[0][0]
    overrides = []
    for rank, (rank_hbm, rank_ddr) in enumerate(capacities):
        override: dict[str, Any] = {"rank": rank}
        if rank_hbm != hbm:
            override["hbm_bytes"] = rank_hbm
        if rank_ddr != ddr:
            override["ddr_bytes"] = rank_ddr
        if len(override) > 1:
            overrides.append(override)
    result: dict[str, Any] = {"hbm_bytes": hbm, "ddr_bytes": ddr}
    if overrides:
        result["rank_overrides"] = overrides
    return result


def _running_topology() -> dict[str, Any]:
    """TorchRec's planner without a topology plans for the running process group. torch is
    not imported here: if it is not loaded, no process group is running."""
    torch = sys.modules.get("torch")
    distributed: Any = getattr(torch, "distributed", None)
    if distributed is None or not (distributed.is_available() and distributed.is_initialized()):
        raise InputError(
            SOURCE,
            [
                FieldProblem(
                    "topology",
                    "is needed when no torch.distributed process group is running; pass "
                    "TorchRec's Topology(world_size=..., compute_device=..., local_world_size=...)",
                )
            ],
        )
    world = distributed.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    device = "cuda" if torch.cuda.is_available() else "cpu"  # type: ignore[union-attr]
    return {"world_size": world, "local_world_size": local, "compute_device": device}


# --------------------------------------------------------------------------- to TorchRec


def to_torchrec_plan(
    plan: ShardingPlan | bytes | str,
    topology: Any = None,
    *,
    module_path: str | Mapping[str, str] = "",
    request: PlanRequest | bytes | str | None = None,
) -> Any:
    """TorchRec's ``ShardingPlan`` for ``plan`` (a plan, or its JSON as fetched), to pass to
    ``DistributedModelParallel(..., plan=...)``.

    TorchRec places every shard on a device (``rank:3/cuda:1``, ``rank:3/cpu``), and a plan
    does not record the compute device its request named: ``topology`` (TorchRec's or ours,
    e.g. ``request.topology``) or ``request`` (the ``PlanRequest`` the plan was made from, or
    its JSON; refused unless its hash is the plan's ``request_hash``) gives the device and
    the ranks per host. Without either it raises ``InputError`` saying what to pass, before
    TorchRec is imported. TorchRec keys plans by module: ``module_path`` is the fully
    qualified name of the collection holding the tables ("" when it is the model passed to
    DistributedModelParallel), or a mapping from table name to module path when the tables
    live in several collections.
    """
    if isinstance(plan, bytes | str):
        plan = parse_plan(plan)
    device, local = _placement_device(plan, _given_topology(plan, topology, request))
    paths = _module_paths(plan, module_path)

    from torchrec.distributed.types import (
        CacheParams,
        EmbeddingModuleShardingPlan,
        EnumerableShardingSpec,
        ParameterSharding,
        ShardMetadata,
    )
    from torchrec.distributed.types import ShardingPlan as TorchRecShardingPlan

    modules: dict[str, Any] = {}
    for name, sharding in plan.tables.items():
        spec = None
        if sharding.sharding_type is not ShardingType.DATA_PARALLEL:
            spec = EnumerableShardingSpec(
                [
                    ShardMetadata(
                        shard_offsets=list(shard.offsets),
                        shard_sizes=list(shard.sizes),
                        placement=_placement(device, shard.rank, local),
                    )
                    for shard in sharding.shards
                ]
            )
        cache = sharding.cache_load_factor
        module = modules.setdefault(paths[name], EmbeddingModuleShardingPlan())
        module[name] = ParameterSharding(
            sharding_type=sharding.sharding_type.value,
            compute_kernel=sharding.compute_kernel.value,
            ranks=list(sharding.ranks),
            sharding_spec=spec,
            cache_params=None if cache is None else CacheParams(load_factor=cache),
        )
    return TorchRecShardingPlan(modules)


def _export_error(path: str, message: str, value: Any = None) -> InputError:
    problem = FieldProblem(path, message) if value is None else FieldProblem(path, message, value)
    return InputError("to_torchrec_plan", [problem])


def _given_topology(
    plan: ShardingPlan, topology: Any, request: PlanRequest | bytes | str | None
) -> Any:
    """The topology to place shards by: ``topology``, or the request's once it is known to
    be the plan's. A plan alone does not say its device, so one of them is needed."""
    if request is None:
        if topology is None:
            raise _export_error(
                "topology",
                "is needed: a plan does not record the compute device its request named, and "
                "TorchRec places every shard on it; pass the request the plan was made from "
                "(request=...), its topology (topology=request.topology), or TorchRec's "
                f"Topology(world_size={plan.world_size}, compute_device='cpu' or 'cuda', "
                "local_world_size=ranks per host)",
            )
        return topology
    if topology is not None:
        raise _export_error(
            "request", "is given with a topology; pass one of them (the request's topology)"
        )
    given = parse_request(request) if isinstance(request, bytes | str) else request
    if request_hash(given) != plan.request_hash:
        raise _export_error(
            "request",
            "is not the request the plan was made from (the plan's request_hash is "
            f"{plan.request_hash}); pass that request, or the topology the plan was made for",
            request_hash(given),
        )
    return given.topology


def _placement_device(plan: ShardingPlan, topology: Any) -> tuple[str, int]:
    world = topology.world_size
    if world != plan.world_size:
        raise _export_error(
            "topology.world_size",
            f"differs from the plan's world_size {plan.world_size}; pass the topology the plan "
            "was made for",
            world,
        )
    device = str(_value(getattr(topology, "compute_device", "cuda")))
    return device, getattr(topology, "local_world_size", None) or world


def _placement(device: str, rank: int, local_world_size: int) -> str:
    """TorchRec's shard placement: ``rank:{r}/cpu`` or ``rank:{r}/cuda:{local rank}``."""
    if device == ComputeDevice.CPU:
        return f"rank:{rank}/cpu"
    return f"rank:{rank}/{device}:{rank % local_world_size}"


def _module_paths(plan: ShardingPlan, module_path: str | Mapping[str, str]) -> dict[str, str]:
    if isinstance(module_path, str):
        return dict.fromkeys(plan.tables, module_path)
    missing = [name for name in plan.tables if name not in module_path]
    if missing:
        raise _export_error(
            "module_path",
            "has no module for tables " + ", ".join(map(repr, missing)) + "; map every table "
            "of the plan to the path of the collection holding it",
            sorted(module_path)[:10],
        )
    return {name: module_path[name] for name in plan.tables}
