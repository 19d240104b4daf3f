"""``TrainPipelineSparseDist``: training steps whose next batch's input distribution runs
while the current batch trains (see docs/runtime.md, "Pipelined training").

Each step of ``progress`` trains batch ``i`` on the calling thread (forward, backward with
the fused embedding optimizers, then the dense optimizer) while a background thread checks
batch ``i + 1``'s ids and runs its input all-to-alls on a process group of its own (one per
group the sharded modules run on, created when the pipeline is built, by every rank in the
same order). Each group sees its collectives in the same order on every rank, so the two
threads never cross. When the model then calls a sharded module with that batch's
features, the module uses the ids it already received.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any, Generic, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from runtime.comm import Group
from runtime.sharding.inputs import LocalBatch
from runtime.sharding.module import (
    InputContext,
    ShardedEmbeddingBagCollection,
    ShardedEmbeddingCollection,
)
from runtime.sparse import KeyedJaggedTensor

__all__ = ["PipelineBatchError", "PipelineTimeoutError", "TrainPipelineSparseDist"]

Batch = TypeVar("Batch")
Output = TypeVar("Output")
Sharded = ShardedEmbeddingBagCollection | ShardedEmbeddingCollection
SparseFeatures = Callable[[Any], KeyedJaggedTensor | Mapping[str, KeyedJaggedTensor]]

# How much longer than the collectives' own timeout a step waits for the background work
# (the collectives fail first; this only guards against a stuck thread).
DEADLINE_MARGIN = timedelta(seconds=30)


class PipelineBatchError(ValueError):
    """A batch failed its input checks (an id outside its table, a missing feature, ...) on
    one or more ranks. Every rank raises it, from the ``progress`` call that would have
    trained that batch; the batch is skipped and the next ``progress`` goes on with the
    batches after it."""

    def __init__(self, message: str, batch: int, failures: Mapping[int, str]) -> None:
        super().__init__(message)
        self.batch = batch
        self.failures = dict(failures)  # rank -> its error


class PipelineTimeoutError(RuntimeError):
    """A batch's input distribution did not finish within the process group's timeout."""


def default_sparse_features(batch: Any) -> KeyedJaggedTensor:
    """The batch itself if it is a ``KeyedJaggedTensor``, else its ``sparse_features``
    attribute (TorchRec's ``Batch``)."""
    if isinstance(batch, KeyedJaggedTensor):
        return batch
    features = getattr(batch, "sparse_features", None)
    if not isinstance(features, KeyedJaggedTensor):
        raise TypeError(
            f"the batch ({type(batch).__name__}) has no sparse_features KeyedJaggedTensor; "
            "pass sparse_features=callable(batch) -> KeyedJaggedTensor (or {module path: "
            "KeyedJaggedTensor}) to TrainPipelineSparseDist"
        )
    return features


class _Staged:
    """One batch in the pipeline: the batch, its index, and its input distribution running
    on a background thread (``contexts`` once done, or ``error``)."""

    def __init__(self, batch: Any, index: int) -> None:
        self.batch = batch
        self.index = index
        self.contexts: dict[str, InputContext] = {}
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    def wait(self, deadline: timedelta) -> dict[str, InputContext]:
        if self.thread is not None:
            self.thread.join(deadline.total_seconds())
            if self.thread.is_alive():
                raise PipelineTimeoutError(
                    f"the input distribution of batch {self.index} did not finish within "
                    f"{deadline.total_seconds():g} s"
                )
        if self.error is not None:
            raise self.error
        return self.contexts


class TrainPipelineSparseDist(Generic[Batch, Output]):
    """Train ``model`` one batch per ``progress`` call, the next batch's input distribution
    overlapping the current batch's forward, backward and optimizer step.

    ``model(batch)`` must return ``(loss, output)``; ``progress`` runs ``zero_grad``, the
    forward, ``loss.sum().backward()`` (the fused embedding optimizers update the tables in
    it) and ``optimizer.step()`` (``optimizer`` is the dense parameters' optimizer, or
    ``None``), and returns ``output``. In eval mode (``model.eval()``) it runs the forward
    only. ``sparse_features(batch)`` gives the ``KeyedJaggedTensor`` the model passes to
    every sharded module, or ``{module path: KeyedJaggedTensor}`` (paths as in
    ``named_modules``; a module left out is not pipelined); by default the batch's
    ``sparse_features`` attribute, or the batch itself if it is a ``KeyedJaggedTensor``.
    Batches with a ``to`` method are moved to ``device`` when fetched.

    Build it on every rank in the same order relative to other process groups: it creates
    a process group for the background collectives (``dist.new_group``)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        device: torch.device | str,
        *,
        sparse_features: SparseFeatures = default_sparse_features,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.sparse_features = sparse_features
        self.modules: dict[str, Sharded] = {
            path: module
            for path, module in model.named_modules()
            if isinstance(module, ShardedEmbeddingBagCollection | ShardedEmbeddingCollection)
        }
        if not self.modules:
            raise TypeError(
                f"{type(model).__name__} holds no ShardedEmbeddingBagCollection or "
                "ShardedEmbeddingCollection (shard it with shard_modules first); nothing to "
                "pipeline"
            )
        sides: dict[int, Group] = {}  # one background group per group the modules run on
        for module in self.modules.values():
            if id(module.group.pg) not in sides:
                sides[id(module.group.pg)] = _side_group(module.group)
        self._groups = {path: sides[id(m.group.pg)] for path, m in self.modules.items()}
        self.deadline = max(g.timeout for g in self._groups.values()) + DEADLINE_MARGIN
        self.fallbacks: dict[str, int] = {}  # module path -> batches it distributed itself
        self._next: _Staged | None = None
        self._fetched = 0

    # ---- the step

    def progress(self, dataloader_iter: Iterator[Batch]) -> Output:
        """Train the next batch and return the model's output for it; raises
        ``StopIteration`` once the iterator is exhausted and every batch fetched from it is
        trained."""
        if self._next is None:
            first = self._fetch(dataloader_iter)
            if first is None:
                raise StopIteration
            self._next = first
        current, self._next = self._next, None
        contexts = current.wait(self.deadline)
        try:
            self._next = self._fetch(dataloader_iter)
        except BaseException:  # the loader failed: batch i is still the next to train
            self._next = current
            raise
        try:
            return self._train(current.batch, contexts)
        except BaseException:
            self._drain()
            raise

    def _train(self, batch: Any, contexts: dict[str, InputContext]) -> Output:
        for path, context in contexts.items():
            self.modules[path].stage(context)
        training = self.model.training
        if training and self.optimizer is not None:
            self.optimizer.zero_grad()
        try:
            result = self.model(batch)
        finally:
            for path in contexts:
                if self.modules[path].unstage():  # the model called it with other features
                    self._fell_back(path)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TypeError(
                f"the model returned {type(result).__name__}; TrainPipelineSparseDist needs "
                "model(batch) to return (loss, output)"
            )
        loss, output = result
        if training:
            loss.sum().backward()
            if self.optimizer is not None:
                self.optimizer.step()
        return output  # type: ignore[no-any-return]

    def _fell_back(self, path: str) -> None:
        if path not in self.fallbacks:
            warnings.warn(
                f"the model called sharded module {path!r} with other features than "
                "sparse_features(batch) gave (not the same KeyedJaggedTensor object), so it "
                "ran its input distribution again, not overlapped; results are unchanged",
                RuntimeWarning,
                stacklevel=4,
            )
        self.fallbacks[path] = self.fallbacks.get(path, 0) + 1

    def _drain(self) -> None:
        """After a failed step: let the next batch's background work finish (its collectives
        are already under way on every rank), then drop it."""
        pending, self._next = self._next, None
        if pending is not None and pending.thread is not None:
            pending.thread.join(self.deadline.total_seconds())

    # ---- the next batch

    def _fetch(self, dataloader_iter: Iterator[Batch]) -> _Staged | None:
        try:
            batch: Any = next(dataloader_iter)
        except StopIteration:
            return None
        if callable(getattr(batch, "to", None)):
            batch = batch.to(self.device)
        staged = _Staged(batch, self._fetched)
        self._fetched += 1
        features: dict[str, KeyedJaggedTensor] = {}
        failure = ""
        try:
            features = self._features_of(batch)
        except Exception as error:  # the other ranks hear of it before any all-to-all
            failure = f"{type(error).__name__}: {error}"
        staged.thread = threading.Thread(
            target=self._distribute,
            args=(staged, features, failure),
            name=f"input-dist-{staged.index}",
            daemon=True,
        )
        staged.thread.start()
        return staged

    def _features_of(self, batch: Any) -> dict[str, KeyedJaggedTensor]:
        given = self.sparse_features(batch)
        if isinstance(given, KeyedJaggedTensor):
            return dict.fromkeys(self.modules, given)
        unknown = sorted(set(given) - set(self.modules))
        if unknown:
            raise ValueError(
                f"sparse_features named modules {unknown} that are not sharded modules of "
                f"the model (its sharded modules: {sorted(self.modules)})"
            )
        return {path: given[path] for path in self.modules if path in given}

    def _distribute(
        self, staged: _Staged, features: dict[str, KeyedJaggedTensor], failure: str
    ) -> None:
        """Background thread: check every module's input, agree on the outcome with the
        other ranks, then run the input all-to-alls."""
        try:
            prepared: dict[str, LocalBatch] = {}
            for path, kjt in features.items():
                if failure:
                    break
                try:
                    prepared[path] = self.modules[path].inputs.prepare(kjt)
                except Exception as error:  # every rank must hear of it before any all-to-all
                    failure = f"{type(error).__name__}: {error}"
                    break
            self._agree(staged.index, failure)
            for path, local in prepared.items():
                module = self.modules[path]
                staged.contexts[path] = module.distribute(features[path], local, self._groups[path])
        except BaseException as error:
            staged.error = error

    def _agree(self, index: int, failure: str) -> None:
        """Every rank learns whether any rank's input checks failed, in one all-reduce per
        group; if so each raises ``PipelineBatchError`` naming the ranks and their errors."""
        for group in {id(g): g for g in self._groups.values()}.values():
            if group.world_size == 1:
                failures = {group.rank: failure} if failure else {}
            else:
                flag = torch.tensor([1 if failure else 0], dtype=torch.int64)
                dist.all_reduce(flag, group=group.pg)
                failures = {}
                if int(flag):
                    said = group.all_gather_object(failure)
                    failures = {rank: text for rank, text in enumerate(said) if text}
            if failures:
                named = "; ".join(f"rank {r}: {text}" for r, text in sorted(failures.items()))
                raise PipelineBatchError(
                    f"batch {index} failed its input checks ({named}); it is skipped",
                    index,
                    failures,
                )


def _side_group(group: Group) -> Group:
    """A new process group over ``group``'s ranks for the background collectives; on one
    rank, no group."""
    if group.world_size == 1 or group.pg is None:
        return Group(None)
    ranks = sorted(dist.get_global_rank(group.pg, r) for r in range(group.world_size))
    pg = dist.new_group(ranks, timeout=group.timeout)
    side = Group(pg, group.timeout)
    if side.rank != group.rank:  # new_group orders members by global rank, as the group does
        raise RuntimeError(
            f"the pipeline's group orders rank {group.rank} as {side.rank}; the module's "
            "process group must list its ranks in increasing global rank"
        )
    return side
