"""The training job, one process per rank under torchrun, and its unsharded reference.

The job, on every rank: join the gloo group; ``load_plan`` (the same verified plan on every
rank, or the reason on every rank); build the model with its tables on the meta device;
``shard_modules`` (which checks the plan against the tables and the group before allocating
anything); load the starting weights; wrap the dense part in ``DistributedDataParallel``;
train. Every wait between ranks is bounded by ``--deadline-s``.

What a step computes. Rank r's loss is the mean binary cross-entropy over its own batch.
DDP averages the dense gradients over the ranks, so the dense part descends the mean loss
over the global batch (all ranks' samples). The sharded tables receive the SUM of every
rank's loss gradient (as TorchRec's do), which is ``world_size`` times the global mean's
gradient. The loss the job reports is that global mean, taken before the step's update.
The reference (``--reference``) computes exactly this in one process without sharding, on
the global batch (the ranks' batches one after another), so its losses are the job's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.functional import binary_cross_entropy_with_logits
from torch.nn.parallel import DistributedDataParallel

from planner_service.plan.types import ShardingPlan
from runtime import PlanLoadError, PlanMismatchError, load_plan, shard_modules

from dlrm import DLRM, Batch, ClickData, TableConfig, initial_weight, runtime_tables, state_key
from tables import TableSpec

# The dense part's optimizer for each fused embedding optimizer (torch has no row-wise
# Adagrad: dense weights take the element-wise one).
DENSE_OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "rowwise_adagrad": torch.optim.Adagrad,
    "adagrad": torch.optim.Adagrad,
    "adam": torch.optim.Adam,
}
REFUSAL_WAIT_S = 5.0
WINDOW = 10  # steps averaged for the start and end losses of the summary


def table_spec(args: argparse.Namespace) -> TableSpec:
    return TableSpec(args.features, args.scale, args.embedding_dim, args.optimizer, args.max_ids)


def build_model(args: argparse.Namespace, device: str | None) -> tuple[DLRM, list[TableConfig]]:
    configs = runtime_tables(table_spec(args))
    model = DLRM(configs, bottom=args.bottom_mlp, top=args.top_mlp, seed=args.seed, device=device)
    return model, configs


def load_initial_weights(sparse: nn.Module, configs: Sequence[TableConfig], seed: int) -> None:
    """Each table's starting weight, one table at a time (a sharded module keeps its slices)."""
    for table in configs:
        sparse.load_state_dict({state_key(table): initial_weight(table, seed)}, strict=False)


def click_data(args: argparse.Namespace, configs: Sequence[TableConfig]) -> ClickData:
    return ClickData(configs, batch_size=args.batch_size, max_ids=args.max_ids, seed=args.seed)


def dense_optimizer(
    args: argparse.Namespace, params: Iterable[nn.Parameter]
) -> torch.optim.Optimizer:
    return DENSE_OPTIMIZERS[args.optimizer](params, lr=args.lr)


# ------------------------------------------------------------------------------ the job


def run(args: argparse.Namespace) -> int:
    """One rank of the job (a job of one without torchrun); its exit status."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ["MASTER_PORT"] = str(_free_port())
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.deadline_s))
    try:
        return _train(args, dist.get_rank(), dist.get_world_size())
    finally:
        dist.destroy_process_group()


def _train(args: argparse.Namespace, rank: int, world_size: int) -> int:
    started = _start(args, rank)
    if isinstance(started, int):
        return started
    plan, model, configs = started
    progress = Progress(args.steps, args.batch_size * world_size) if rank == 0 else None
    losses, global_losses = _steps(args, model, click_data(args, configs), rank, progress)
    result = {
        "rank": rank,
        "world_size": world_size,
        "plan_id": plan.plan_id,
        "plan_source": str(args.plan),
        "features": args.features,
        "batch_size": args.batch_size,
        "losses": losses,
        "global_losses": global_losses,
    }
    if progress is not None:
        result["examples_per_s"] = progress.close(global_losses)
    _write_metrics(args.metrics_out, f"rank{rank}.json", result)
    return 0


def _start(
    args: argparse.Namespace, rank: int
) -> tuple[ShardingPlan, DLRM, list[TableConfig]] | int:
    """The plan and the sharded model with its starting weights, or the exit status of a
    rank that cannot train."""
    try:
        plan = load_plan(
            args.plan, server=args.server, cache_dir=args.cache_dir, deadline_s=args.deadline_s
        )
    except PlanLoadError as error:
        return _refuse(rank, error, args.deadline_s)
    source = "" if str(args.plan) == plan.plan_id else f" from {args.plan}"
    say(f"rank {rank}: plan {plan.plan_id}{source}: {_summary(plan)}")
    model, configs = build_model(args, device="meta")
    fused = {"optimizer": args.optimizer, "learning_rate": args.lr}
    try:
        shard_modules(model, plan=plan, fused_params=fused)
    except PlanMismatchError as error:
        return _refuse(rank, error, args.deadline_s)
    load_initial_weights(model.sparse, configs, args.seed)
    model.dense = DistributedDataParallel(model.dense)
    return plan, model, configs


def _steps(
    args: argparse.Namespace,
    model: DLRM,
    data: ClickData,
    rank: int,
    progress: Progress | None,
) -> tuple[list[float], list[float]]:
    """Train; this rank's losses and the global ones (the mean over the ranks)."""
    optimizer = dense_optimizer(args, model.dense.parameters())
    world_size = dist.get_world_size()
    losses, global_losses = [], []
    for step in range(args.steps):
        batch = data.batch(step, rank)
        loss = binary_cross_entropy_with_logits(
            model(batch.dense, batch.features(model.features)), batch.labels
        )
        optimizer.zero_grad()
        loss.backward()  # DDP averages the dense gradients; the tables update in here
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(loss.item())
        global_losses.append(total.item() / world_size)
        if progress is not None:
            progress.update(step, global_losses[-1])
    return losses, global_losses


def _refuse(rank: int, error: Exception, deadline_s: float) -> int:
    """Say why this rank cannot train, and give the exit status. The checks fail on every
    rank alike; the ranks leave together (waiting at most REFUSAL_WAIT_S), because torchrun
    stops every worker as soon as one exits, which could cut off a peer's reason."""
    say(f"rank {rank}: cannot start: {error}", sys.stderr)
    with contextlib.suppress(RuntimeError, dist.DistError):
        dist.monitored_barrier(timeout=timedelta(seconds=min(REFUSAL_WAIT_S, deadline_s)))
    return 1


def say(line: str, stream: TextIO | None = None) -> None:
    """``line`` in one write: the ranks share the terminal, and print() writes the line
    and its newline apart, so another rank's line could land between them."""
    stream = stream or sys.stdout
    stream.write(f"{line}\n")
    stream.flush()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _summary(plan: ShardingPlan) -> str:
    kinds = Counter(table.sharding_type.value for table in plan.tables.values())
    shown = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
    return f"{len(plan.tables)} tables on {plan.world_size} ranks ({shown})"


def _write_metrics(directory: Path | None, name: str, result: dict[str, Any]) -> None:
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(json.dumps(result, indent=2) + "\n")


class Progress:
    """Rank 0's progress bar on stderr: steps, the loss and examples/s (global: all ranks'
    samples), redrawn in place on a terminal, else a line every tenth of the run."""

    WIDTH = 20

    def __init__(self, steps: int, examples_per_step: int, stream: TextIO = sys.stderr) -> None:
        self.steps = steps
        self.examples_per_step = examples_per_step
        self.stream = stream
        self.live = stream.isatty()
        self.every = max(1, steps // 10)
        self.started = time.perf_counter()
        self.warm: float | None = None  # when the first step ended: it includes warm-up

    def examples_per_s(self, steps_done: int) -> float:
        """Over the steps after the first (over the first alone if it is the only one)."""
        now = time.perf_counter()
        if self.warm is None or steps_done == 1:
            return self.examples_per_step / max(now - self.started, 1e-9)
        return (steps_done - 1) * self.examples_per_step / max(now - self.warm, 1e-9)

    def update(self, step: int, loss: float) -> None:
        done = step + 1
        rate = self.examples_per_s(done)
        if self.warm is None:
            self.warm = time.perf_counter()
        filled = self.WIDTH * done // self.steps
        line = (
            f"step {done:>{len(str(self.steps))}}/{self.steps} "
            f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] "
            f"loss {loss:.4f}  {rate:,.0f} examples/s"
        )
        if self.live:
            self.stream.write(f"\r{line}")
        elif done % self.every == 0 or done == self.steps:
            self.stream.write(f"{line}\n")
        self.stream.flush()

    def close(self, losses: Sequence[float]) -> float:
        rate = self.examples_per_s(len(losses))
        if self.live:
            self.stream.write("\n")
        window = min(WINDOW, len(losses))
        first, last = mean(losses[:window]), mean(losses[-window:])
        say(
            f"trained {len(losses)} steps: loss {first:.4f} -> {last:.4f} (mean of the first "
            f"and last {window}), {rate:,.0f} examples/s"
        )
        return rate


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


# ------------------------------------------------------------------------ the reference


def reference(args: argparse.Namespace) -> int:
    """The job's steps in one process, unsharded, for ``--world-size`` ranks: each step's
    global batch is the ranks' batches one after another; the loss is the mean of the
    ranks' mean losses; the dense part steps on its gradient (DDP's average) and the tables
    on ``world_size`` times it (the sum of the ranks' gradients), with SGD written in torch."""
    world_size = args.world_size
    model, configs = build_model(args, device=None)
    load_initial_weights(model.sparse, configs, args.seed)
    tables = list(model.sparse.parameters())
    optimizer = dense_optimizer(args, model.dense.parameters())
    data = click_data(args, configs)
    rank_losses, global_losses = [], []
    for step in range(args.steps):
        parts = [data.batch(step, rank) for rank in range(world_size)]
        whole = Batch.concat(parts)
        logits = model(whole.dense, whole.features(model.features))
        per_rank = [
            binary_cross_entropy_with_logits(part_logits, part.labels)
            for part_logits, part in zip(logits.split(args.batch_size), parts, strict=True)
        ]
        loss = torch.stack(per_rank).mean()
        optimizer.zero_grad()
        for weight in tables:
            weight.grad = None
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            for weight in tables:
                assert weight.grad is not None
                weight.sub_(args.lr * world_size * weight.grad)
        rank_losses.append([part.item() for part in per_rank])
        global_losses.append(loss.item())
        say(f"step {step + 1}/{args.steps} loss {loss.item():.6f}")
    _write_metrics(
        args.metrics_out,
        "reference.json",
        {"world_size": world_size, "rank_losses": rank_losses, "global_losses": global_losses},
    )
    return 0
