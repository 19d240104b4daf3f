"""Step time of our sharded runtime vs TorchRec 1.8's DistributedModelParallel, same plans.

    bash benchmarks/torchrec_env.sh                       # dev-only venv with torchrec 1.8.0
    .venv/bin/python benchmarks/runtime_vs_torchrec.py [--module pooled|sequence] \
        [--plans table_wise column_wise row_wise] [--tables 16] [--rows 100000] [--dim 64] \
        [--batch 512] [--pooling 8] [--warmup 5] [--steps 30] [--repeats 3]

What is measured: one training step of a sharded embedding collection on a local batch, with
the SGD optimizer fused into the FBGEMM backward (table-batched kernels on CPU, learning rate
0.01), at world size 2 on CPU: two spawned processes, gloo over 127.0.0.1, one intra-op
thread each (OMP_NUM_THREADS=1). ``--module pooled`` (the default) is an
``EmbeddingBagCollection`` (sum pooling), the step ``out.values().sum().backward()``;
``--module sequence`` is an ``EmbeddingCollection`` (a row per id), the step the sum over
features of each feature's rows' sum, then backward. Both implementations run the same plan
(every table ``table_wise`` on rank ``i % 2``; every table ``column_wise`` in two equal
column shards on ranks 0 and 1; or every table ``row_wise`` in two equal row blocks), the
same module shape (``--tables`` tables of ``--rows`` x ``--dim``, one feature each, fp32)
and the same inputs (per rank, a generator seeded with the rank: bag lengths -- ids per
sample and feature -- uniform in ``0..2*pooling``, ids uniform over the rows), generated
before timing. Each step starts after a barrier; ``time.perf_counter`` brackets forward +
backward on every rank, and a step's time is the slowest rank's. Every rank checks its
output's shapes after each step, outside the timing (pooled: ``[batch, sum of dims]``;
sequence: each feature's rows ``[its ids, dim]`` with the input's lengths). A run is
``--warmup`` untimed steps then ``--steps`` timed ones, in fresh processes; each
(implementation, plan) gets ``--repeats`` runs, interleaved with the other implementation's
(a 2-core machine drifts from run to run). The table gives the median over all timed steps
of all runs (with p10-p90 and each run's median) per implementation and plan, and the ratio
of the medians, ours / TorchRec (below 1: ours is faster).

TorchRec is never importable from our product's venv and our package (which needs pydantic)
is not importable from the TorchRec venv, so the parent process (any interpreter) re-invokes
this file for every run: ``--impl ours`` under ``.venv/bin/python`` and
``--impl torchrec`` under ``.venv-torchrec/bin/python``. Each child spawns the two ranks and
prints one JSON line, which the parent collects into a markdown table.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYTHONS = {
    "ours": ROOT / ".venv" / "bin" / "python",
    "torchrec": ROOT / ".venv-torchrec" / "bin" / "python",
}
PLANS = ("table_wise", "column_wise", "row_wise")
MODULES = ("pooled", "sequence")
WORLD_SIZE = 2
LEARNING_RATE = 0.01
CHILD_TIMEOUT_S = 300  # one (implementation, plan) run, spawn and set-up included
PG_TIMEOUT = timedelta(seconds=120)


# --------------------------------------------------------------------------- the ranks


def _inputs(args: argparse.Namespace, rank: int) -> list[tuple[Any, Any]]:
    """(values, lengths) of every step, feature-major lengths as KJTs take them."""
    import torch

    generator = torch.Generator().manual_seed(rank)
    batches = []
    for _ in range(args.warmup + args.steps):
        lengths = torch.randint(
            0, 2 * args.pooling + 1, (args.tables * args.batch,), generator=generator
        )
        values = torch.randint(0, args.rows, (int(lengths.sum()),), generator=generator)
        batches.append((values, lengths))
    return batches


def _tables(config: Any, args: argparse.Namespace) -> list[Any]:
    """The benchmark's tables as ``config`` objects (ours or TorchRec's: same fields)."""
    return [
        config(
            name=f"t{i}", num_embeddings=args.rows, embedding_dim=args.dim, feature_names=[f"f{i}"]
        )
        for i in range(args.tables)
    ]


def _per_table(
    tables: list[Any], plan: str, helpers: tuple[Any, Any, Any], **kernel: Any
) -> dict[str, Any]:
    """Each table's sharding by ``plan``, built with ``helpers`` (ours or TorchRec's
    ``table_wise``, ``column_wise``, ``row_wise``: same placements)."""
    table_wise, column_wise, row_wise = helpers
    every_rank = list(range(WORLD_SIZE))
    return {
        t.name: table_wise(rank=i % WORLD_SIZE, **kernel)
        if plan == "table_wise"
        else column_wise(ranks=every_rank, **kernel)
        if plan == "column_wise"
        else row_wise(**kernel)
        for i, t in enumerate(tables)
    }


def _build_ours(args: argparse.Namespace, plan: str) -> tuple[Any, Any]:
    from runtime import (
        EmbeddingBagCollection,
        EmbeddingBagConfig,
        EmbeddingCollection,
        EmbeddingConfig,
        KeyedJaggedTensor,
        column_wise,
        construct_module_plan,
        row_wise,
        shard_modules,
        table_wise,
    )

    if args.module == "sequence":
        tables = _tables(EmbeddingConfig, args)
        module: Any = EmbeddingCollection(tables, device="meta")
    else:
        tables = _tables(EmbeddingBagConfig, args)
        module = EmbeddingBagCollection(tables, device="meta")
    per_table = _per_table(tables, plan, (table_wise, column_wise, row_wise))
    module_plan = construct_module_plan(tables, per_table, world_size=WORLD_SIZE)
    fused = {"optimizer": "sgd", "learning_rate": LEARNING_RATE}
    sharded = shard_modules(module, plan=module_plan, pg=None, device="cpu", fused_params=fused)
    return sharded, KeyedJaggedTensor.from_lengths_sync


def _build_torchrec(args: argparse.Namespace, plan: str) -> tuple[Any, Any]:
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import (
        EmbeddingBagCollection,
        EmbeddingBagConfig,
        EmbeddingCollection,
        EmbeddingConfig,
        KeyedJaggedTensor,
    )
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.sharding_plan import column_wise, row_wise, table_wise

    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LEARNING_RATE}
    meta = torch.device("meta")
    if args.module == "sequence":
        tables = _tables(EmbeddingConfig, args)
        module: Any = EmbeddingCollection(tables=tables, device=meta)
        sharder: Any = EmbeddingCollectionSharder(fused_params=fused)
    else:
        tables = _tables(EmbeddingBagConfig, args)
        module = EmbeddingBagCollection(tables=tables, device=meta)
        sharder = EmbeddingBagCollectionSharder(fused_params=fused)
    per_table = _per_table(
        tables, plan, (table_wise, column_wise, row_wise), compute_kernel="fused"
    )
    return torchrec_dmp(module, "", module, per_table, sharder), KeyedJaggedTensor.from_lengths_sync


def torchrec_dmp(model: Any, path: str, module: Any, per_table: Any, sharder: Any) -> Any:
    """TorchRec's ``DistributedModelParallel`` of ``model`` over the default group (CPU),
    its collection ``module`` at ``path`` sharded by ``per_table`` with ``sharder``."""
    import torch
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    world = dist.get_world_size()
    module_plan = construct_module_sharding_plan(
        module, per_table, sharder=sharder, local_size=world, world_size=world, device_type="cpu"
    )
    assert dist.group.WORLD is not None
    return DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        plan=ShardingPlan({path: module_plan}),
        sharders=[sharder],
        device=torch.device("cpu"),
    )


BUILDERS = {"ours": _build_ours, "torchrec": _build_torchrec}


def _loss(out: Any, sequence: bool) -> Any:
    """The step's loss: the sum of the pooled output, or over features of their rows' sums."""
    if sequence:
        return sum(jagged.values().sum() for jagged in out.values())
    return out.values().sum()


def _output_shape(out: Any, args: argparse.Namespace, lengths: Any) -> list[int]:
    """The output's shape (pooled ``[batch, width]``, sequence ``[ids, dim]`` summed over
    features), checked against the input: every feature's rows and lengths are its own."""
    if args.module == "pooled":
        return list(out.values().shape)
    per_feature = lengths.view(args.tables, args.batch)
    got = dict(out.items())
    if sorted(got) != sorted(f"f{i}" for i in range(args.tables)):
        raise AssertionError(f"{args.impl} returned features {sorted(got)}")
    for i in range(args.tables):
        jagged = got[f"f{i}"]
        expected = (int(per_feature[i].sum()), args.dim)
        if tuple(jagged.values().shape) != expected or not bool(
            (jagged.lengths() == per_feature[i]).all()
        ):
            raise AssertionError(
                f"{args.impl}: feature f{i} gave rows {tuple(jagged.values().shape)} and "
                f"lengths {jagged.lengths().tolist()[:8]}...; expected rows {expected} and "
                f"lengths {per_feature[i].tolist()[:8]}..."
            )
    return [int(lengths.sum()), args.dim]


def _measure(args: argparse.Namespace) -> tuple[list[float], list[int]]:
    """Seconds of every timed step on this rank, and the output's shape."""
    import torch.distributed as dist

    module, make_kjt = BUILDERS[args.impl](args, args.plan)
    keys = [f"f{i}" for i in range(args.tables)]
    sequence = args.module == "sequence"
    times, shape = [], []
    for step, (values, lengths) in enumerate(_inputs(args, dist.get_rank())):
        kjt = make_kjt(keys, values, lengths)
        dist.barrier()
        start = time.perf_counter()
        out = module(kjt)
        _loss(out, sequence).backward()
        elapsed = time.perf_counter() - start
        shape = _output_shape(out, args, lengths)
        if step >= args.warmup:
            times.append(elapsed)
    return times, shape


def _rank(rank: int, args: argparse.Namespace, port: int, result: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE, timeout=PG_TIMEOUT)
    try:
        times, shape = _measure(args)
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if rank == 0:
            ms = [1000.0 * t for t in slowest.tolist()]
            row = {"impl": args.impl, "plan": args.plan, "ms": ms, "output": shape}
            Path(result).write_text(json.dumps(row))
    finally:
        # The sharded module (TorchRec's holds the process group in reference cycles) must be
        # gone before the group is destroyed: a gloo worker thread still alive at interpreter
        # exit can abort the process ("terminate called without an active exception").
        gc.collect()
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_child(args: argparse.Namespace) -> None:
    """One (implementation, plan): spawn the ranks, print rank 0's JSON line."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        result = str(Path(tmp) / "result.json")
        mp.spawn(_rank, args=(args, _free_port(), result), nprocs=WORLD_SIZE, join=True)
        print(Path(result).read_text(), flush=True)


# --------------------------------------------------------------------------- the parent


def _run(impl: str, plan: str, args: argparse.Namespace) -> dict[str, Any]:
    python = PYTHONS[impl]
    if not python.exists():
        raise SystemExit(f"{python} is missing (for TorchRec: bash benchmarks/torchrec_env.sh)")
    command = [str(python), str(Path(__file__).resolve()), "--impl", impl, "--plan", plan]
    command += ["--module", args.module]
    for name in ("tables", "rows", "dim", "batch", "pooling", "warmup", "steps"):
        command += [f"--{name}", str(getattr(args, name))]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        command,
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=args.timeout,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"{impl} / {plan} failed with exit status {done.returncode}")
    return dict(json.loads(lines[-1]))


def _cell(runs: list[list[float]]) -> tuple[float, str]:
    """Median over all timed steps of all runs; the cell also gives p10-p90 and each run's
    median (run-to-run spread)."""
    steps = [ms for run in runs for ms in run]
    median = statistics.median(steps)
    deciles = statistics.quantiles(steps, n=10, method="inclusive")  # within the data
    per_run = ", ".join(f"{statistics.median(run):.1f}" for run in runs)
    return median, f"{median:.2f} ({deciles[0]:.1f}-{deciles[-1]:.1f}; runs {per_run})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--module",
        choices=MODULES,
        default="pooled",
        help="pooled: EmbeddingBagCollection; sequence: EmbeddingCollection",
    )
    parser.add_argument("--tables", type=int, default=16)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64, help="a multiple of 8 (2 column shards)")
    parser.add_argument("--batch", type=int, default=512, help="local batch per rank")
    parser.add_argument(
        "--pooling", type=int, default=8, help="mean ids per bag (per sample and feature)"
    )
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per run")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per implementation and plan")
    parser.add_argument("--plans", nargs="+", choices=PLANS, default=list(PLANS))
    parser.add_argument("--timeout", type=int, default=CHILD_TIMEOUT_S, help="seconds per run")
    parser.add_argument("--impl", choices=sorted(BUILDERS), help=argparse.SUPPRESS)
    parser.add_argument("--plan", choices=PLANS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dim % (4 * WORLD_SIZE):
        parser.error(f"--dim must be a multiple of {4 * WORLD_SIZE}")
    if args.impl:
        run_child(args)
        return

    kind = "EmbeddingCollection" if args.module == "sequence" else "EmbeddingBagCollection"
    print(
        f"{kind}, world size {WORLD_SIZE} (gloo, CPU, OMP_NUM_THREADS=1), {args.tables} tables x "
        f"{args.rows} rows x dim {args.dim}, local batch {args.batch}, ~{args.pooling} ids/bag, "
        f"fused SGD; per run {args.warmup} warm-up + {args.steps} timed steps, {args.repeats} "
        "runs per cell (interleaved); step = slowest rank; ms: median (p10-p90; run medians)\n"
    )
    print("| plan | ours ms | TorchRec ms | ours / TorchRec |")
    print("|---|---|---|---|")
    impls = ("ours", "torchrec")
    for plan in args.plans:
        runs: dict[str, list[list[float]]] = {impl: [] for impl in impls}
        shapes = {}
        for repeat in range(args.repeats):
            for impl in impls if repeat % 2 == 0 else reversed(impls):
                row = _run(impl, plan, args)
                runs[impl].append(row["ms"])
                shapes[impl] = row["output"]
        if shapes["ours"] != shapes["torchrec"]:  # the same inputs give the same shapes
            raise SystemExit(f"{plan}: output shapes differ: {shapes}")
        (ours, ours_cell), (theirs, theirs_cell) = (_cell(runs[impl]) for impl in impls)
        print(f"| {plan} | {ours_cell} | {theirs_cell} | {ours / theirs:.2f} |", flush=True)


if __name__ == "__main__":
    main()
