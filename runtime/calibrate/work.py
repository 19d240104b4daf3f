"""The runtime stage: shardplan's sharded module (``shard_modules``) timed a whole step
(forward and backward with the fused optimizer) on a world of one rank, in this process, on
a few synthetic configurations, and what the kernels do not explain fit to the runtime's own
terms (``RuntimeCoefficients``).

For each configuration, a plan with every table table-wise (the base) and, for each other
sharding type, the same plan with one table of that type: the base plans fit ``step_ms``,
``input_us_per_id`` and ``output_ns_per_byte`` to the step time less the kernels' predicted
time (``costs.calibrated.shard_perf`` under the kernel coefficients just fit); each type's
``sharding_type_ms`` is the median over configurations of what its plan costs beyond that,
clamped at zero. On one rank every collective is the identity, so what the types cost here
is the runtime's own bookkeeping; their collectives' latencies are priced separately.

The pooled configurations never put sequence rows in batch order, which row-wise and
data-parallel sequence tables do on every rank that sent ids (a gather of the rows that
came back, and its gradient's gather backward): ``measure_placement`` times the runtime's
own ``place_chunks`` both ways on random permutations of rows of a few sizes (in chunks of
``PLACEMENT_UNITS`` columns), and ``fit_placement`` gives ``placement_ns_per_byte``.
"""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from planner_service.costs.calibrated import (
    NS_PER_MS,
    OUTPUT_ELEMENT_BYTES,
    US_PER_MS,
    shard_perf,
)
from planner_service.plan.types import (
    MAX_FIXED_MS,
    MAX_NS_PER_BYTE,
    MAX_US_PER_ID,
    ComputeDevice,
    ComputeKernel,
    DeviceProfile,
    FitQuality,
    KernelCoefficients,
    MachineInfo,
    RuntimeCoefficients,
    ShardingType,
    Topology,
)
from runtime import plan as plans
from runtime.calibrate.fit import fit_linear, in_profile_units, quality_of
from runtime.calibrate.timing import Budget, median_ms, median_pair_ms
from runtime.modules import EmbeddingBagCollection, EmbeddingBagConfig
from runtime.plan import TableSharder
from runtime.sharding.module import shard_modules
from runtime.sharding.sequence import place_chunks
from runtime.sparse import KeyedJaggedTensor

TABLE_COUNTS = (2, 8)
DIMS = (16, 64)
BATCH_SIZES = (512, 2048)
POOLING_FACTORS = (2, 16)
ROWS = 10_000
ROUNDS = 3
MIN_CONFIGS = 4  # base plans: three terms and a residual
TERMS = ("step_ms", "input_us_per_id", "output_ns_per_byte")
TERM_SCALES = (1.0, US_PER_MS, NS_PER_MS)
TERM_BOUNDS = (MAX_FIXED_MS, MAX_US_PER_ID, MAX_NS_PER_BYTE)
LEARNING_RATE = 0.01
# Placement: rows of these many bytes (one way), cut in chunks of these many fp32 columns.
# The runtime's chunk is the widest that divides every placed width (16 for widths of 16,
# 32 and 64); the gather's cost goes with its chunks more than its bytes (at 16 MB a chunk
# of 64 columns cost a third of four of 16 here), so a chunk of 16 prices tables of mixed
# widths as they run and overprices tables of one wide width. Per byte, a gather costs more
# the more it spans (here 0.13 ns at 1 to 2 MB, 0.3 to 0.45 at 4 to 16 MB, 0.95 at 32 MB):
# the sizes are those of what a rank's sequence tables place in a step of the workloads
# measured here, and the coefficient is the median over them, robust to a slow repetition.
PLACEMENT_BYTES = (4 << 20, 8 << 20, 16 << 20)
PLACEMENT_UNITS = (16,)
# The plan that swaps table 0 to each type, on one rank (column types: two column shards).
VARIANTS: dict[ShardingType, Callable[[], TableSharder]] = {
    ShardingType.ROW_WISE: plans.row_wise,
    ShardingType.COLUMN_WISE: lambda: plans.column_wise([0, 0]),
    ShardingType.TABLE_ROW_WISE: lambda: plans.table_row_wise(0),
    ShardingType.TABLE_COLUMN_WISE: lambda: plans.table_column_wise(0, [0, 0]),
    ShardingType.DATA_PARALLEL: plans.data_parallel,
}


@dataclass(frozen=True)
class WorkConfig:
    tables: int
    dim: int
    batch: int
    pooling: int

    def table_configs(self) -> list[EmbeddingBagConfig]:
        return [
            EmbeddingBagConfig(f"t{i}", ROWS, self.dim, feature_names=[f"f{i}"])
            for i in range(self.tables)
        ]


@dataclass(frozen=True)
class WorkSample:
    config: WorkConfig
    variant: ShardingType  # TABLE_WISE: the base plan
    step_ms: float


def configs(seed: int) -> list[WorkConfig]:
    grid = [
        WorkConfig(*values)
        for values in itertools.product(TABLE_COUNTS, DIMS, BATCH_SIZES, POOLING_FACTORS)
    ]
    random.Random(seed).shuffle(grid)
    return grid


def batch_of(config: WorkConfig, generator: torch.Generator) -> KeyedJaggedTensor:
    lengths = torch.full((config.tables * config.batch,), config.pooling, dtype=torch.int64)
    values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=generator)
    keys = [f"f{i}" for i in range(config.tables)]
    return KeyedJaggedTensor.from_lengths_sync(keys, values, lengths)


def sharders(config: WorkConfig, variant: ShardingType) -> dict[str, TableSharder]:
    per_table = {f"t{i}": plans.table_wise(0) for i in range(config.tables)}
    if variant is not ShardingType.TABLE_WISE:
        per_table["t0"] = VARIANTS[variant]()
    return per_table


def measure_step(
    config: WorkConfig, variant: ShardingType, batch: KeyedJaggedTensor, device: torch.device
) -> WorkSample:
    tables = config.table_configs()
    plan = plans.construct_module_plan(tables, sharders(config, variant), world_size=1)
    module = shard_modules(
        EmbeddingBagCollection(tables, device="meta"),
        plan=plan,
        device=device,
        fused_params={"optimizer": "sgd", "learning_rate": LEARNING_RATE},
    )
    features = batch.to(device) if device.type == "cuda" else batch

    def step() -> None:
        module(features).values().sum().backward()

    return WorkSample(config, variant, median_ms(step, device))


def measure_work(
    device: torch.device,
    deadline: float,
    budget: Budget,
    seed: int,
    on_config: Callable[[int], None],
) -> list[WorkSample]:
    """Every plan of each configuration until ``deadline`` (at least ``MIN_CONFIGS``), the
    configurations again while time is left, up to ``ROUNDS`` times."""
    generator = torch.Generator().manual_seed(seed)
    samples: list[WorkSample] = []
    rounds = itertools.chain.from_iterable(configs(seed + r) for r in range(ROUNDS))
    for done, config in enumerate(rounds):
        if done >= MIN_CONFIGS and budget.now() >= deadline:
            break
        batch = batch_of(config, generator)
        for variant in (ShardingType.TABLE_WISE, *VARIANTS):
            samples.append(measure_step(config, variant, batch, device))
        on_config(done + 1)
    return samples


def kernel_only_profile(fused: KernelCoefficients, device: ComputeDevice) -> DeviceProfile:
    """A profile with the kernels' coefficients and nothing else, to price a step's kernels
    with the planner's own formulas."""
    zero = FitQuality(
        samples=1, r2=1.0, rms_residual_ms=0.0, median_relative_error=0.0, max_relative_error=0.0
    )
    dense = fused.model_copy(update={"compute_kernel": ComputeKernel.DENSE})
    others = [k for k in ComputeKernel if k not in (ComputeKernel.FUSED, ComputeKernel.DENSE)]
    extra = [] if device is ComputeDevice.CPU else [_cuda_stand_in(fused, k) for k in others]
    return DeviceProfile(
        name="kernels-only",
        compute_device=device,
        machine=MachineInfo(cpu_count=1, threads_per_rank=1),
        kernels=[fused, dense, *extra],
        collectives=[],
        runtime=RuntimeCoefficients(
            step_ms=0.0, input_us_per_id=0.0, output_ns_per_byte=0.0, fit=zero
        ),
    )


def _cuda_stand_in(fused: KernelCoefficients, kernel: ComputeKernel) -> KernelCoefficients:
    rate = 0.0 if kernel is ComputeKernel.FUSED_UVM_CACHING else None
    return fused.model_copy(update={"compute_kernel": kernel, "cache_hit_rate": rate})


@dataclass(frozen=True)
class StepTerms:
    """What the kernels predict for a plan's step, and the runtime terms' features."""

    kernel_ms: float
    ids: float
    output_bytes: float  # stitched forward and backward


def step_terms(profile: DeviceProfile, sample: WorkSample) -> StepTerms:
    """The plan's shards on its one rank, priced by ``shard_perf`` (which on cpu includes
    each table's kernel calls; on cuda one kernel call: every table is fp32)."""
    config, kernel = sample.config, profile.kernels[0]
    topology = Topology(world_size=1, compute_device=profile.compute_device)
    cuda = profile.compute_device is ComputeDevice.CUDA
    kernel_ms = kernel.call_fwd_ms + kernel.call_bwd_ms if cuda else 0.0
    ids = output_bytes = 0.0
    for table in range(config.tables):
        kind = sample.variant if table == 0 else ShardingType.TABLE_WISE
        for cols in _shard_widths(kind, config.dim):
            perf = shard_perf(
                profile,
                topology=topology,
                sharding_type=kind,
                compute_kernel=_kernel_of(kind),
                cache_load_factor=None,
                table_rows=ROWS,
                rows=ROWS,
                cols=cols,
                batch_inputs=config.batch * config.pooling,
                batch_outputs=config.batch,
                pooled=True,
                weighted=False,
                element_bytes=4,
                state_bytes_per_row=0,
            )
            kernel_ms += perf.fwd_compute + perf.bwd_compute
            ids += config.batch * config.pooling
            output_bytes += 2 * config.batch * cols * OUTPUT_ELEMENT_BYTES
    return StepTerms(kernel_ms, ids, output_bytes)


def _clamped(ms: float) -> float:
    return min(MAX_FIXED_MS, max(0.0, ms))


def _shard_widths(kind: ShardingType, dim: int) -> list[int]:
    if kind in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
        return [dim // 2, dim - dim // 2]
    return [dim]


def _kernel_of(kind: ShardingType) -> ComputeKernel:
    return ComputeKernel.DENSE if kind is ShardingType.DATA_PARALLEL else ComputeKernel.FUSED


def fit_work(
    fused: KernelCoefficients, device: ComputeDevice, samples: Sequence[WorkSample]
) -> RuntimeCoefficients:
    """The runtime's terms from the base plans, each type's fixed cost from its plans, and
    the quality of the whole step's prediction over every plan measured."""
    profile = kernel_only_profile(fused, device)
    terms = {sample: step_terms(profile, sample) for sample in samples}
    base = [s for s in samples if s.variant is ShardingType.TABLE_WISE]
    fit = fit_linear(
        TERMS,
        np.array([(1.0, terms[s].ids, terms[s].output_bytes) for s in base], dtype=float),
        np.array([s.step_ms - terms[s].kernel_ms for s in base], dtype=float),
        relative_to_ms=np.array([s.step_ms for s in base], dtype=float),
    )
    step_ms, per_id_ms, per_byte_ms = fit.coefficients

    def predicted(sample: WorkSample) -> float:
        t = terms[sample]
        return t.kernel_ms + step_ms + per_id_ms * t.ids + per_byte_ms * t.output_bytes

    type_ms = {
        kind: _clamped(statistics.median(s.step_ms - predicted(s) for s in mine))
        for kind in VARIANTS
        if (mine := [s for s in samples if s.variant is kind])
    }
    quality = quality_of(
        np.array([predicted(s) + type_ms.get(s.variant, 0.0) for s in samples]),
        np.array([s.step_ms for s in samples]),
    )
    values = in_profile_units(TERMS, fit.coefficients, TERM_SCALES, TERM_BOUNDS)
    return RuntimeCoefficients(**values, sharding_type_ms=type_ms, fit=quality)


@dataclass(frozen=True)
class PlacementSample:
    bytes_each_way: int
    unit: int
    ms: float  # forward and backward


def measure_placement(device: torch.device, seed: int) -> list[PlacementSample]:
    """``place_chunks`` forward and backward on a random permutation of rows of each size
    and chunk width (about a second on cpu)."""
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for size, unit in itertools.product(PLACEMENT_BYTES, PLACEMENT_UNITS):
        chunks = size // (unit * OUTPUT_ELEMENT_BYTES)
        rows = torch.randn(chunks, unit, generator=generator).to(device).requires_grad_()
        target = torch.randperm(chunks, generator=generator).to(device)
        grad = torch.ones(chunks, unit, device=device)

        def placed(rows: torch.Tensor = rows, target: torch.Tensor = target) -> torch.Tensor:
            return place_chunks(rows, target, None, int(target.shape[0]))

        def back(out: torch.Tensor, grad: torch.Tensor = grad) -> None:
            out.backward(grad)

        def fresh(rows: torch.Tensor = rows) -> None:  # no gradient to accumulate into
            rows.grad = None

        forward, backward = median_pair_ms(placed, back, device, prepare=fresh)
        samples.append(PlacementSample(size, unit, forward + backward))
    return samples


def fit_placement(samples: Sequence[PlacementSample]) -> tuple[float, FitQuality]:
    """``placement_ns_per_byte`` (per byte placed, each way: the median over the samples of
    their time both ways over twice their bytes) and how well it predicts them."""
    per_byte_ms = [s.ms / (2.0 * s.bytes_each_way) for s in samples]
    ns_per_byte = min(MAX_NS_PER_BYTE, statistics.median(per_byte_ms) * NS_PER_MS)
    quality = quality_of(
        np.array([ns_per_byte / NS_PER_MS * 2.0 * s.bytes_each_way for s in samples]),
        np.array([s.ms for s in samples]),
    )
    return ns_per_byte, quality
