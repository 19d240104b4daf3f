"""The local search's one-table moves (``improve.py``): the rank index it keeps in step with
the plan, the contributions it keeps, and re-insertion below the peak at more work."""

from __future__ import annotations

import random

import numpy as np
import pytest

import planner_service.solve.improve as local_search
from planner_service.solve.deadline import Deadline
from planner_service.solve.improve import (
    WIDE_CHOICE_RANKS,
    _contribution,
    _TablesOnRanks,
    _WideContributions,
    improve,
)
from planner_service.solve.problem import Choice, loads_of
from tests.solve.oracles import problem_of
from tests.support.builders import request, table


def _random_choice(problem, t, rng):
    """A choice of table ``t``: a random option on random ranks (one per shard)."""
    option = rng.randrange(len(problem.tables[t].options))
    shards = problem.costs(problem.tables[t].options[option]).num_shards
    return Choice(option, tuple(rng.randrange(problem.world_size) for _ in range(shards)))


@pytest.mark.parametrize("seed", range(4))
def test_the_rank_index_follows_the_plan_as_a_scan_of_every_choice_would(seed):
    rng = random.Random(seed)
    world = WIDE_CHOICE_RANKS + 8  # row-wise and data-parallel choices are wide
    req = request(
        [table(f"t{i}", rows=rng.choice([100, 5_000, 200_000]), dim=32) for i in range(12)],
        world_size=world,
        topology={"local_world_size": 8},
    )
    problem, _ = problem_of(req)
    choices = [_random_choice(problem, t, rng) for t in range(len(problem.tables))]
    assert any(len(c.ranks) >= WIDE_CHOICE_RANKS for c in choices)  # some are wide
    index = _TablesOnRanks(problem)
    for _ in range(6):
        index.sync(choices)
        for rank in range(world):
            assert index.on(rank) == [t for t, c in enumerate(choices) if rank in c.ranks]
        # The next plan keeps most choices (the same objects) and changes a few.
        choices = list(choices)
        for t in rng.sample(range(len(choices)), 3):
            choices[t] = _random_choice(problem, t, rng)


def test_kept_contributions_are_those_of_the_choice_as_it_is_now():
    rng = random.Random(7)
    req = request(
        [table(f"t{i}", rows=50_000, dim=32) for i in range(6)],
        world_size=WIDE_CHOICE_RANKS,
        topology={"local_world_size": 8},
    )
    problem, _ = problem_of(req)
    kept = _WideContributions(problem)
    for _ in range(5):
        for t in range(len(problem.tables)):
            choice = _random_choice(problem, t, rng)
            got, want = kept.of(t, choice), _contribution(problem, t, choice)
            assert np.array_equal(got.perf, want.perf)
            assert np.array_equal(got.hbm, want.hbm) and np.array_equal(got.ddr, want.ddr)


def _heavy_tables_on_their_own_ranks():
    """A request whose every rank carries a row-wise table's share, and a plan with three
    tables read by many ids each whole on a rank of the first host (the slowest ranks, at
    the peak) and four small ones: as 4,096 ranks sat at the peak with a 45M-row table and
    seven row-wise shares. Moving a heavy table whole to another rank leaves it at the
    peak; a column or table-row-wise split costs more work and takes its ranks below it."""
    from benchmarks.workloads import workload_request
    from planner_service.solve.prepare import prepare

    def spec(name, rows, dim, pooling):
        return {
            "name": name,
            "num_embeddings": rows,
            "embedding_dim": dim,
            "pooling_factors": [pooling],
        }

    tables = [spec("base", 200_000_000, 256, 301.0)]
    tables += [spec(f"heavy{i}", 45_000_000, 256, 301.0) for i in range(3)]
    tables += [spec(f"small{i}", 100_000, 64, 10.0) for i in range(4)]
    req = workload_request(
        tables,
        16,
        batch_size=512,
        constraints={"tables": {"base": {"sharding_types": ["row_wise"]}}},
    )
    problem = prepare(req, Deadline.never()).problem
    assert problem is not None

    def option(t, kind):
        options = problem.tables[t].options
        return next(
            i
            for i, o in enumerate(options)
            if o.sharding_type.value == kind and o.compute_kernel.value == "fused"
        )

    choices = []
    for t, entry in enumerate(problem.tables):
        name = entry.table.name
        if name == "base":
            choices.append(Choice(option(t, "row_wise"), tuple(range(16))))
        elif name.startswith("heavy"):
            choices.append(Choice(option(t, "table_wise"), (int(name[-1]),)))
        else:
            choices.append(Choice(option(t, "table_wise"), (4 + int(name[-1]),)))
    return problem, choices


def test_a_table_at_the_peak_is_split_below_it_when_no_move_within_the_peak_helps(monkeypatch):
    problem, choices = _heavy_tables_on_their_own_ranks()
    start = loads_of(problem, choices)
    assert start.fits(problem)
    assert int((start.perf >= start.objective * (1 - 1e-12)).sum()) == 3

    plain = local_search._improve_once

    def within_the_peak_only(*args, below_only=False, **kwargs):
        return None if below_only else plain(*args, **kwargs)

    monkeypatch.setattr(local_search, "_improve_once", within_the_peak_only)
    stalled = loads_of(problem, improve(problem, choices, Deadline.never()))
    monkeypatch.undo()
    assert stalled.objective == pytest.approx(start.objective)  # no move within the peak

    improved_choices = improve(problem, choices, Deadline.never())
    improved = loads_of(problem, improved_choices)
    assert improved.fits(problem)
    assert improved.objective < 0.7 * start.objective
    heavy = [
        problem.tables[t].options[c.option].sharding_type.value
        for t, c in enumerate(improved_choices)
        if problem.tables[t].table.name.startswith("heavy")
    ]
    assert "table_wise" not in heavy  # every heavy table left its rank, split
    # Deterministic: the same plan again.
    assert improve(problem, choices, Deadline.never()) == improved_choices
