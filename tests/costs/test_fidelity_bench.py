"""The fidelity benchmark's bookkeeping (``benchmarks/fidelity_bench.py``): which plans count
as distinct, how rounds of measurements become a plan's step, and how their noise is told.
The measurements themselves are the benchmark's, not a test's."""

from __future__ import annotations

import pytest

from benchmarks import fidelity_bench as bench
from planner_service.plan.types import CostModel, ShardingType
from planner_service.solve.pipeline import solve


def _plans(kinds: dict[str, list[str]]) -> bench.ShardingPlan:
    document = bench.base_request(
        [bench._table("a", 4_000, 32, 4.0), bench._table("b", 400, 16, 2.0)], 2, 64, 2.0
    )
    outcome = solve(bench.constrained(document, kinds))
    assert outcome.plan is not None
    return outcome.plan


def test_a_column_wise_table_left_whole_is_the_table_wise_plan() -> None:
    """One shard of every column runs as the table-wise table does: the same key, so the
    benchmark does not count it as another plan; a real split keeps its own key."""
    whole = _plans({"a": ["column_wise"], "b": ["column_wise"]})
    assert all(t.column_widths is not None for t in whole.tables.values())
    as_table_wise = whole.model_copy(
        update={
            "tables": {
                name: t.model_copy(
                    update={"sharding_type": ShardingType.TABLE_WISE, "column_widths": None}
                )
                for name, t in whole.tables.items()
            }
        }
    )
    assert bench._key(whole) == bench._key(as_table_wise)
    split = whole.tables["a"].model_copy(update={"column_widths": [(16, 2)]})
    assert bench._executed(split)["sharding_type"] == "column_wise"
    assert bench._executed(whole.tables["a"])["sharding_type"] == "table_wise"
    table_wise = _plans({"a": ["table_wise"], "b": ["table_wise"]})
    row_wise = _plans({"a": ["row_wise"], "b": ["table_wise"]})
    assert bench._key(row_wise) != bench._key(table_wise)


def _candidate(rounds: list[float]) -> bench.Candidate:
    plan = _plans({"a": ["table_wise"], "b": ["table_wise"]})
    candidate = bench.Candidate("plan", plan)
    candidate.rounds_ms = rounds
    candidate.rounds_ranks_ms = [[ms, ms - 1.0] for ms in rounds]
    bench.settle(candidate)
    return candidate


def test_a_plans_step_is_the_median_of_its_rounds() -> None:
    candidate = _candidate([30.0, 20.0, 22.0])
    assert candidate.measured_ms == 22.0
    assert candidate.measured_ranks_ms == [22.0, 21.0]


def test_noise_is_the_rounds_spread_and_their_agreement() -> None:
    """Spread: (slowest − fastest round) / median, the median over plans; ρ between the
    first two rounds: 1 when they order the plans alike, −1 when reversed."""
    agreeing = [_candidate([10.0, 11.0, 12.0]), _candidate([20.0, 22.0, 21.0])]
    agreeing.append(_candidate([30.0, 33.0, 30.0]))
    noise = bench.noise(agreeing)
    assert noise.rho_between_rounds == pytest.approx(1.0)
    assert noise.spread == pytest.approx(0.1)
    reversed_ = [_candidate([10.0, 30.0]), _candidate([30.0, 10.0])]
    assert bench.noise(reversed_).rho_between_rounds == pytest.approx(-1.0)
    assert bench.noise([_candidate([10.0])]).rho_between_rounds is None


def test_every_model_is_scored() -> None:
    candidates = [_candidate([10.0]), _candidate([12.0])]
    for i, c in enumerate(candidates):
        c.predicted_ms = {m: 1.0 + i for m in bench.MODELS}
        c.predicted_ranks_ms = {m: [1.0 + i, 0.5] for m in bench.MODELS}
    candidates[0].models.append(CostModel.CALIBRATED)
    scores = {s.model: s for s in bench.scores(candidates)}
    assert scores[CostModel.CALIBRATED].rho == pytest.approx(1.0)
    assert scores[CostModel.CALIBRATED].regret == pytest.approx(1.0)
    assert scores[CostModel.SHARDPLAN].regret is None


def test_a_rounds_plans_run_side_by_side_in_their_order_or_apart() -> None:
    """Side by side: the candidates in runs that keep their order and hold every one once
    (as many in a run as this machine's memory holds); ``--apart``: one a run."""
    candidates = [_candidate([10.0]), _candidate([20.0]), _candidate([30.0])]
    runs = bench.groups(candidates)
    assert [c for run in runs for c in run] == candidates and all(runs)
    assert bench.groups(candidates, apart=True) == [[c] for c in candidates]
