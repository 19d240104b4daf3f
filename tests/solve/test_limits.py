"""The largest numbers types.py accepts go through estimation and solving without overflow:
every estimate finite, every byte count an int, and each request answered with a valid
plan or an explained infeasibility. (Past those numbers, hbm_bytes 10^30 or pooling
factors of 1e308 raised OverflowError in the solver, and bandwidths of 1e-300 an invalid
Perf; tests/plan/test_types.py and tests/service/test_hostile.py check that they are refused.)"""

from __future__ import annotations

import math

import pytest

from planner_service.costs.enumerate import enumerate_options, fit_options
from planner_service.plan.types import (
    MAX_BANDWIDTH_BYTES_PER_S,
    MAX_BATCH_SIZE,
    MAX_EMBEDDING_DIM,
    MAX_FEATURES_PER_TABLE,
    MAX_MEMORY_BYTES,
    MAX_NUM_EMBEDDINGS,
    MAX_POOLING_FACTOR,
    MAX_SEED,
    MAX_WORLD_SIZE,
    MIN_BANDWIDTH_BYTES_PER_S,
    PlanRequest,
)
from planner_service.solve.pipeline import solve
from planner_service.validate.validator import validate_plan
from tests.service.hostile import BANDWIDTHS
from tests.support.builders import request, table


def extreme(
    world_size: int, bandwidth: float, tables: list[dict], **topology: object
) -> PlanRequest:
    return request(
        tables,
        world_size=world_size,
        topology={
            "hbm_bytes": MAX_MEMORY_BYTES,
            "ddr_bytes": MAX_MEMORY_BYTES,
            **{field: bandwidth for field in BANDWIDTHS},
            **topology,
        },
        batch_size=MAX_BATCH_SIZE,
        options={"time_limit_s": 1.0, "seed": MAX_SEED},
    )


def largest_table(name: str = "big", **fields: object) -> dict:
    features = [f"{name}_{i}" for i in range(MAX_FEATURES_PER_TABLE)]
    return table(
        name,
        rows=MAX_NUM_EMBEDDINGS,
        dim=MAX_EMBEDDING_DIM,
        feature_names=features,
        pooling_factors=[MAX_POOLING_FACTOR] * len(features),
        batch_sizes=[MAX_BATCH_SIZE] * len(features),
        **fields,
    )


@pytest.mark.parametrize("bandwidth", [MIN_BANDWIDTH_BYTES_PER_S, MAX_BANDWIDTH_BYTES_PER_S])
def test_largest_table_on_the_largest_world_has_finite_estimates(bandwidth):
    req = extreme(MAX_WORLD_SIZE, bandwidth, [largest_table(optimizer="adam")], local_world_size=8)
    (entry,) = enumerate_options(req)
    assert len(entry.options) > 1
    for option in entry.options:
        for shard in set(option.shards):
            assert all(math.isfinite(perf.total) for perf in shard.perf)
            assert isinstance(shard.storage.hbm_bytes, int) and shard.storage.hbm_bytes >= 0
    fitted = fit_options(req, [entry])
    assert fitted.problems[0].table == "big"  # 2^40 x 65,536 fp32 fits no rank: explained


@pytest.mark.parametrize("bandwidth", [MIN_BANDWIDTH_BYTES_PER_S, MAX_BANDWIDTH_BYTES_PER_S])
def test_requests_at_every_limit_plan_or_explain(bandwidth):
    huge = extreme(2, bandwidth, [largest_table()])
    outcome = solve(huge)
    assert outcome.plan is None and outcome.infeasibility is not None
    assert outcome.infeasibility.reasons

    # Tables of 2^40 rows that each fit a rank of 8 PiB, with the slowest or fastest links.
    fitting = extreme(
        4, bandwidth, [table(f"t{i}", rows=MAX_NUM_EMBEDDINGS, dim=64) for i in range(6)]
    )
    outcome = solve(fitting)
    assert outcome.plan is not None, outcome.infeasibility
    assert validate_plan(fitting, outcome.plan) == []
    assert math.isfinite(outcome.plan.solver.objective)


def test_widest_table_splits_into_every_aligned_width():
    only_columns = {"sharding_types": ["column_wise"], "min_partition": 4}
    req = request(
        [table("wide", rows=1000, dim=MAX_EMBEDDING_DIM)],
        world_size=8,
        constraints={"tables": {"wide": only_columns}},
    )
    (entry,) = enumerate_options(req)
    widths = sorted({option.shards[0].sizes[1] for option in entry.options})
    assert widths == [2**k for k in range(2, 17)]
    narrowest = min(entry.options, key=lambda option: option.shards[0].sizes[1])
    assert len(narrowest.shards) == MAX_EMBEDDING_DIM // 4
