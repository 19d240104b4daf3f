"""Structures that make large problems tractable: runs of equal shards, distinct rank rows, vectorised loads."""

from __future__ import annotations

import numpy as np
import pytest

from planner_service.costs.enumerate import enumerate_options
from planner_service.costs.options import Placement
from planner_service.solve.pipeline import solve
from tests.solve.oracles import (
    brute_force_optimum,
    problem_of,
    solved,
)
from tests.support.builders import request, table


def _loaded_state(problem, seed):
    """A state with random loads and memory already on every rank."""
    import numpy as np

    from planner_service.solve.placement import State

    rng = np.random.default_rng(seed)
    state = State(
        rng.random(problem.world_size),
        (rng.random(problem.world_size) * problem.hbm_cap * 0.9).astype(np.int64),
        np.zeros(problem.world_size, np.int64),
    )
    state.max_perf = float(state.perf.max())
    state.free_hbm, state.free_bytes = problem.hbm_total, problem.hbm_total + problem.ddr_total
    return state


@pytest.mark.parametrize("seed", range(6))
def test_column_shards_on_every_host_at_once_place_as_host_by_host(seed):
    from planner_service.solve import placement

    req = request(
        [table("t", rows=400_000, dim=128)],
        world_size=16,
        topology={"local_world_size": 4, "hbm_bytes": 2**28},
        constraints={"tables": {"t": {"sharding_types": ["table_column_wise"]}}},
    )
    problem, _ = problem_of(req)
    state = _loaded_state(problem, seed)
    every = placement.Where(set(range(16)), np.arange(16), None)
    for index, option in enumerate(problem.tables[0].options):
        costs = problem.costs(option)
        best = None  # host by host, as for restricted ranks
        for host in range(problem.num_hosts):
            ranks = placement._place_free(
                problem, state, costs, np.arange(host * 4, host * 4 + 4), None
            )
            score = ranks and placement._score(problem, state, costs, ranks, index, 0.5)
            if score and (
                best is None or placement._between_hosts(score) < placement._between_hosts(best[0])
            ):
                best = (score, ranks)
        found = placement.try_option(problem, state, every, index, option, 0.5)
        if best is None:
            assert found is None
            continue
        assert found is not None and found.choice.ranks == best[1]
        assert found.score == pytest.approx(best[0])


@pytest.mark.parametrize("seed", range(4))
def test_options_on_every_rank_score_as_any_placement(seed):
    from planner_service.solve import placement

    req = request([table("t", rows=3_000_000, dim=64)], world_size=8)
    problem, _ = problem_of(req)
    state = _loaded_state(problem, seed)
    every = placement.Where(set(range(8)), np.arange(8), None)
    fixed = [
        (i, o) for i, o in enumerate(problem.tables[0].options) if o.placement is Placement.FIXED
    ]
    assert fixed
    for index, option in fixed:
        found = placement.try_option(problem, state, every, index, option, 0.1)
        score = placement._score(
            problem, state, problem.costs(option), problem.every_rank, index, 0.1
        )
        assert (found.score if found else None) == score


def test_an_option_lists_its_shards_as_runs_of_equal_ones():
    req = request([table("t", rows=1_000_003, dim=64)], world_size=6)
    (entry,) = enumerate_options(req)
    for option in entry.options:
        expanded = [shard for shard, count in option.runs for _ in range(count)]
        assert list(option.shards) == expanded
        assert len(option.runs) <= 3


def test_distinct_rank_rows_are_found_as_numpy_finds_them():
    from planner_service.solve.bounds.lp import _first_of_each

    rng = np.random.default_rng(0)
    matrix = rng.integers(0, 3, size=(200, 5)).astype(float)
    weights = rng.random((5, 2))
    _, first = np.unique(matrix, axis=0, return_index=True)
    assert _first_of_each(matrix @ weights) == sorted(first.tolist())
    column = rng.integers(0, 2, size=200).astype(float)
    _, first = np.unique(np.column_stack([column, matrix]), axis=0, return_index=True)
    assert _first_of_each(np.column_stack([matrix @ weights, column])) == sorted(first.tolist())


@pytest.mark.parametrize("overrides", [False, True], ids=["one device class", "two classes"])
def test_rank_shares_built_in_blocks_are_those_built_whole(monkeypatch, overrides):
    """Beyond ``DENSE_SHARE_ENTRIES`` the fixed options' per-rank shares are built a block
    of options at a time (1.2 GB a matrix at 10,000 x 4,096): the same distinct heaviest
    ranks, the same rows and least shares as the whole matrix gives."""
    from planner_service.solve.bounds import lp

    tables = [
        table(f"t{i}", rows=100_003 * (i + 1) + 7 * i, dim=32 * (1 + i % 3), pooling_factors=[4.0])
        for i in range(12)
    ]
    topology = {"rank_overrides": [{"rank": 3, "hbm_bw_bytes_per_s": 2**38}]} if overrides else {}
    problem, _ = problem_of(request(tables, world_size=16, topology=topology))
    assert (len(problem.classes.specs) == 2) is overrides
    fixed = [
        problem.costs(o)
        for entry in problem.tables
        for o in entry.options
        if o.placement is Placement.FIXED
    ]
    assert len(fixed) >= 12
    capacity = np.linspace(1.0, 2.0, problem.world_size)

    def shares(**kwargs):
        return (
            lp._RankShares(fixed, problem, lambda e, c: e.perf[c].total, by_class=True),
            lp._RankShares(
                fixed, problem, lambda e, _: float(e.storage.hbm_bytes), capacity=capacity
            ),
        )

    whole = shares()
    monkeypatch.setattr(lp, "DENSE_SHARE_ENTRIES", 5 * problem.world_size)  # blocks of 5
    blocks = shares()
    for dense, blocked in zip(whole, blocks, strict=True):
        assert dense.dense is not None and blocked.dense is None
        assert blocked.least.tolist() == dense.least.tolist()
        for most in (1, 3, 100):
            ranks = dense.heaviest(most)
            assert blocked.heaviest(most) == ranks
            for r in ranks:
                assert blocked.row(r).tolist() == dense.row(r).tolist()
    # The perf rows are the shares the options' own arrays give on each rank.
    perf = whole[0]
    for i, costs in enumerate(fixed):
        assert perf.dense[:, i].tolist() == costs.fixed_cost.tolist()


def test_an_lp_with_fewer_rank_rows_is_looser_and_still_a_bound(monkeypatch):
    from planner_service.solve.bounds import lp

    tables = [
        table(f"t{i}", rows=200_003 * (i + 1), dim=32, pooling_factors=[4.0]) for i in range(6)
    ]
    req = request(tables, world_size=7, topology={"hbm_bytes": 2**30})
    problem, groups = problem_of(req)
    full = lp.LinearRelaxation(problem, groups).solve()
    monkeypatch.setattr(lp, "MAX_RANK_ROW_COEFFICIENTS", 1)  # one row per tier
    capped = lp.LinearRelaxation(problem, groups).solve()
    assert full is not None and capped is not None
    assert capped.bound.value <= full.bound.value * (1 + 1e-9)
    assert full.bound.value <= brute_force_optimum(req, most=200_000) * (1 + 1e-9)


def test_rank_io_sums_every_shards_buffers_on_its_rank():

    tables = [table(f"t{i}", rows=50_000 * (i + 1), dim=32 * (i % 3 + 1)) for i in range(8)]
    req = request(tables, world_size=6, topology={"local_world_size": 3, "hbm_bytes": 2**27})
    problem, _ = problem_of(req)
    outcome = solve(req)
    assert outcome.plan is not None
    expected = [[0, 0] for _ in range(6)]
    for entry in problem.tables:
        sharding = outcome.plan.tables[entry.table.name]
        (option,) = [
            o
            for o in entry.options
            if o.sharding_type == sharding.sharding_type
            and o.compute_kernel == sharding.compute_kernel
            and [list(s.sizes) for s in o.shards] == [list(s.sizes) for s in sharding.shards]
        ]
        for shard, placed in zip(option.shards, sharding.shards, strict=True):
            expected[placed.rank][0] += shard.storage.input_bytes
            expected[placed.rank][1] += shard.storage.output_bytes
    assert [list(io) for io in outcome.rank_io_bytes] == expected
    assert any(i for i, _ in expected)


def test_the_option_mix_bound_is_the_same_with_its_every_rank_load_held_in_a_variable(
    monkeypatch,
):
    from planner_service.solve.bounds import option_mix

    tables = [
        table(f"t{i}", rows=300_000 * (i + 1), dim=64, pooling_factors=[float(i + 1)])
        for i in range(6)
    ]
    req = request(tables, world_size=4, topology={"local_world_size": 2, "hbm_bytes": 2**30})
    problem, groups = problem_of(req)
    upper = solved(req).solver.objective

    def bound():
        found = option_mix.option_mix_bound(problem, groups, upper, time_limit_s=5, seed=0)
        assert found is not None
        return found.value

    inline = bound()
    monkeypatch.setattr(option_mix, "COPIED_TERMS", 0)
    assert bound() == pytest.approx(inline, rel=1e-9)
