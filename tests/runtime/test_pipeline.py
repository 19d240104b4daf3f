"""The pipelined training step (``TrainPipelineSparseDist``) against the unpipelined loop: on
one rank in this process, and on gloo process groups of 2 and 4 spawned processes (cases in
tests/runtime/pipeline_cases.py)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
from torch import nn

from runtime import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    KeyedJaggedTensor,
    PipelineBatchError,
    PipelineTimeoutError,
    TrainPipelineSparseDist,
    construct_module_plan,
    shard_modules,
    table_wise,
)
from tests.runtime import pipeline_cases as cases
from tests.support.distributed import run_ranks


def test_one_rank_pipeline_matches_the_unpipelined_loop_and_drains():
    cases.same_training(0, 1)


def test_one_rank_copy_of_the_features_falls_back_with_a_warning_and_same_results():
    cases.fallback(0, 1)


def test_a_model_without_sharded_modules_is_refused():
    with pytest.raises(TypeError, match="holds no ShardedEmbeddingBagCollection"):
        TrainPipelineSparseDist(nn.Linear(2, 1), None, "cpu")


def _tiny() -> nn.Module:
    tables = [EmbeddingBagConfig("t", 10, 4)]
    plan = construct_module_plan(tables, {"t": table_wise(0)}, world_size=1)
    return nn.ModuleDict({"ebc": shard_modules(EmbeddingBagCollection(tables), plan=plan)})


class _Bare(nn.Module):
    """Returns the pooled output alone, not (loss, output)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _tiny()

    def forward(self, batch):
        return self.body["ebc"](batch)


def test_a_model_that_does_not_return_loss_and_output_is_refused_naming_the_contract():
    kjt = KeyedJaggedTensor.from_lengths_sync(["t"], torch.tensor([1, 2]), torch.tensor([1, 1]))
    pipeline = TrainPipelineSparseDist(_Bare(), None, "cpu")
    with pytest.raises(TypeError, match=r"model\(batch\) to return \(loss, output\)"):
        pipeline.progress(iter([kjt]))


def test_sparse_features_naming_an_unknown_module_fails_that_batch_naming_the_modules():
    data = cases.batches(0, 1, 2)
    model, optimizer = cases.sharded_model(1)
    pipeline = TrainPipelineSparseDist(
        model, optimizer, "cpu", sparse_features=lambda b: {"pooled": b.sparse_features, "x": 1}
    )
    with pytest.raises(
        PipelineBatchError, match=r"named modules \['x'\].*\['pooled', 'sequence'\]"
    ):
        pipeline.progress(iter(data))


def test_modules_left_out_of_sparse_features_run_their_own_input_distribution():
    data = cases.batches(0, 1, 3)
    reference, reference_opt = cases.sharded_model(1)
    want = cases.unpipelined(reference, reference_opt, data)
    model, optimizer = cases.sharded_model(1)
    pipeline = TrainPipelineSparseDist(
        model, optimizer, "cpu", sparse_features=lambda b: {"pooled": b.sparse_features}
    )
    it = iter(data)
    got = [pipeline.progress(it).detach() for _ in data]
    assert pipeline.fallbacks == {}
    for logits, (_, want_logits) in zip(got, want, strict=True):
        assert torch.equal(logits, want_logits)
    with pytest.raises(StopIteration):
        pipeline.progress(it)


def test_eval_mode_runs_the_forward_only():
    data = cases.batches(0, 1, 2)
    model, optimizer = cases.sharded_model(1)
    before = model.pooled.gather_state_dict()
    model.eval()
    pipeline = TrainPipelineSparseDist(model, optimizer, "cpu")
    it = iter(data)
    first = pipeline.progress(it)
    assert first.shape == (data[0].labels.numel(),)
    pipeline.progress(it)
    after = model.pooled.gather_state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_pipelined_training_matches_the_unpipelined_loop_and_drains(world_size):
    run_ranks(cases.same_training, world_size)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_a_bad_id_on_one_rank_fails_that_batch_on_every_rank_and_training_goes_on(world_size):
    run_ranks(cases.bad_batch, world_size)


@pytest.mark.slow
def test_features_copied_by_the_model_fall_back_to_the_ordinary_path():
    run_ranks(cases.fallback, 2)


class _Flaky:
    """Batches, with one failure (an OSError, as a loader reading files may raise) before
    the batch at ``fail_at``."""

    def __init__(self, batches, fail_at: int) -> None:
        self.batches, self.fail_at, self.given = list(batches), fail_at, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.given == self.fail_at:
            self.fail_at = -1
            raise OSError("the loader could not read a shard")
        if self.given == len(self.batches):
            raise StopIteration
        self.given += 1
        return self.batches[self.given - 1]


def test_a_loader_error_propagates_and_no_batch_is_lost():
    data = cases.batches(0, 1, 3)
    reference, reference_opt = cases.sharded_model(1)
    want = cases.unpipelined(reference, reference_opt, data)
    model, optimizer = cases.sharded_model(1)
    pipeline = TrainPipelineSparseDist(model, optimizer, "cpu")
    it = _Flaky(data, fail_at=2)
    got = [pipeline.progress(it).detach()]
    with pytest.raises(OSError, match="could not read"):
        pipeline.progress(it)
    got += [pipeline.progress(it).detach() for _ in range(2)]
    with pytest.raises(StopIteration):
        pipeline.progress(it)
    for logits, (_, want_logits) in zip(got, want, strict=True):
        assert torch.equal(logits, want_logits)


class _SlowFeatures(KeyedJaggedTensor):
    """Features whose keys take a second to read: the background work outlives a short
    deadline whatever the machine's load."""

    def keys(self):
        time.sleep(1)
        return super().keys()

    def to(self, device):
        return self


def test_background_work_past_the_deadline_raises_instead_of_waiting():
    batch = cases.batches(0, 1, 1)[0]
    kjt = batch.sparse_features
    slow = _SlowFeatures(kjt.keys(), kjt.values(), kjt.lengths(), kjt.weights())
    model, optimizer = cases.sharded_model(1)
    pipeline = TrainPipelineSparseDist(model, optimizer, "cpu")
    pipeline.deadline = timedelta(seconds=0.2)
    slow_batch = cases.Batch(batch.dense_features, slow, batch.labels)
    with pytest.raises(PipelineTimeoutError, match=r"batch 0 did not finish within 0.2 s"):
        pipeline.progress(iter([slow_batch]))
