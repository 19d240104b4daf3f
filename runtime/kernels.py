"""Adam for table-batched embeddings on CPU, where fbgemm-gpu-cpu has no fused Adam kernel.

fbgemm-gpu-cpu 1.8.0's ``SplitTableBatchedEmbeddingBagsCodegen`` refuses ``ADAM`` on CPU
("not supported in CPU mode"). ``CpuAdamEmbeddingBags`` keeps the lookups in FBGEMM (its
``DenseTableBatchedEmbeddingBagsCodegen``, which produces a dense weight gradient) and runs
the Adam step as soon as backward has accumulated that gradient (a post-accumulate-grad hook),
so the optimizer is still part of ``loss.backward()`` and no optimizer object is needed.

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

import torch
from fbgemm_gpu.split_embedding_configs import SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    DenseTableBatchedEmbeddingBagsCodegen,
)
from torch import nn

ADAM_DEFAULTS = {"learning_rate": 0.01, "eps": 1e-8, "beta1": 0.9, "beta2": 0.999}
ADAM_HYPERPARAMETERS = (*ADAM_DEFAULTS, "weight_decay")

# The CPU dense lookup is differentiable through the ops it calls, but the op itself has no
# autograd kernel registered, so torch warns on every backward. Its gradient is checked
# against the unsharded module by the equivalence tests (tests/runtime_cases.py, adam).
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
    ) -> None:
        super().__init__()
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
        self._looked_up: list[tuple[torch.Tensor, torch.Tensor]] = []  # (table, row) per id
        weights.register_post_accumulate_grad_hook(self._step)

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if torch.is_grad_enabled() and offsets.numel() > 1:
            features = len(self._table_of_feature)
            batch = (offsets.numel() - 1) // features
            per_feature = offsets[::batch].diff()
            tables = torch.repeat_interleave(self._table_of_feature, per_feature)
            self._looked_up.append((tables, indices.to(torch.int64)))
        result: torch.Tensor = self.lookup(indices, offsets, per_sample_weights)
        return result

    def split_embedding_weights(self) -> list[torch.Tensor]:
        return [self._view(self.lookup.weights.detach(), t) for t in range(len(self._specs))]

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
