"""Packaging promises: the planner and clients import without torch; the runtime's pinned
torch/FBGEMM pair loads and runs a table-batched embedding lookup."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_planner_and_clients_import_without_torch():
    script = textwrap.dedent(
        """
        import importlib, pkgutil, sys
        sys.modules["torch"] = None  # any `import torch` now raises ImportError
        sys.modules["fbgemm_gpu"] = None
        import planner_service, clients
        names = []
        for package in (planner_service, clients):
            for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                importlib.import_module(info.name)
                names.append(info.name)
        print(len(names))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 8  # every module was imported, not just the packages


def test_fbgemm_tbe_lookup_matches_torch_embedding_bag():
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    assert torch.__version__.startswith("2.13.0")
    rows, dim = 10, 8
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
        optimizer=EmbOptimType.EXACT_SGD,
        pooling_mode=PoolingMode.SUM,
    )
    indices = torch.tensor([1, 2, 9, 0], dtype=torch.int64)
    offsets = torch.tensor([0, 3, 3, 4], dtype=torch.int64)  # bags [1,2,9], [], [0]
    pooled = tbe(indices, offsets)
    weights = tbe.split_embedding_weights()[0]
    expected = torch.nn.functional.embedding_bag(indices, weights, offsets[:-1], mode="sum")
    assert pooled.shape == (3, dim)
    torch.testing.assert_close(pooled, expected)
    assert torch.count_nonzero(pooled[1]) == 0
