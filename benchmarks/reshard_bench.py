"""Moving a trained sharded module to another plan: in place (``reshard``) vs through a
checkpoint on disk (``save_checkpoint`` then ``load_checkpoint``) vs gathering every full
table on every rank and loading the new shards from them (``gather_state_dict`` +
``load_state_dict``, the only way before checkpoints and resharding existed).

    .venv/bin/python -m benchmarks.reshard_bench [--world 2] [--tables 8] [--rows 50000] \
        [--dim 64] [--optimizer rowwise_adagrad] [--repeats 3]

What is measured, at world size ``--world`` on CPU (spawned ranks, gloo over 127.0.0.1,
one intra-op thread each): ``--tables`` fp32 tables of ``--rows`` x ``--dim`` with
``--optimizer`` fused, sharded by an old plan, then moved to a new plan, for three pairs
(table-wise -> row-wise, column-wise -> table-wise, data-parallel -> row-wise). Each
method's time is the slowest rank's wall time from a barrier to the module under the new
plan being ready (the new module's construction included); the checkpoint goes to a
temporary directory on the local disk. Bytes: what ``reshard`` sent over all ranks (the
planner's transfers: weights and optimizer state) and the checkpoint's size on disk. The
methods run interleaved, ``--repeats`` times each after one untimed round, in one process
group; the table shows
medians and the ratio to ``reshard``. Every run checks, outside the timing, that each rank's
new shards equal the matching blocks of the full tables the old module started from.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

PAIRS = (("table_wise", "row_wise"), ("column_wise", "table_wise"), ("data_parallel", "row_wise"))
METHODS = ("reshard", "checkpoint", "gather")


def _plans(args: argparse.Namespace, tables: list[Any], kind: str) -> Any:
    from runtime import (
        column_wise,
        construct_module_plan,
        data_parallel,
        row_wise,
        table_wise,
    )

    world = args.world
    helpers = {
        "table_wise": lambda i: table_wise(rank=i % world),
        "row_wise": lambda i: row_wise(),
        "column_wise": lambda i: column_wise(list(range(world))),
        "data_parallel": lambda i: data_parallel(),
    }
    per_table = {t.name: helpers[kind](i) for i, t in enumerate(tables)}
    return construct_module_plan(tables, per_table, world_size=world)


def _rank(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    import torch

    from runtime import (
        EmbeddingBagCollection,
        EmbeddingBagConfig,
        load_checkpoint,
        reshard,
        save_checkpoint,
        shard_modules,
    )

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=args.world,
        timeout=datetime.timedelta(seconds=300),
    )
    tables = [
        EmbeddingBagConfig(f"t{i}", args.rows, args.dim, [f"f{i}"]) for i in range(args.tables)
    ]
    fused = {"optimizer": args.optimizer, "learning_rate": 0.01}
    reference = EmbeddingBagCollection(tables, seed=0)  # full tables: what every move must keep
    rows = []
    scratch = Path(out) / "checkpoints"
    for repeat in range(args.repeats + 1):  # the first round warms up, untimed
        for old, new in PAIRS:
            before = _plans(args, tables, old)
            after = _plans(args, tables, new)
            for method in METHODS:
                module = shard_modules(reference, plan=before, fused_params=fused)
                dist.barrier()
                start = time.perf_counter()
                moved_bytes = 0
                result = full = None
                if method == "reshard":
                    result = reshard(module, plan=after)
                    moved = result.module
                    moved_bytes = sum(result.sent.values())
                elif method == "checkpoint":
                    path = scratch / f"{old}-{repeat}"
                    save_checkpoint(module, path)
                    moved = shard_modules(
                        EmbeddingBagCollection(tables, device="meta"),
                        plan=after,
                        fused_params=fused,
                    )
                    load_checkpoint(moved, path)
                else:
                    full = module.gather_state_dict()
                    moved = shard_modules(
                        EmbeddingBagCollection(tables, device="meta"),
                        plan=after,
                        fused_params=fused,
                    )
                    moved.load_state_dict(full)
                dist.barrier()
                seconds = time.perf_counter() - start
                totals = [None] * args.world
                dist.all_gather_object(totals, (seconds, moved_bytes))
                for key, shard in moved.state_dict().items():
                    full = reference.state_dict()[key]
                    for (r0, c0), block in shard.local_shards:
                        want = full[r0 : r0 + block.shape[0], c0 : c0 + block.shape[1]]
                        assert torch.equal(block, want), (method, old, new, key, r0, c0)
                if rank == 0 and repeat > 0:
                    disk = 0
                    if method == "checkpoint":
                        disk = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
                        shutil.rmtree(path)
                    rows.append(
                        {
                            "pair": f"{old} -> {new}",
                            "method": method,
                            "seconds": max(t for t, _ in totals),
                            "sent": sum(b for _, b in totals),
                            "disk": disk,
                        }
                    )
                del module, moved, result, full
                gc.collect()
    if rank == 0:
        Path(out, "rows.json").write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--optimizer", default="rowwise_adagrad")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from tests.support.servers import free_port

    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(
            _rank, args=(args, free_port(), out), nprocs=args.world, start_method="spawn"
        )
        rows = json.loads(Path(out, "rows.json").read_text())
    size = args.tables * args.rows * args.dim * 4
    print(
        f"world {args.world}, {args.tables} tables of {args.rows:,} x {args.dim} fp32 "
        f"({size / 2**20:,.0f} MiB of weights), {args.optimizer}, {args.repeats} repeats\n"
    )
    print(
        "| old -> new | reshard | checkpoint (save + load) | gather + load "
        "| moved by reshard | checkpoint on disk |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for old, new in PAIRS:
        pair = f"{old} -> {new}"
        median = {
            m: statistics.median(
                r["seconds"] for r in rows if r["pair"] == pair and r["method"] == m
            )
            for m in METHODS
        }
        sent = max(r["sent"] for r in rows if r["pair"] == pair and r["method"] == "reshard")
        disk = max(r["disk"] for r in rows if r["pair"] == pair and r["method"] == "checkpoint")
        base = median["reshard"]
        print(
            f"| {pair} | {base:.2f} s | {median['checkpoint']:.2f} s "
            f"({median['checkpoint'] / base:.1f}x) | {median['gather']:.2f} s "
            f"({median['gather'] / base:.1f}x) | {sent / 2**20:,.0f} MiB "
            f"| {disk / 2**20:,.0f} MiB |"
        )


if __name__ == "__main__":
    main()
