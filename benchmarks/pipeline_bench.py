"""Training step time with and without the pipeline: our ``TrainPipelineSparseDist`` vs our
unpipelined step vs TorchRec 1.8's ``TrainPipelineSparseDist`` (and its unpipelined step),
same plans, shapes and inputs, CPU gloo at world sizes 2 and 4.

    bash benchmarks/torchrec_env.sh                       # dev-only venv with torchrec 1.8.0
    .venv/bin/python benchmarks/pipeline_bench.py [--worlds 2 4] \
        [--plans table_wise row_wise column_wise mixed] [--tables 8] [--rows 100000] \
        [--dim 64] [--batch 512] [--pooling 8] [--blocks 3] [--warmup 2] [--steps 8] \
        [--repeats 3]

The model (the same class on both sides): an embedding-bag collection of ``--tables``
tables of ``--rows`` x ``--dim`` (one feature each, sum pooling, SGD at learning rate 0.01
fused into backward), sharded by the plan; its pooled output beside 13 dense features into
an MLP (``Linear(width + 13, 64)``, ReLU, ``Linear(64, 1)``) under
``DistributedDataParallel`` (TorchRec's ``DistributedModelParallel`` wraps it so; ours is
wrapped by hand), binary cross-entropy against 0/1 labels, dense SGD at 0.01. ``model(batch)``
returns ``(loss, logits)`` as TorchRec's pipeline wants; a batch is TorchRec's ``Batch``
(dense features, sparse features, labels) or ours with the same fields. Plans: every table
``table_wise`` on rank ``i % world``, ``row_wise`` (a row block per rank), ``column_wise`` (a
column shard per rank), or ``mixed`` (table ``i`` table-wise, row-wise, column-wise by
``i % 3``). Inputs per rank from a generator seeded with the rank: bag lengths uniform in
``0..2*pooling``, ids uniform over the rows, generated before timing.

A step: unpipelined, ``zero_grad``, forward, ``loss.backward()``, ``optimizer.step()``;
pipelined, one ``pipeline.progress(iterator)`` (the same work for one batch, with the next
batch's input distribution in the background). No barrier inside the timed loop (a barrier
would stop the overlap); ``time.perf_counter`` brackets each step on every rank, and a
step's time is the slowest rank's. One run (one implementation, plan and world size, in
fresh processes) alternates the two modes in ``--blocks`` blocks each (a block: a fresh
pipeline or the plain loop, ``--warmup`` untimed then ``--steps`` timed steps), so that the
load of a shared machine, which drifts, falls on both alike; the mode that goes first
alternates between blocks and between runs. Runs of our implementation and TorchRec's are
interleaved, ``--repeats`` each. Cells give the median over all timed steps of all runs
(p10-p90; each run's median); ratios are of those medians, with each run's own ratio after
them (a ratio within one run compares steps taken minutes apart at most).

As in runtime_vs_torchrec.py, the parent re-invokes this file for every run, ours under
``.venv/bin/python`` and TorchRec's under ``.venv-torchrec/bin/python``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.runtime_vs_torchrec import (
    CHILD_TIMEOUT_S,
    LEARNING_RATE,
    PG_TIMEOUT,
    PYTHONS,
    _cell,
    _free_port,
    _inputs,
    _tables,
    torchrec_dmp,
)

PLANS = ("table_wise", "row_wise", "column_wise", "mixed")
MODES = ("plain", "pipeline")
DENSE = 13
HIDDEN = 64


# --------------------------------------------------------------------------- the ranks


def _placements(tables: list[Any], plan: str, world: int, helpers: tuple[Any, ...]) -> dict:
    table_wise, row_wise, column_wise, kernel = helpers
    kinds = {"table_wise": 0, "row_wise": 1, "column_wise": 2}
    result = {}
    for i, t in enumerate(tables):
        kind = kinds[plan] if plan in kinds else i % 3
        if kind == 0:
            result[t.name] = table_wise(rank=i % world, **kernel)
        elif kind == 1:
            result[t.name] = row_wise(**kernel)
        else:
            result[t.name] = column_wise(ranks=list(range(world)), **kernel)
    return result


def _model_class() -> Any:
    """The model, over any embedding-bag collection (ours or TorchRec's)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Model(nn.Module):
        def __init__(self, ebc: nn.Module, width: int) -> None:
            super().__init__()
            self.ebc = ebc
            torch.manual_seed(0)
            self.over = nn.Sequential(
                nn.Linear(width + DENSE, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1)
            )

        def forward(self, batch: Any) -> tuple[Any, Any]:
            pooled = self.ebc(batch.sparse_features)
            x = torch.cat([pooled.values(), batch.dense_features], dim=1)
            logits = self.over(x).squeeze(1)
            return F.binary_cross_entropy_with_logits(logits, batch.labels), logits

    return Model


@dataclass
class OurBatch:
    dense_features: Any
    sparse_features: Any
    labels: Any

    def to(self, device: Any) -> OurBatch:
        return self  # CPU already


def _build_ours(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from runtime import (
        EmbeddingBagCollection,
        EmbeddingBagConfig,
        KeyedJaggedTensor,
        TrainPipelineSparseDist,
        column_wise,
        construct_module_plan,
        row_wise,
        shard_modules,
        table_wise,
    )

    tables = _tables(EmbeddingBagConfig, args)
    model = _model_class()(EmbeddingBagCollection(tables, device="meta"), args.tables * args.dim)
    helpers = (table_wise, row_wise, column_wise, {})
    plan = construct_module_plan(
        tables, _placements(tables, args.plan, args.world, helpers), world_size=args.world
    )
    fused = {"optimizer": "sgd", "learning_rate": LEARNING_RATE}
    shard_modules(model, plan=plan, device="cpu", fused_params=fused)
    model.over = DistributedDataParallel(model.over)
    optimizer = torch.optim.SGD(model.over.parameters(), lr=LEARNING_RATE)

    def pipeline() -> Any:
        return TrainPipelineSparseDist(model, optimizer, torch.device("cpu"))

    def batch(values: Any, lengths: Any, dense: Any, labels: Any) -> OurBatch:
        keys = [f"f{i}" for i in range(args.tables)]
        return OurBatch(dense, KeyedJaggedTensor.from_lengths_sync(keys, values, lengths), labels)

    return model, optimizer, pipeline, batch


def _build_torchrec(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.datasets.utils import Batch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.sharding_plan import column_wise, row_wise, table_wise
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LEARNING_RATE}
    tables = _tables(EmbeddingBagConfig, args)
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    model = _model_class()(ebc, args.tables * args.dim)
    sharder = EmbeddingBagCollectionSharder(fused_params=fused)
    helpers = (table_wise, row_wise, column_wise, {"compute_kernel": "fused"})
    per_table = _placements(tables, args.plan, args.world, helpers)
    dmp = torchrec_dmp(model, "ebc", ebc, per_table, sharder)
    optimizer = torch.optim.SGD(model.over.parameters(), lr=LEARNING_RATE)

    def pipeline() -> Any:
        return TrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"))

    def batch(values: Any, lengths: Any, dense: Any, labels: Any) -> Any:
        keys = [f"f{i}" for i in range(args.tables)]
        kjt = KeyedJaggedTensor.from_lengths_sync(keys, values, lengths)
        return Batch(dense_features=dense, sparse_features=kjt, labels=labels)

    return dmp, optimizer, pipeline, batch


BUILDERS = {"ours": _build_ours, "torchrec": _build_torchrec}


def _batches(args: argparse.Namespace, rank: int, make: Any) -> list[Any]:
    import torch

    generator = torch.Generator().manual_seed(1000 + rank)
    result = []
    for values, lengths in _inputs(args, rank):
        dense = torch.randn(args.batch, DENSE, generator=generator)
        labels = torch.randint(0, 2, (args.batch,), generator=generator).float()
        result.append(make(values, lengths, dense, labels))
    return result


def _time_plain(model: Any, optimizer: Any, batches: list[Any], warmup: int) -> list[float]:
    times = []
    for step, batch in enumerate(batches):
        start = time.perf_counter()
        optimizer.zero_grad()
        loss, logits = model(batch)
        loss.backward()
        optimizer.step()
        elapsed = time.perf_counter() - start
        if logits.shape != batch.labels.shape:
            raise AssertionError(f"logits {tuple(logits.shape)} for {batch.labels.shape} labels")
        if step >= warmup:
            times.append(elapsed)
    return times


def _time_pipeline(pipeline: Any, batches: list[Any], warmup: int) -> list[float]:
    """Steps of a fresh pipeline; TorchRec's is detached after (it rewrites the model's
    forward while attached, so the unpipelined mode could not run)."""
    times = []
    it = iter(batches)
    for step, batch in enumerate(batches):
        start = time.perf_counter()
        logits = pipeline.progress(it)
        elapsed = time.perf_counter() - start
        if logits.shape != batch.labels.shape:
            raise AssertionError(f"logits {tuple(logits.shape)} for {batch.labels.shape} labels")
        if step >= warmup:
            times.append(elapsed)
    try:
        pipeline.progress(it)
    except StopIteration:
        if hasattr(pipeline, "detach"):
            pipeline.detach()
        return times
    raise AssertionError("the pipeline trained more batches than it was given")


def _rank(rank: int, args: argparse.Namespace, port: int, result: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world, timeout=PG_TIMEOUT)
    try:
        model, optimizer, make_pipeline, make = BUILDERS[args.impl](args)
        row: dict[str, Any] = {"impl": args.impl, "plan": args.plan, "world": args.world}
        row |= {mode: [] for mode in MODES}
        for block in range(args.blocks):
            for mode in MODES if (block + args.first) % 2 == 0 else MODES[::-1]:
                batches = _batches(args, rank, make)
                dist.barrier()
                if mode == "plain":
                    times = _time_plain(model, optimizer, batches, args.warmup)
                else:
                    times = _time_pipeline(make_pipeline(), batches, args.warmup)
                slowest = torch.tensor(times, dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                row[mode] += [1000.0 * t for t in slowest.tolist()]
        if rank == 0:
            Path(result).write_text(json.dumps(row))
    finally:
        gc.collect()  # see runtime_vs_torchrec.py: the modules go before the group
        dist.destroy_process_group()


def run_child(args: argparse.Namespace) -> None:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        result = str(Path(tmp) / "result.json")
        mp.spawn(_rank, args=(args, _free_port(), result), nprocs=args.world, join=True)
        print(Path(result).read_text(), flush=True)


# --------------------------------------------------------------------------- the parent


def _run(impl: str, plan: str, world: int, first: int, args: argparse.Namespace) -> dict:
    python = PYTHONS[impl]
    if not python.exists():
        raise SystemExit(f"{python} is missing (for TorchRec: bash benchmarks/torchrec_env.sh)")
    command = [str(python), str(Path(__file__).resolve()), "--impl", impl, "--plan", plan]
    command += ["--world", str(world), "--first", str(first)]
    for name in ("tables", "rows", "dim", "batch", "pooling", "blocks", "warmup", "steps"):
        command += [f"--{name}", str(getattr(args, name))]
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(root))
    done = subprocess.run(
        command, env=env, cwd=root, capture_output=True, text=True, timeout=args.timeout
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"{impl} / {plan} / world {world} failed: exit {done.returncode}")
    return dict(json.loads(lines[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--plans", nargs="+", choices=PLANS, default=list(PLANS))
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64, help="a multiple of 4 x world size")
    parser.add_argument("--batch", type=int, default=512, help="local batch per rank")
    parser.add_argument("--pooling", type=int, default=8, help="mean ids per bag")
    parser.add_argument("--blocks", type=int, default=3, help="blocks per mode and run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per block")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per block")
    parser.add_argument("--repeats", type=int, default=3, help="runs per implementation")
    parser.add_argument("--timeout", type=int, default=CHILD_TIMEOUT_S, help="seconds per run")
    parser.add_argument("--impl", choices=sorted(BUILDERS), help=argparse.SUPPRESS)
    parser.add_argument("--plan", choices=PLANS, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for world in args.worlds:
        if args.dim % (4 * world):
            parser.error(f"--dim must be a multiple of {4 * world} (column shards, world {world})")
    if args.impl:
        run_child(args)
        return

    print(
        f"EmbeddingBagCollection + MLP under DDP, gloo on CPU (OMP_NUM_THREADS=1), "
        f"{args.tables} tables x {args.rows} rows x dim {args.dim}, local batch {args.batch}, "
        f"~{args.pooling} ids/bag, fused SGD; per run and mode {args.blocks} blocks of "
        f"{args.warmup} warm-up + {args.steps} timed steps (modes alternating), "
        f"{args.repeats} runs per implementation (interleaved); "
        "step = slowest rank; ms: median (p10-p90; run medians)\n"
    )
    print(
        "| world | plan | ours plain ms | ours pipelined ms | TorchRec plain ms | "
        "TorchRec pipelined ms | ours pipelined / plain | TorchRec pipelined / plain | "
        "ours / TorchRec pipelined |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    impls = ("ours", "torchrec")
    for world in args.worlds:
        for plan in args.plans:
            runs: dict[tuple[str, str], list[list[float]]] = {
                (impl, mode): [] for impl in impls for mode in MODES
            }
            for repeat in range(args.repeats):
                for impl in impls if repeat % 2 == 0 else reversed(impls):
                    row = _run(impl, plan, world, repeat % 2, args)
                    for mode in MODES:
                        runs[impl, mode].append(row[mode])
            cells = {key: _cell(value) for key, value in runs.items()}
            ratios = [
                _ratio(runs, ("ours", "pipeline"), ("ours", "plain")),
                _ratio(runs, ("torchrec", "pipeline"), ("torchrec", "plain")),
                _ratio(runs, ("ours", "pipeline"), ("torchrec", "pipeline")),
            ]
            cell = " | ".join(cells[impl, mode][1] for impl in impls for mode in MODES)
            print(f"| {world} | {plan} | {cell} | {' | '.join(ratios)} |", flush=True)


def _ratio(runs: dict, top: tuple[str, str], bottom: tuple[str, str]) -> str:
    """The ratio of the medians over all runs, then each run's (run i of one against run i
    of the other: for one implementation, the same processes)."""
    whole = statistics.median(sum(runs[top], [])) / statistics.median(sum(runs[bottom], []))
    each = ", ".join(
        f"{statistics.median(a) / statistics.median(b):.2f}"
        for a, b in zip(runs[top], runs[bottom], strict=True)
    )
    return f"**{whole:.2f}** ({each})"


if __name__ == "__main__":
    main()
