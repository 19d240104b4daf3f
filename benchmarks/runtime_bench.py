"""Single-rank overhead of the sharded module over FBGEMM's TBE called directly.

    .venv/bin/python -m benchmarks.runtime_bench --tables 16 --rows 100000 --dim 64 \\
        --batch 2048 --pooling 8 --steps 50

Both sides hold the same tables in one ``SplitTableBatchedEmbeddingBagsCodegen`` (fused
SGD, host memory) and run forward + backward (the fused update) on the same batch. "raw"
hands the kernel precomputed indices and offsets; "shardplan" is ``shard_modules`` with every
table table-wise on rank 0 of a one-rank world, called with the ``KeyedJaggedTensor``, so it
includes input checks, routing, the (local) exchanges and the output column map. Reported:
median step time over ``--steps`` after warm-up, and the overhead ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)

from runtime import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    KeyedJaggedTensor,
    construct_module_plan,
    shard_modules,
    table_wise,
)
from runtime.sparse import offsets_from_lengths


def timed(step: Callable[[], None], warmup: int, steps: int) -> float:
    for _ in range(warmup):
        step()
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=16)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--pooling", type=int, default=8, help="mean ids per bag")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3, help="alternating rounds per side")
    args = parser.parse_args()
    torch.manual_seed(0)
    tables = [
        EmbeddingBagConfig(f"t{i}", args.rows, args.dim, feature_names=[f"f{i}"])
        for i in range(args.tables)
    ]
    lengths = torch.randint(0, 2 * args.pooling + 1, (args.tables * args.batch,))
    values = torch.randint(0, args.rows, (int(lengths.sum()),))
    kjt = KeyedJaggedTensor.from_lengths_sync(
        [f"f{i}" for i in range(args.tables)], values, lengths
    )
    offsets = offsets_from_lengths(lengths)

    raw = SplitTableBatchedEmbeddingBagsCodegen(
        [(args.rows, args.dim, EmbeddingLocation.HOST, ComputeDevice.CPU)] * args.tables,
        optimizer=EmbOptimType.EXACT_SGD,
        learning_rate=0.01,
        pooling_mode=PoolingMode.SUM,
    )
    plan = construct_module_plan(tables, {t.name: table_wise(0) for t in tables}, world_size=1)
    ours = shard_modules(
        EmbeddingBagCollection(tables, device="meta"),
        plan=plan,
        fused_params={"optimizer": "sgd", "learning_rate": 0.01},
    )

    def raw_step() -> None:
        raw(values, offsets).sum().backward()

    def our_step() -> None:
        ours(kjt).values().sum().backward()

    raw_ms, our_ms = [], []
    for _ in range(args.repeat):
        raw_ms.append(timed(raw_step, args.warmup, args.steps))
        our_ms.append(timed(our_step, args.warmup, args.steps))
    raw_best, our_best = min(raw_ms), min(our_ms)
    print(
        f"tables={args.tables} rows={args.rows} dim={args.dim} batch={args.batch} "
        f"pooling={args.pooling} ids={values.numel()} threads={torch.get_num_threads()} "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}"
    )
    print("| side | median step ms (best of rounds) | rounds |")
    print("| --- | ---: | --- |")
    print(f"| raw FBGEMM TBE | {raw_best:.2f} | {', '.join(f'{m:.2f}' for m in raw_ms)} |")
    print(f"| shardplan | {our_best:.2f} | {', '.join(f'{m:.2f}' for m in our_ms)} |")
    print(f"overhead: {our_best / raw_best - 1:+.1%}")


if __name__ == "__main__":
    main()
