"""The kernels a rank pools its shards with, and the optimizer fused into their backward.

Each kernel group of a rank's layout becomes one FBGEMM table-batched kernel
(``SplitTableBatchedEmbeddingBagsCodegen``, fp32 output) with the optimizer
``fused_params`` name, in the memory its key names: SUM pooling for pooled modules, no
pooling (a row per id, tables of one width) for sequence modules.

On CPU a sequence kernel is FBGEMM's pooled kernel instead (``CpuSequenceEmbeddings``):
fbgemm-gpu-cpu 1.8.0's unpooled CPU backward sums each id's gradient through a hash map
of hash maps, one allocation per row touched, and took 38 of a 73 ms step (``shardplan
measure``, 8 sequence tables table-wise at world size 2). The pooled kernel with every id
its own bag of one returns the same rows and sums the same gradients in the same order, 15
to 40 times faster backward and 2 to 4 times faster forward (one table of 200,000 x 32
rows, 20,480 ids: 0.64 ms instead of 24.6 ms backward). After a step its weights and
optimizer states are bit-equal to the unpooled kernel's for SGD and Adagrad; fp32 row-wise
Adagrad takes FBGEMM's vectorised update (the one pooled tables get), which may round an
ulp apart.

Adam on CPU is the exception: fbgemm-gpu-cpu 1.8.0's ``SplitTableBatchedEmbeddingBagsCodegen``
refuses ``ADAM`` on CPU ("not supported in CPU mode"). ``CpuAdamEmbeddingBags`` keeps the
lookups in FBGEMM (its ``DenseTableBatchedEmbeddingBagsCodegen``, which produces a dense
weight gradient) and runs the Adam step as soon as backward has accumulated that gradient (a
post-accumulate-grad hook), so the optimizer is still part of ``loss.backward()`` and no
optimizer object is needed. That dense kernel always pools on CPU, so a sequence module's
rows are read from its weights directly (``torch.nn.functional.embedding`` on the kernel's
storage, one width per kernel), with the same Adam step.

The step follows FBGEMM's ``ADAM`` (the CUDA kernel's update, fbgemm_gpu's
``codegen/genscript/optimizers.py``): only the rows the step looked up are updated (like
every fused TBE optimizer), each with its summed gradient ``g`` and the step count ``t``
(1 on the first step)::

    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    w = w - lr * (m / (1 - beta1**t) / (sqrt(v / (1 - beta2**t)) + eps) + weight_decay * w)
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, TypeAlias

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    DenseTableBatchedEmbeddingBagsCodegen,
    SplitTableBatchedEmbeddingBagsCodegen,
)
from torch import nn

from planner_service.plan.types import DataType, OptimizerType
from runtime.choices import choice
from runtime.kernel_key import KernelKey, Memory
from runtime.modules import BaseEmbeddingConfig
from runtime.plan import PlanMismatchError

OPTIMIZERS = {
    OptimizerType.SGD: EmbOptimType.EXACT_SGD,
    OptimizerType.ROWWISE_ADAGRAD: EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    OptimizerType.ADAGRAD: EmbOptimType.EXACT_ADAGRAD,
    OptimizerType.ADAM: EmbOptimType.ADAM,
}
HYPERPARAMETERS = ("learning_rate", "eps", "beta1", "beta2", "weight_decay", "momentum")
DEFAULT_LEARNING_RATE = 0.01  # SGD's, when no fused_params are given
ADAM_DEFAULTS = {"learning_rate": 0.01, "eps": 1e-8, "beta1": 0.9, "beta2": 0.999}
ADAM_HYPERPARAMETERS = (*ADAM_DEFAULTS, "weight_decay")
WEIGHT_PRECISION = {DataType.FP32: SparseType.FP32, DataType.FP16: SparseType.FP16}
# FBGEMM's exact CPU backward refuses a table of 2^31 - 1 rows or more; sequence tables
# stacked beyond that keep the unpooled kernel.
MAX_STACKED_ROWS = 2**31 - 2

# The CPU dense lookup is differentiable through the ops it calls, but the op itself has no
# autograd kernel registered, so torch warns on every backward. Its gradient is checked
# against the unsharded module by the equivalence tests (tests/runtime/cases.py, adam).
warnings.filterwarnings(
    "ignore",
    message=r"fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel",
    category=UserWarning,
)


class CpuAdamEmbeddingBags(nn.Module):
    """The ``SplitTableBatchedEmbeddingBagsCodegen`` calls the sharded module makes
    (``forward(indices, offsets, per_sample_weights)``, ``split_embedding_weights()``), with
    FBGEMM's Adam applied in backward."""

    def __init__(
        self,
        specs: Sequence[tuple[int, int]],
        feature_table_map: Sequence[int],
        weights_precision: SparseType,
        hyperparameters: Mapping[str, float],
        sequence: bool = False,
    ) -> None:
        super().__init__()
        self.sequence = sequence
        params = {**ADAM_DEFAULTS, "weight_decay": 0.0, **hyperparameters}
        self.learning_rate = params["learning_rate"]
        self.eps, self.beta1, self.beta2 = params["eps"], params["beta1"], params["beta2"]
        self.weight_decay = params["weight_decay"]
        self.lookup = DenseTableBatchedEmbeddingBagsCodegen(
            list(specs),
            feature_table_map=list(feature_table_map),
            weights_precision=weights_precision,
            pooling_mode=PoolingMode.SUM,
            use_cpu=True,
            output_dtype=SparseType.FP32,
        )
        weights = self.lookup.weights
        self.momentum1: torch.Tensor
        self.momentum2: torch.Tensor
        self.register_buffer("momentum1", torch.zeros(weights.shape, dtype=torch.float32))
        self.register_buffer("momentum2", torch.zeros(weights.shape, dtype=torch.float32))
        self.iter = 0
        self._specs = list(specs)
        # Tables lie one after another in the flat weights (weights_offsets is per feature).
        self._starts = [sum(r * d for r, d in self._specs[:t]) for t in range(len(self._specs))]
        self._table_of_feature = torch.tensor(list(feature_table_map), dtype=torch.int64)
        width = self._specs[0][1] if self._specs else 0
        self._first_row = torch.tensor([start // max(width, 1) for start in self._starts])
        self._looked_up: list[tuple[torch.Tensor, torch.Tensor]] = []  # (table, row) per id
        weights.register_post_accumulate_grad_hook(self._step)

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        track = torch.is_grad_enabled() and offsets.numel() > 1
        tables = self._tables_of(indices, offsets) if track or self.sequence else indices
        if track:
            self._looked_up.append((tables, indices.to(torch.int64)))
        if self.sequence:  # one width: the flat weights are rows of it, table after table
            flat = self.lookup.weights
            rows = flat.view(-1, self._specs[0][1]) if self._specs else flat.view(0, 0)
            return nn.functional.embedding(self._first_row[tables] + indices, rows).float()
        result: torch.Tensor = self.lookup(indices, offsets, per_sample_weights)
        return result

    def _tables_of(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Each id's table in the kernel (the kernel's features take ``batch`` bags each)."""
        if offsets.numel() <= 1:
            return indices.new_zeros(indices.shape, dtype=torch.int64)
        batch = (offsets.numel() - 1) // len(self._table_of_feature)
        per_feature = offsets[::batch].diff()
        return torch.repeat_interleave(self._table_of_feature, per_feature)

    def split_embedding_weights(self) -> list[torch.Tensor]:
        return [self._view(self.lookup.weights.detach(), t) for t in range(len(self._specs))]

    def split_optimizer_states(self) -> list[list[torch.Tensor]]:
        """Each table's first and second moments, ``[rows, dim]`` views (FBGEMM's call)."""
        return [
            [self._view(self.momentum1, t), self._view(self.momentum2, t)]
            for t in range(len(self._specs))
        ]

    def _view(self, flat: torch.Tensor, table: int) -> torch.Tensor:
        rows, dim = self._specs[table]
        start = self._starts[table]
        return flat[start : start + rows * dim].view(rows, dim)

    @torch.no_grad()
    def _step(self, weights: torch.Tensor) -> None:
        grad, weights.grad = weights.grad, None
        looked_up, self._looked_up = self._looked_up, []
        if grad is None or not looked_up:
            return
        self.iter += 1
        tables = torch.cat([t for t, _ in looked_up])
        ids = torch.cat([i for _, i in looked_up])
        bias1 = 1.0 - self.beta1**self.iter
        bias2 = 1.0 - self.beta2**self.iter
        for t in range(len(self._specs)):
            rows = torch.unique(ids[tables == t])
            if rows.numel() == 0:
                continue
            g = self._view(grad, t)[rows].float()
            w = self._view(weights.data, t)
            m = self._view(self.momentum1, t)
            v = self._view(self.momentum2, t)
            m_rows = m[rows].mul_(self.beta1).add_(g, alpha=1.0 - self.beta1)
            v_rows = v[rows].mul_(self.beta2).addcmul_(g, g, value=1.0 - self.beta2)
            m[rows], v[rows] = m_rows, v_rows
            w_rows = w[rows].float()
            update = (m_rows / bias1) / ((v_rows / bias2).sqrt() + self.eps)
            update.add_(w_rows, alpha=self.weight_decay)
            w[rows] = (w_rows - self.learning_rate * update).to(w.dtype)


class CpuSequenceEmbeddings(nn.Module):
    """An unpooled kernel's calls (``forward(indices, offsets)`` gives a row per id, in id
    order; ``split_embedding_weights``, ``split_optimizer_states``, ``iter``) made with
    FBGEMM's pooled kernel: its tables stacked into one table of their summed rows, each
    id shifted by its table's first row and looked up as a bag of its own (the module
    docstring says why). The ids must be in their tables' bounds (the sharded module's
    input distribution checks them), since the stacked table's bounds are wider."""

    def __init__(
        self,
        stacked: SplitTableBatchedEmbeddingBagsCodegen,
        sizes: Sequence[tuple[int, int]],
        feature_table_map: Sequence[int],
    ) -> None:
        super().__init__()
        self.stacked = stacked
        self._rows = [rows for rows, _ in sizes]
        first = [sum(self._rows[:t]) for t in range(len(self._rows))]
        self._first_row = torch.tensor([first[t] for t in feature_table_map], dtype=torch.int64)

    @property
    def iter(self) -> torch.Tensor:
        """The fused optimizer's step count (FBGEMM's, as ``kernel_step`` reads it)."""
        step: torch.Tensor = self.stacked.iter
        return step

    def forward(
        self, indices: torch.Tensor, offsets: torch.Tensor, per_sample_weights: None = None
    ) -> torch.Tensor:
        """``[ids, width]``: the row of every id, for ``offsets``' bags of every feature
        (sequence modules take no per-id weights)."""
        features = self._first_row.numel()
        bags = (offsets.numel() - 1) // max(features, 1)
        ids = indices.to(torch.int64)
        if bags and ids.numel():
            per_feature = offsets[::bags].diff()
            ids = ids + torch.repeat_interleave(self._first_row.to(ids.device), per_feature)
        singles = torch.arange(ids.numel() + 1, dtype=torch.int64, device=ids.device)
        rows: torch.Tensor = self.stacked(ids, singles)
        return rows

    def split_embedding_weights(self) -> list[torch.Tensor]:
        """Each table's ``[rows, width]`` view of the stacked table."""
        return self._split(self.stacked.split_embedding_weights()[0])

    def split_optimizer_states(self) -> list[list[torch.Tensor]]:
        """Each table's views of the stacked table's optimizer states (none for SGD)."""
        states = self.stacked.split_optimizer_states()
        if not states:
            return []
        per_state = [self._split(state) for state in states[0]]
        return [[split[t] for split in per_state] for t in range(len(self._rows))]

    def _split(self, stacked: torch.Tensor) -> list[torch.Tensor]:
        return list(stacked.split(self._rows))


# FBGEMM's fused kernel, its pooled kernel as an unpooled one (sequence tables on CPU), or
# (adam on CPU) its dense lookup with Adam in backward.
Kernel: TypeAlias = (
    SplitTableBatchedEmbeddingBagsCodegen | CpuSequenceEmbeddings | CpuAdamEmbeddingBags
)
KERNEL_TYPES = (SplitTableBatchedEmbeddingBagsCodegen, CpuSequenceEmbeddings, CpuAdamEmbeddingBags)


# The optimizer settings a user passes, as TorchRec's sharders take them: ``"optimizer"``
# (a name) and hyperparameters (numbers); ``fused_optimizer`` reads them into a
# ``FusedOptimizer``.
FusedParams: TypeAlias = Mapping[str, Any]


class FusedOptimizer(NamedTuple):
    optimizer: OptimizerType
    hyperparameters: dict[str, float]


def fused_optimizer(fused_params: FusedParams | None) -> FusedOptimizer:
    """The optimizer ``fused_params`` names and its hyperparameters (default: SGD at 0.01);
    unknown names and keys are refused, and keys adam does not use."""
    if fused_params is None:
        return FusedOptimizer(OptimizerType.SGD, {"learning_rate": DEFAULT_LEARNING_RATE})
    params = dict(fused_params)
    named = params.pop("optimizer", OptimizerType.SGD)
    optimizer = choice(OptimizerType, named, "optimizer", owner="fused_params", accepted=OPTIMIZERS)
    unknown = sorted(set(params) - set(HYPERPARAMETERS))
    if unknown:
        raise ValueError(
            f"fused_params has unknown keys {unknown}; accepted: optimizer, "
            f"{', '.join(HYPERPARAMETERS)}"
        )
    unused = sorted(set(params) - set(ADAM_HYPERPARAMETERS))
    if optimizer is OptimizerType.ADAM and unused:
        raise ValueError(
            f"fused_params has keys {unused} that adam does not use; adam takes "
            f"{', '.join(ADAM_HYPERPARAMETERS)}"
        )
    return FusedOptimizer(optimizer, {k: float(v) for k, v in params.items()})


def kernel_step(kernel: Kernel) -> int:
    """The optimizer steps a kernel has taken (Adam's bias correction counts them)."""
    if isinstance(kernel, CpuAdamEmbeddingBags):
        return kernel.iter
    return int(kernel.iter.item())


def set_kernel_step(kernel: Kernel, step: int) -> None:
    if isinstance(kernel, CpuAdamEmbeddingBags):
        kernel.iter = step
    else:
        kernel.iter.fill_(step)


def check_trainable(tables: Sequence[BaseEmbeddingConfig]) -> None:
    """Refuse tables whose data type the kernels do not train (before allocating)."""
    for table in tables:
        if table.data_type not in WEIGHT_PRECISION:
            raise PlanMismatchError(
                f"table {table.name!r} has data_type {table.data_type.value!r}; the "
                f"sharded kernels train {[d.value for d in WEIGHT_PRECISION]}"
            )


def build_kernel(
    key: KernelKey,
    sizes: Sequence[tuple[int, int]],
    feature_table_map: Sequence[int],
    optimizer: FusedOptimizer,
    device: torch.device,
    sequence: bool = False,
) -> Kernel:
    """One kernel of tables of ``sizes`` (rows, columns) looking up features of
    ``feature_table_map``'s tables: pooled, or (``sequence``) a row per id."""
    cuda = device.type == "cuda"
    precision = WEIGHT_PRECISION[key.data_type]
    if optimizer.optimizer is OptimizerType.ADAM and not cuda:  # no fused CPU kernel in fbgemm
        return CpuAdamEmbeddingBags(
            sizes, feature_table_map, precision, optimizer.hyperparameters, sequence
        )
    stacked_rows = sum(rows for rows, _ in sizes)
    if sequence and not cuda and sizes and stacked_rows <= MAX_STACKED_ROWS:
        width = sizes[0][1]
        stacked = fbgemm_kernel(key, [(stacked_rows, width)], [0], optimizer, device, True)
        return CpuSequenceEmbeddings(stacked, sizes, feature_table_map)
    return fbgemm_kernel(key, sizes, feature_table_map, optimizer, device, not sequence)


def fbgemm_kernel(
    key: KernelKey,
    sizes: Sequence[tuple[int, int]],
    feature_table_map: Sequence[int],
    optimizer: FusedOptimizer,
    device: torch.device,
    pooled: bool,
) -> SplitTableBatchedEmbeddingBagsCodegen:
    """FBGEMM's kernel of tables of ``sizes``: pooled (SUM), or a row per id."""
    cuda = device.type == "cuda"
    location = EmbeddingLocation[key.memory.value]
    compute = ComputeDevice.CUDA if cuda else ComputeDevice.CPU
    caching = key.memory is Memory.MANAGED_CACHING
    extra = {"cache_load_factor": key.cache_load_factor} if caching else {}
    return SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, cols, location, compute) for rows, cols in sizes],
        feature_table_map=list(feature_table_map),
        optimizer=OPTIMIZERS[optimizer.optimizer],
        pooling_mode=PoolingMode.SUM if pooled else PoolingMode.NONE,
        weights_precision=WEIGHT_PRECISION[key.data_type],
        output_dtype=SparseType.FP32,
        device=device,
        **optimizer.hyperparameters,
        **extra,
    )
