"""The work bound that knows a shard shares its rank with every table on every rank
(``pricing.shard_excluded_bound``): never above the true optimum, and above the plain work
bound where a whole table plus every rank's row-wise shares exceeds it."""

from __future__ import annotations

import random

from planner_service.solve.bounds.simple import simple_bounds
from planner_service.solve.deadline import Deadline
from planner_service.solve.pricing import shard_excluded_bound
from tests.solve.oracles import GIB, brute_force_optimum, problem_of
from tests.support.builders import request, table


def _draw(seed: int):
    """A row-wise table on every rank and two or three others, on two or three ranks."""
    rng = random.Random(seed)
    world = rng.choice([2, 3])
    tables = [
        table(
            "spread",
            rows=rng.choice([10**5, 10**6]),
            dim=64,
            pooling_factors=[rng.choice([5.0, 30.0])],
        ),
    ]
    tables += [
        table(
            f"t{i}",
            rows=rng.choice([10**3, 10**5, 10**6]),
            dim=rng.choice([32, 128]),
            pooling_factors=[rng.choice([1.0, 10.0, 40.0])],
        )
        for i in range(rng.choice([2, 3]))
    ]
    return request(
        tables,
        world_size=world,
        topology={"local_world_size": world, "hbm_bytes": rng.choice([1, 8]) * GIB},
        constraints={"tables": {"spread": {"sharding_types": ["row_wise"]}}},
    )


def test_the_bound_is_never_above_the_true_optimum_and_often_above_the_work_bound():
    raised = 0
    for seed in range(12):
        req = _draw(seed)
        problem, groups = problem_of(req)
        floor = max(b.value for b in simple_bounds(problem))
        optimum = brute_force_optimum(req, most=50_000)
        assert optimum < float("inf")
        bound = shard_excluded_bound(problem, groups, floor, Deadline.never())
        if bound is not None:
            assert floor < bound.value <= optimum * (1 + 1e-9), seed
            raised += 1
    assert raised >= 4  # half the draws, when this was written


def test_a_whole_table_beside_every_ranks_shares_raises_the_bound_to_its_split():
    """Two ranks each carry a row-wise table's half; a heavy table whole on one of them
    puts that rank far above the average, so the bound is what its split costs."""
    req = request(
        [
            table("spread", rows=10**6, dim=64, pooling_factors=[30.0]),
            table("heavy", rows=10**6, dim=128, pooling_factors=[40.0]),
        ],
        world_size=2,
        topology={"local_world_size": 2, "hbm_bytes": 8 * GIB},
        constraints={"tables": {"spread": {"sharding_types": ["row_wise"]}}},
    )
    problem, groups = problem_of(req)
    work, largest = simple_bounds(problem)
    bound = shard_excluded_bound(problem, groups, max(work.value, largest.value))
    optimum = brute_force_optimum(req)
    assert bound is not None and bound.value > 1.02 * max(work.value, largest.value)
    assert bound.value <= optimum * (1 + 1e-9)


def test_without_time_for_it_there_is_no_bound():
    req = _draw(0)
    problem, groups = problem_of(req)
    assert shard_excluded_bound(problem, groups, 0.0, Deadline(0.0)) is None
