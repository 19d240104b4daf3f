"""The last stage: whole training steps of plans, measured by ``runtime.measure`` at a world
size, against what the profile's other stages predict for them.

A step is more than its kernels and collectives timed alone: a kernel finds its rows colder
or warmer than in a microbenchmark, two ranks share cores with gloo's threads, the
runtime's exchanges of row-wise and data-parallel tables do more than their collectives,
and ranks wait for each other at every exchange. So this stage runs diverse plans of a
synthetic model (every table table-wise, row-wise, table-row-wise, column-wise,
data-parallel for the small ones, random mixes) and fits each part of the step on what the
profile predicts for it, by non-negative least squares:

    lookups (forward and backward)  = own + compute_scale · the rank's kernels     each rank
    input distribution              = own + input_scale · its ids' all-to-all      each plan
    output exchange (both ways)     = own + comms_scale · its outputs' exchange    each plan
                                      + a fixed cost for each of row-wise,
                                        table-row-wise and data-parallel it uses

A rank's lookups wait for nobody, so they are fit rank by rank. The exchanges hold every
rank until the last one arrives, so a rank's measured exchange is its own cost plus however
long it waited; the rank that waited least (the plan's smallest measurement of the part)
is the one that arrived last, and its time is the exchange's own, fit against the plan's
largest predicted part (a collective ends when its largest transfer does). Each scale is
pulled towards 1 by a prior and kept within ``SCALE_RANGE``: the microbenchmarks' relative
costs stand, the steps set their level. The own times, with what is left of a rank's step
(the loss, the hand-over between parts), less the collectives' latencies the profile already
charges, become ``runtime.step_ms``; the fixed costs ``runtime.sharding_type_ms``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from planner_service.costs.calibrated import fixed_perf
from planner_service.plan.codec import parse_request, seal_plan_data
from planner_service.plan.compact import compact_sharding
from planner_service.plan.json_data import JsonObject
from planner_service.plan.shards import column_wise_shards, row_wise_shards
from planner_service.plan.types import (
    MAX_FIXED_MS,
    PERF_FIELDS,
    ComputeDevice,
    DeviceProfile,
    ParameterSharding,
    PlanRequest,
    RuntimeCoefficients,
    Shard,
    ShardingPlan,
    ShardingType,
    SolverReport,
    SolverStatus,
)
from planner_service.validate.usage import rank_usage
from runtime.calibrate.fit import fit_linear, quality_of
from runtime.calibrate.timing import Budget
from runtime.measure import MeasureReport

TABLES = (  # rows, dim, pooling factor, weighted: small to large, narrow to wide
    (1_000, 16, 2.0, False),
    (5_000, 32, 8.0, False),
    (20_000, 64, 4.0, True),
    (100_000, 64, 16.0, False),
    (400_000, 128, 24.0, False),
    (2_000, 128, 1.0, False),
    (50_000, 16, 32.0, False),
    (10_000, 32, 40.0, True),
    (200_000, 32, 8.0, False),
)
BATCH_SIZE = 512
SMALL_ROWS = 20_000  # data-parallel candidates
MIXES = 6
# The sharding types whose exchanges do more than the whole-column all-to-all every plan
# runs: row blocks' reduce-scatter (and all-gather back), data-parallel replicas' global
# batch and gradient columns. Only these get a fixed cost fitted: with every plan using
# several types, a cost for each would be confounded.
OWN_EXCHANGES = frozenset(
    {ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE, ShardingType.DATA_PARALLEL}
)
PRIOR_WEIGHT = 0.3  # of one measurement: a pseudo-measurement pulling the scale to 1
SCALE_RANGE = (0.5, 2.0)  # the steps' scale of the microbenchmarked parts, at most
MIN_PLANS = 5  # plans measured for a fit of the steps; fewer, and the stage fits nothing
ROUNDS = 10  # times each plan is measured at most, while time is left
# A plan's share of a run measuring several side by side before one was timed (spawning
# the ranks, sharding, its steps); then the slowest share measured.
PLAN_ESTIMATE_S = 3.0
COMPUTE = ("fwd_compute", "bwd_compute")
COMMS = ("fwd_comms", "bwd_comms")


@dataclass(frozen=True)
class RankPart:
    """One rank of one measured plan (``plan``: the plan's index): what the profile
    predicts for its parts (shards only), the sharding types the plan uses, and what each
    part measured (ms)."""

    plan: int
    compute_ms: float
    comms_ms: float
    input_ms: float
    kinds: frozenset[ShardingType]
    measured_compute_ms: float
    measured_comms_ms: float
    measured_input_ms: float
    measured_step_ms: float


def step_request(world: int, device: ComputeDevice, profile: DeviceProfile) -> PlanRequest:
    """The synthetic model on ``world`` ranks, priced by ``profile``."""
    tables = [
        {
            "name": f"t{i}",
            "num_embeddings": rows,
            "embedding_dim": dim,
            "pooling_factors": [pooling],
            "is_weighted": weighted,
        }
        for i, (rows, dim, pooling, weighted) in enumerate(TABLES)
    ]
    document = {
        "topology": {"world_size": world, "compute_device": device.value},
        "tables": tables,
        "batch_size": BATCH_SIZE,
        "options": {
            "cost_model": "calibrated",
            "device_profile": profile.model_dump(mode="json"),
        },
    }
    return parse_request(_json(document))


def _json(document: JsonObject) -> str:
    import json

    return json.dumps(document)


def step_plans(request: PlanRequest, seed: int) -> list[dict[str, JsonObject]]:
    """Diverse plans of the synthetic model, each as its tables' shardings."""
    world = request.topology.world_size
    local = request.topology.local_world_size or world
    names = [t.name for t in request.tables]
    rng = random.Random(seed)
    whole = {name: ("table_wise", i % world) for i, name in enumerate(names)}
    shapes = [
        whole,
        {name: ("row_wise", 0) for name in names},
        # row blocks within a host: its own exchange (a reduce-scatter in the host, then
        # across hosts), so its own fixed cost, which only whole steps can set
        {name: ("table_row_wise", i % world) for i, name in enumerate(names)},
        {name: ("column_wise", i) for i, name in enumerate(names)},
        {
            t.name: ("data_parallel", 0) if t.num_embeddings <= SMALL_ROWS else whole[t.name]
            for t in request.tables
        },
    ]
    kinds = ["table_wise", "row_wise", "table_row_wise", "column_wise", "data_parallel"]
    for _ in range(MIXES):
        shapes.append(
            {
                t.name: (
                    rng.choice(kinds if t.num_embeddings <= SMALL_ROWS else kinds[:4]),
                    rng.randrange(world),
                )
                for t in request.tables
            }
        )
    return [
        {
            t.name: _sharding(kind, rank, t.num_embeddings, t.embedding_dim, world, local)
            for t in request.tables
            for kind, rank in [shape[t.name]]
        }
        for shape in shapes
    ]


def _sharding(kind: str, rank: int, rows: int, dim: int, world: int, local: int) -> JsonObject:
    if kind == "row_wise":
        shards = row_wise_shards(rows, dim, list(range(world)))
    elif kind == "table_row_wise":
        host = rank // local
        shards = row_wise_shards(rows, dim, list(range(host * local, (host + 1) * local)))
    elif kind == "column_wise":
        half = dim // 2
        ranks = [rank % world, (rank + 1) % world]
        shards = column_wise_shards(rows, [half, dim - half], ranks)
    elif kind == "data_parallel":
        shards = [Shard(offsets=(0, 0), sizes=(rows, dim), rank=r) for r in range(world)]
    else:
        shards = [Shard(offsets=(0, 0), sizes=(rows, dim), rank=rank)]
    kernel = "dense" if kind == "data_parallel" else "fused"
    return {
        "sharding_type": kind,
        "compute_kernel": kernel,
        "ranks": [s.rank for s in shards],
        "shards": [s.model_dump(mode="json") for s in shards],
        "cache_load_factor": None,
    }


def sealed(request: PlanRequest, tables: dict[str, JsonObject]) -> ShardingPlan:
    """The plan of ``tables`` with the rank stats its request's model gives it."""
    shardings = {name: ParameterSharding.model_validate(data) for name, data in tables.items()}
    usage = rank_usage(request, shardings)
    stats = [
        {
            "rank": rank,
            "hbm_bytes": usage.of(rank).hbm_bytes,
            "ddr_bytes": usage.of(rank).ddr_bytes,
            "perf": dict(zip(PERF_FIELDS, usage.of(rank).perf, strict=True)),
        }
        for rank in range(request.topology.world_size)
    ]
    return seal_plan_data(
        request=request,
        planner_version="calibrate",
        # Written as runs (schema 2.0), as the planner writes them.
        tables={
            name: compact_sharding(sharding).model_dump(mode="json")
            for name, sharding in shardings.items()
        },
        rank_stats=stats,
        solver=SolverReport(
            status=SolverStatus.FEASIBLE,
            objective=usage.objective,
            lower_bound=0.0,
            gap=1.0,
            critical_path=usage.critical_path,
        ).model_dump(mode="json"),
    )


def predicted(request: PlanRequest, plan: ShardingPlan) -> list[tuple[float, float, float]]:
    """(compute, comms, input) ms the profile predicts for each rank's shards."""
    usage = rank_usage(request, plan.tables)
    index = {name: i for i, name in enumerate(PERF_FIELDS)}
    result = []
    for rank in range(request.topology.world_size):
        shards = usage.loads.get(rank)
        perf = shards.perf if shards is not None else [0.0] * len(PERF_FIELDS)
        result.append(
            (
                sum(perf[index[name]] for name in COMPUTE),
                sum(perf[index[name]] for name in COMMS),
                perf[index["input_dist"]],
            )
        )
    return result


def measure_steps(
    profile: DeviceProfile,
    world: int,
    deadline: float,
    budget: Budget,
    seed: int,
    measure: Callable[[PlanRequest, list[ShardingPlan]], list[MeasureReport]],
    on_plan: Callable[[int], None],
) -> list[RankPart]:
    """The plans measured side by side (``measure`` takes several: the same ranks take a
    step of each in turn, so the machine's drift from one second to the next slows them
    alike), every rank's parts. A round measures every plan, or as many as can end by
    ``deadline`` (judged by the slowest plan so far, ``PLAN_ESTIMATE_S`` before the first,
    the plans in their order: the first ones are the most diverse); ``fit_steps`` needs
    ``MIN_PLANS`` of them, so a short budget measures none. With time left, the plans are
    measured again, in another order, up to ``ROUNDS`` times in all: each measurement is
    a sample of its own (``RankPart.plan`` counts measurements)."""
    request = step_request(world, profile.compute_device, profile)
    plans = [sealed(request, tables) for tables in step_plans(request, seed)]
    predictions = [predicted(request, plan) for plan in plans]
    rng = random.Random(seed)
    samples: list[RankPart] = []
    per_plan_s = PLAN_ESTIMATE_S
    measured = 0
    for round_ in range(ROUNDS):
        order = list(range(len(plans)))
        if round_:
            rng.shuffle(order)
        chosen = order[: max(0, int((deadline - budget.now()) // per_plan_s))]
        if not chosen:
            return samples
        started = budget.now()
        reports = measure(request, [plans[i] for i in chosen])
        per_plan_s = max(per_plan_s if measured else 0.0, (budget.now() - started) / len(chosen))
        for i, report in zip(chosen, reports, strict=True):
            kinds = frozenset(t.sharding_type for t in plans[i].tables.values())
            for (compute, comms, inputs), rank in zip(predictions[i], report.ranks, strict=True):
                parts = rank.iqm
                samples.append(
                    RankPart(
                        measured,
                        compute,
                        comms,
                        inputs,
                        kinds,
                        parts.lookup_fwd_ms + parts.lookup_bwd_ms,
                        parts.output_dist_fwd_ms + parts.output_dist_bwd_ms,
                        parts.input_dist_ms,
                        parts.step_ms,
                    )
                )
            measured += 1
        on_plan(measured)
        if len(chosen) < len(plans):
            return samples
    return samples


def enough(samples: list[RankPart], world: int) -> bool:
    """Whether ``samples`` hold the ``MIN_PLANS`` plans a fit needs."""
    return len(samples) >= MIN_PLANS * world


def fit_steps(profile: DeviceProfile, world: int, samples: list[RankPart]) -> RuntimeCoefficients:
    """The runtime coefficients with each part's scale, the sharding types' fixed costs and
    the step's own time fitted (module docstring). What the profile's collectives already
    charge every step (their latencies) stays theirs: ``step_ms`` and ``sharding_type_ms``
    get the rest."""
    runtime = profile.runtime
    plans = _by_plan(samples)
    compute = _scaled_fit(
        "compute",
        np.array([s.compute_ms for s in samples]),
        np.array([s.measured_compute_ms for s in samples]),
        np.zeros((len(samples), 0)),
    )
    inputs = _scaled_fit(
        "input",
        np.array([max(s.input_ms for s in plan) for plan in plans]),
        np.array([min(s.measured_input_ms for s in plan) for plan in plans]),
        np.zeros((len(plans), 0)),
    )
    kinds = sorted(
        {k for s in samples for k in s.kinds if k in OWN_EXCHANGES}
        - {k for k in OWN_EXCHANGES if all(k in s.kinds for s in samples)}
    )
    comms = _scaled_fit(
        "comms",
        np.array([max(s.comms_ms for s in plan) for plan in plans]),
        np.array([min(s.measured_comms_ms for s in plan) for plan in plans]),
        np.array([[float(k in plan[0].kinds) for k in kinds] for plan in plans]).reshape(
            len(plans), len(kinds)
        ),
    )
    # the rest of a rank's step: the loss and its gradient, the hand-over between parts
    rest = float(
        np.median(
            [
                s.measured_step_ms
                - s.measured_compute_ms
                - s.measured_comms_ms
                - s.measured_input_ms
                for s in samples
            ]
        )
    )
    request = step_request(world, profile.compute_device, profile)
    base = fixed_perf(request, ()).total
    own = base - runtime.step_ms  # the collectives' latencies every step pays
    sharding_type_ms = dict(runtime.sharding_type_ms)
    for kind, ms in zip(kinds, comms.fixed, strict=True):
        latencies = (
            fixed_perf(request, (kind,)).total - base - runtime.sharding_type_ms.get(kind, 0.0)
        )
        sharding_type_ms[kind] = min(MAX_FIXED_MS, max(0.0, ms - latencies))
    intercept = compute.own + inputs.own + comms.own + max(0.0, rest)
    fitted = runtime.model_copy(
        update={
            "step_ms": min(MAX_FIXED_MS, max(0.0, intercept - own)),
            "sharding_type_ms": sharding_type_ms,
            "compute_scale": compute.scale,
            "comms_scale": comms.scale,
            "input_scale": inputs.scale,
        }
    )
    # quality on what a plan is judged by: its slowest rank's step
    predicted_steps = np.array([max(_step_ms(fitted, own, s) for s in plan) for plan in plans])
    measured_steps = np.array([max(s.measured_step_ms for s in plan) for plan in plans])
    return fitted.model_copy(update={"fit_steps": quality_of(predicted_steps, measured_steps)})


@dataclass(frozen=True)
class ScaledFit:
    """One part's fit: its own time, the scale of the profile's prediction, and the fixed
    cost of each indicator column (ms)."""

    own: float
    scale: float
    fixed: tuple[float, ...]


def _scaled_fit(
    part: str, predicted: np.ndarray, measured: np.ndarray, indicators: np.ndarray
) -> ScaledFit:
    """``measured ≈ own + scale · predicted + indicators · fixed``, non-negative, the scale
    pulled towards 1 by a pseudo-measurement worth ``PRIOR_WEIGHT`` of one and kept within
    ``SCALE_RANGE`` (the rest refit with it held at the bound): parts whose predictions vary
    little next to their noise can trade the scale for the own time without losing fit (0
    happened)."""
    ones = np.ones((len(predicted), 1))
    rows = np.hstack([ones, predicted[:, None], indicators])
    names = (
        f"{part}_own_ms",
        f"{part}_scale",
        *(f"{part}_fixed_{i}" for i in range(indicators.shape[1])),
    )
    mean = float(predicted.mean()) if len(predicted) else 0.0
    if mean <= 0.0:  # nothing of this part predicted: its time is the own time
        return ScaledFit(max(0.0, float(np.median(measured))), 1.0, (0.0,) * indicators.shape[1])
    prior = np.zeros((1, rows.shape[1]))
    prior[0, 1] = PRIOR_WEIGHT * mean
    reference = np.maximum(measured, 1e-9)
    fit = fit_linear(
        names,
        np.vstack([rows, prior]),
        np.concatenate([measured, [PRIOR_WEIGHT * mean]]),
        relative_to_ms=np.concatenate([reference, [float(reference.mean())]]),
    )
    own, scale, *fixed = fit.coefficients
    if not SCALE_RANGE[0] <= scale <= SCALE_RANGE[1]:
        scale = min(max(scale, SCALE_RANGE[0]), SCALE_RANGE[1])
        held = fit_linear(
            (names[0], *names[2:]),
            np.hstack([ones, indicators]),
            measured - scale * predicted,
            relative_to_ms=reference,
        )
        own, *fixed = held.coefficients
    return ScaledFit(float(own), float(scale), tuple(float(f) for f in fixed))


def _by_plan(samples: list[RankPart]) -> list[list[RankPart]]:
    plans: dict[int, list[RankPart]] = {}
    for sample in samples:
        plans.setdefault(sample.plan, []).append(sample)
    return list(plans.values())


def _step_ms(runtime: RuntimeCoefficients, own_ms: float, sample: RankPart) -> float:
    """The rank's step as the fitted coefficients price it."""
    kinds = sum(runtime.sharding_type_ms.get(k, 0.0) for k in sample.kinds)
    return (
        runtime.step_ms
        + own_ms
        + kinds
        + runtime.compute_scale * sample.compute_ms
        + runtime.comms_scale * sample.comms_ms
        + runtime.input_scale * sample.input_ms
    )
