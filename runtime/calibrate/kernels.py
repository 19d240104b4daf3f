"""The kernel stage: FBGEMM's table-batched kernel (``runtime.kernels.build_kernel``, as the
sharded module builds it) timed forward and backward-with-the-fused-optimizer over a grid of
dims, pooling factors, rows, batch sizes and tables per call, and fit to the calibrated
model's kernel terms (``KernelCoefficients``).

Each case is one kernel call over ``tables`` equal tables, ``batch`` bags each of exactly
``pooling`` ids drawn uniformly (what ``rows_touched`` assumes); on ``fused_uvm_caching``, a
``hit_rate`` share of the ids is drawn from rows the cache holds after a warm-up. Cases with
one and with several tables per call separate the per-call terms from the per-id ones.
"""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from planner_service.costs.calibrated import NS_PER_MS, OUTPUT_ELEMENT_BYTES, US_PER_MS, miss_share
from planner_service.costs.calibrated import rows_touched as expected_rows_touched
from planner_service.plan.types import (
    MAX_FIXED_MS,
    MAX_NS_PER_BYTE,
    MAX_US_PER_ID,
    MAX_WEIGHTED_FACTOR,
    ComputeKernel,
    DataType,
    KernelCoefficients,
    OptimizerType,
)
from planner_service.plan.units import parse_byte_size
from runtime.calibrate.fit import DegenerateFitError, fit_linear, in_profile_units
from runtime.calibrate.timing import Budget, median_pair_ms
from runtime.kernel_key import KernelKey, Memory
from runtime.kernels import FusedOptimizer, Kernel, build_kernel

DIMS = (16, 32, 64, 128, 256)
POOLING_FACTORS = (1, 4, 16, 64)
ROWS = (1_000, 10_000, 100_000, 1_000_000)
BATCH_SIZES = (256, 1024, 4096)
TABLES_PER_CALL = (1, 2, 8)  # cuda batches tables in a kernel; on cpu each has its own
CPU_TABLES_PER_CALL = (1,)  # (runtime.sharding.layout.kernel_key)
ID_BATCHES = 4  # distinct id batches a case cycles through, as a training job's steps do
FLUSH_SHARE = 1.5  # of the resident bytes, written between calls: a step's other work
# (the exchanges, the other tables' kernels) leaves a kernel's rows out of the caches
WEIGHTED_EVERY = 5  # one case in this many pools with per-sample weights (their factor)
MAX_WEIGHT_BYTES = 2**29  # a case's tables together: 512 MiB
MAX_ID_COLUMNS = 2**25  # ids x dim of one call: about 50 ms of CPU backward
CHEAP_ID_COLUMNS = 2**18  # the first cases, so a short budget still fits every term
ROUNDS = 3
MIN_SAMPLES = 10  # measured whatever the budget: 4 terms and a residual, twice over
ADAGRAD_EVERY = 4  # one case in this many runs rowwise_adagrad (the optimizer state term)
ELEMENT_BYTES = DataType.FP32.size_bytes
CACHE_LOAD_FACTOR = 0.2  # of fused_uvm_caching cases: the cache holds a fifth of the rows
HOT_SHARE_OF_CACHE = 0.5  # the rows ids hit are half of what the cache holds
SGD = FusedOptimizer(OptimizerType.SGD, {"learning_rate": 0.01})
ROWWISE_ADAGRAD = FusedOptimizer(OptimizerType.ROWWISE_ADAGRAD, {"learning_rate": 0.01})
FWD_TERMS = (
    "call_fwd_ms",
    "fwd_us_per_id",
    "fwd_ns_per_byte",
    "fwd_ns_per_out_byte",
    "fwd_ns_per_miss_byte",
)
BWD_TERMS = (
    "call_bwd_ms",
    "bwd_us_per_id",
    "bwd_ns_per_byte",
    "bwd_ns_per_row_byte",
    "bwd_ns_per_miss_byte",
)
# Each term's coefficient is fit in ms per unit; these turn it into the profile's units.
TERM_SCALES = (1.0, US_PER_MS, NS_PER_MS, NS_PER_MS, NS_PER_MS)
TERM_BOUNDS = (MAX_FIXED_MS, MAX_US_PER_ID, MAX_NS_PER_BYTE, MAX_NS_PER_BYTE, MAX_NS_PER_BYTE)
CPU_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")


def resident_bytes(device: torch.device) -> int:
    """What the processor keeps close: the largest cache of cpu 0 (its last level; 0 when
    the system does not say), or the GPU's L2. Reads from larger shards pay the miss
    terms."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).L2_cache_size)
    sizes = [0]
    for entry in CPU_CACHES.glob("index*/size"):
        try:
            sizes.append(parse_byte_size(entry.read_text().strip().replace("K", "KiB")))
        except (OSError, ValueError):
            continue
    return max(sizes)


@dataclass(frozen=True)
class KernelTarget:
    """One profile entry to measure: a kernel, and for ``fused_uvm_caching`` its hit rate."""

    kernel: ComputeKernel
    hit_rate: float | None = None
    pooled: bool = True  # False: the unpooled kernel sequence tables use

    @property
    def label(self) -> str:
        rate = f" at {self.hit_rate:g} hits" if self.hit_rate is not None else ""
        return f"{self.kernel.value}{rate}{'' if self.pooled else ' unpooled'}"


def targets_of(device: torch.device, hit_rates: Sequence[float]) -> list[KernelTarget]:
    """The kernels measured on ``device``: ``fused`` on cpu (``dense`` runs the same host
    kernel there: see ``dense_as_fused``) and its unpooled kernel (sequence tables); on cuda
    also ``fused_uvm`` and ``fused_uvm_caching`` at each hit rate."""
    fused = [KernelTarget(ComputeKernel.FUSED), KernelTarget(ComputeKernel.FUSED, pooled=False)]
    if device.type != "cuda":
        return fused
    caching = [KernelTarget(ComputeKernel.FUSED_UVM_CACHING, rate) for rate in hit_rates]
    return [*fused, KernelTarget(ComputeKernel.FUSED_UVM), *caching]


@dataclass(frozen=True)
class KernelCase:
    """One kernel call: ``tables`` tables of ``rows`` x ``dim``, ``batch`` bags each of
    ``pooling`` ids."""

    rows: int
    dim: int
    tables: int
    batch: int
    pooling: int
    optimizer: OptimizerType = OptimizerType.SGD
    weighted: bool = False
    pooled: bool = True  # False: a row out per id (the unpooled kernel)

    @property
    def ids(self) -> int:
        return self.tables * self.batch * self.pooling

    @property
    def row_bytes(self) -> int:
        return self.dim * ELEMENT_BYTES

    def missed_bytes(self, resident: int) -> float:
        """Row bytes read from beyond what the processor keeps close (``miss_share``)."""
        return self.ids * self.row_bytes * miss_share(resident, self.rows * self.row_bytes)

    def fwd_terms(self, resident: int) -> tuple[float, ...]:
        rows_out = self.tables * self.batch if self.pooled else self.ids
        out_bytes = rows_out * self.dim * OUTPUT_ELEMENT_BYTES
        read = self.ids * self.row_bytes
        return (1.0, self.ids, read, out_bytes, self.missed_bytes(resident))

    def bwd_terms(self, resident: int) -> tuple[float, ...]:
        touched = self.tables * expected_rows_touched(self.rows, self.batch * self.pooling)
        state = self.optimizer.state_bytes(1, self.dim)
        read = self.ids * self.row_bytes
        updated = touched * (self.row_bytes + state)
        return (1.0, self.ids, read, updated, self.missed_bytes(resident))


def grid(seed: int, tables_per_call: Sequence[int] = TABLES_PER_CALL) -> list[KernelCase]:
    """Every case of the grid that fits the memory and time caps, in a seeded random order
    whose first ``MIN_SAMPLES`` are cheap (and vary every term), so that a grid stopped early
    by its budget is still a spread of the whole space; one case in ``WEIGHTED_EVERY``
    (after those) is weighted, one in ``ADAGRAD_EVERY`` runs rowwise_adagrad."""
    cases = [
        KernelCase(rows, dim, tables, batch, pooling)
        for rows, dim, tables, batch, pooling in itertools.product(
            ROWS, DIMS, tables_per_call, BATCH_SIZES, POOLING_FACTORS
        )
        if rows * dim * tables * ELEMENT_BYTES <= MAX_WEIGHT_BYTES
        and tables * batch * pooling * dim <= MAX_ID_COLUMNS
    ]
    rng = random.Random(seed)
    rng.shuffle(cases)
    cheap = [c for c in cases if c.ids * c.dim <= CHEAP_ID_COLUMNS][:MIN_SAMPLES]
    ordered = cheap + [c for c in cases if c not in cheap]
    return [
        replace(
            c,
            optimizer=OptimizerType.ROWWISE_ADAGRAD
            if i % ADAGRAD_EVERY == ADAGRAD_EVERY - 1
            else OptimizerType.SGD,
            weighted=i >= MIN_SAMPLES and i % WEIGHTED_EVERY == WEIGHTED_EVERY - 1,
        )
        for i, c in enumerate(ordered)
    ]


@dataclass(frozen=True)
class KernelSample:
    case: KernelCase
    fwd_ms: float
    bwd_ms: float


def key_of(target: KernelTarget) -> KernelKey:
    if target.kernel is ComputeKernel.FUSED_UVM_CACHING:
        return KernelKey(Memory.MANAGED_CACHING, DataType.FP32, CACHE_LOAD_FACTOR)
    memory = {ComputeKernel.FUSED_UVM: Memory.MANAGED}.get(target.kernel, Memory.DEVICE)
    return KernelKey(memory, DataType.FP32, 0.0)


def measure_case(
    target: KernelTarget,
    case: KernelCase,
    device: torch.device,
    generator: torch.Generator,
    flush_bytes: int = 0,
) -> KernelSample:
    """Forward and backward (the fused update) of one case, median of several calls, each
    on the next of ``ID_BATCHES`` id batches after ``flush_bytes`` were written (cold
    caches, as between a step's kernels)."""
    key = key_of(target) if device.type == "cuda" else KernelKey(Memory.HOST, DataType.FP32, 0.0)
    optimizer = SGD if case.optimizer is OptimizerType.SGD else ROWWISE_ADAGRAD
    sizes = [(case.rows, case.dim)] * case.tables
    kernel = build_kernel(
        key, sizes, list(range(case.tables)), optimizer, device, sequence=not case.pooled
    )
    batches = [draw_ids(case, target.hit_rate, generator).to(device) for _ in range(ID_BATCHES)]
    weights = torch.rand((case.ids,), generator=generator).to(device) if case.weighted else None
    offsets = torch.arange(0, case.ids + 1, case.pooling, dtype=torch.int64, device=device)
    if target.hit_rate is not None:
        warm_cache(kernel, case, device)
    shape = (case.batch, case.tables * case.dim) if case.pooled else (case.ids, case.dim)
    grad = torch.ones(shape, device=device)
    turn = itertools.cycle(range(ID_BATCHES))
    current = [0]
    flush = cache_flush(device, flush_bytes)

    def prepare() -> None:
        current[0] = next(turn)
        flush()

    def forward() -> torch.Tensor:
        output: torch.Tensor = kernel(batches[current[0]], offsets, per_sample_weights=weights)
        return output

    fwd_ms, bwd_ms = median_pair_ms(
        forward, lambda out: out.backward(grad), device, prepare=prepare
    )
    return KernelSample(case, fwd_ms, bwd_ms)


def cache_flush(device: torch.device, size_bytes: int) -> Callable[[], None]:
    """Writes ``size_bytes`` (nothing for 0): what the processor kept close is gone."""
    if size_bytes <= 0:
        return lambda: None
    buffer = torch.zeros(size_bytes // 4, dtype=torch.float32, device=device)

    def flush() -> None:
        buffer.add_(1.0)

    return flush


def hot_rows(case: KernelCase) -> int:
    return max(1, int(case.rows * CACHE_LOAD_FACTOR * HOT_SHARE_OF_CACHE))


def draw_ids(case: KernelCase, hit_rate: float | None, generator: torch.Generator) -> torch.Tensor:
    """Every table's ids: uniform over the rows, or a ``hit_rate`` share from the hot rows
    and the rest from the others."""
    if hit_rate is None:
        return torch.randint(0, case.rows, (case.ids,), generator=generator)
    hot = hot_rows(case)
    hits = torch.rand((case.ids,), generator=generator) < hit_rate
    hot_ids = torch.randint(0, hot, (case.ids,), generator=generator)
    cold_ids = torch.randint(hot, max(hot + 1, case.rows), (case.ids,), generator=generator)
    return torch.where(hits, hot_ids, cold_ids)


def warm_cache(kernel: Kernel, case: KernelCase, device: torch.device) -> None:
    """Look up every hot row of every table, so that the cache holds them when timed."""
    hot = hot_rows(case)
    ids = torch.arange(hot, device=device).repeat(case.tables)
    offsets = torch.zeros(case.tables * case.batch + 1, dtype=torch.int64, device=device)
    for table in range(case.tables):  # every bag of a table empty but the first
        offsets[table * case.batch + 1 :] = (table + 1) * hot
    for _ in range(2):
        with torch.no_grad():
            kernel(ids, offsets)


def measure_kernel(
    target: KernelTarget,
    device: torch.device,
    deadline: float,
    budget: Budget,
    seed: int,
    on_case: Callable[[int], None],
) -> list[KernelSample]:
    """Cases of the grid until ``deadline`` (at least ``MIN_SAMPLES`` of them): the grid
    again, in another order, while time is left, up to ``ROUNDS`` times (more samples of
    each case average out a busy machine's noise)."""
    generator = torch.Generator().manual_seed(seed)
    samples: list[KernelSample] = []
    per_call = TABLES_PER_CALL if device.type == "cuda" else CPU_TABLES_PER_CALL
    cases = itertools.chain.from_iterable(grid(seed + r, per_call) for r in range(ROUNDS))
    flush_bytes = int(FLUSH_SHARE * resident_bytes(device))
    for case in cases:
        if len(samples) >= MIN_SAMPLES and budget.now() >= deadline:
            break
        if not target.pooled:  # sequence modules take no per-sample weights
            case = replace(case, pooled=False, weighted=False)
        samples.append(measure_case(target, case, device, generator, flush_bytes))
        on_case(len(samples))
    return samples


def fit_kernel(
    target: KernelTarget, samples: Sequence[KernelSample], resident: int = 0
) -> KernelCoefficients:
    """The kernel's coefficients, each direction fit by non-negative least squares;
    ``resident``: the bytes the processor keeps close (``resident_bytes``)."""
    # Without a known cache, or when no case missed it, the miss term is no term: it would
    # repeat the bytes read, or never vary.
    weighted = [s for s in samples if s.case.weighted]
    samples = [s for s in samples if not s.case.weighted]
    misses = resident > 0 and any(s.case.missed_bytes(resident) > 0 for s in samples)
    # An unpooled kernel writes a row per id: its bytes written are its bytes read (fp32),
    # so one per-byte term serves both.
    fwd_used = [i for i, name in enumerate(FWD_TERMS) if _fits(name, misses, target.pooled)]
    bwd_used = [i for i, name in enumerate(BWD_TERMS) if _fits(name, misses, True)]
    values = {}
    fits = []
    for terms, used, of, times in (
        (FWD_TERMS, fwd_used, KernelCase.fwd_terms, [s.fwd_ms for s in samples]),
        (BWD_TERMS, bwd_used, KernelCase.bwd_terms, [s.bwd_ms for s in samples]),
    ):
        names = tuple(terms[i] for i in used)
        rows = [[of(s.case, resident)[i] for i in used] for s in samples]
        fit = fit_linear(names, np.array(rows, dtype=float), np.array(times, dtype=float))
        scales = [TERM_SCALES[i] for i in used]
        bounds = [TERM_BOUNDS[i] for i in used]
        values.update(in_profile_units(names, fit.coefficients, scales, bounds))
        fits.append(fit)
    fwd, bwd = fits
    values = {name: 0.0 for name in (*FWD_TERMS, *BWD_TERMS)} | values
    entry = KernelCoefficients(
        compute_kernel=target.kernel,
        cache_hit_rate=target.hit_rate,
        pooled=target.pooled,
        resident_bytes=resident,
        fit_fwd=fwd.quality,
        fit_bwd=bwd.quality,
        **values,
    )
    return entry.model_copy(update=weighted_terms(entry, weighted))


def _fits(name: str, misses: bool, pooled: bool) -> bool:
    """Whether a term is fit: the miss terms only when some case missed the cache, bytes
    written only by pooled kernels; a term not fit stays 0 in the profile."""
    if name.endswith("miss_byte"):
        return misses
    return pooled or name != "fwd_ns_per_out_byte"


WEIGHTED_BWD_TERMS = (
    "weighted_bwd_us_per_id",
    "weighted_bwd_ns_per_byte",
    "weighted_bwd_ns_per_miss_byte",
)


def weighted_terms(entry: KernelCoefficients, weighted: Sequence[KernelSample]) -> dict[str, float]:
    """How much more the kernel costs with per-sample weights. Forward: the median of
    measured over predicted (unweighted) time of the weighted cases, at least 1. Backward:
    what the weighted cases measure beyond their unweighted prediction, fit per id, per
    byte read and per byte missed (the weights' gradient reads every id's row again: on
    this machine's cpu that is 0.9 ms for 2.6 MB read and 6.6 ms for 10.5 MB from a
    195 MiB table, a 2x to 5x factor that no single factor fits); the median factor when
    too few weighted cases were measured to fit the terms."""
    if not weighted:
        return {}
    values: dict[str, float] = {}
    fwd = _median_factor(
        [s.fwd_ms for s in weighted], [case_fwd_ms(entry, s.case) for s in weighted]
    )
    if fwd is not None:
        values["weighted_fwd_factor"] = fwd
    predicted = np.array([case_bwd_ms(entry, s.case) for s in weighted], dtype=float)
    measured = np.array([s.bwd_ms for s in weighted], dtype=float)
    resident = entry.resident_bytes
    misses = resident > 0 and any(s.case.missed_bytes(resident) > 0 for s in weighted)
    used = [0, 1, 2] if misses else [0, 1]
    names = tuple(WEIGHTED_BWD_TERMS[i] for i in used)
    features = np.array(
        [
            [
                (s.case.ids, s.case.ids * s.case.row_bytes, s.case.missed_bytes(resident))[i]
                for i in used
            ]
            for s in weighted
        ],
        dtype=float,
    )
    try:
        fit = fit_linear(names, features, measured - predicted, relative_to_ms=measured)
    except DegenerateFitError:
        bwd = _median_factor(list(measured), list(predicted))
        return values if bwd is None else {**values, "weighted_bwd_factor": bwd}
    scales = (US_PER_MS, NS_PER_MS, NS_PER_MS)
    bounds = (MAX_US_PER_ID, MAX_NS_PER_BYTE, MAX_NS_PER_BYTE)
    return values | in_profile_units(
        names,
        fit.coefficients,
        [scales[i] for i in used],
        [bounds[i] for i in used],
    )


def _median_factor(measured: Sequence[float], predicted: Sequence[float]) -> float | None:
    ratios = [m / p for m, p in zip(measured, predicted, strict=True) if p > 0]
    if not ratios:
        return None
    return min(MAX_WEIGHTED_FACTOR, max(1.0, statistics.median(ratios)))


def case_fwd_ms(entry: KernelCoefficients, case: KernelCase) -> float:
    """What ``entry`` predicts for the case's forward (as ``costs.calibrated`` prices it)."""
    terms = case.fwd_terms(entry.resident_bytes)
    coefficients = [getattr(entry, name) for name in FWD_TERMS]
    return sum(t * c / scale for t, c, scale in zip(terms, coefficients, TERM_SCALES, strict=True))


def case_bwd_ms(entry: KernelCoefficients, case: KernelCase) -> float:
    terms = case.bwd_terms(entry.resident_bytes)
    coefficients = [getattr(entry, name) for name in BWD_TERMS]
    return sum(t * c / scale for t, c, scale in zip(terms, coefficients, TERM_SCALES, strict=True))


def dense_as_fused(fused: KernelCoefficients) -> KernelCoefficients:
    """The ``dense`` entry: the runtime pools data-parallel replicas in the same kernel as
    the fused shards (``runtime.sharding.layout.kernel_key``: host memory on cpu, device
    memory on cuda, for both), so dense costs what fused costs, measured once."""
    return fused.model_copy(update={"compute_kernel": ComputeKernel.DENSE})
