"""Memory-tight construction (issue 37): when tables must leave HBM, the first plan spreads
them over time and memory together instead of taking the slowest kernel, makes room when a
table fits on no rank, and without the LP is guided by memory-priced options."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from benchmarks.workloads import memory_tight_tables, workload_request
from planner_service.solve import construct
from planner_service.solve import prepare as prepare_module
from planner_service.solve.deadline import Deadline
from planner_service.solve.placement import GroupIndex
from planner_service.solve.prepare import _guides, prepare, warm_start
from planner_service.solve.pricing import priced_guide
from planner_service.solve.problem import Choice, Loads, add_choice, loads_of
from planner_service.solve.room import Demotions


def _prepared(count, world, fill, seed, batch=4096):
    tables = memory_tight_tables(count, world, fill=fill, seed=seed)
    return prepare(workload_request(tables, world, batch_size=batch), Deadline.never())


def _ratio(prepared, choices):
    return loads_of(prepared.problem, choices).objective / prepared.lower_bound.value


def test_memory_tight_draws_fill_their_share_of_hbm_with_tables_larger_than_a_rank():
    tables = memory_tight_tables(400, 64, fill=0.8, seed=3)
    weights = [t["num_embeddings"] * t["embedding_dim"] * 4 for t in tables]
    hbm = 64 * 80 * 2**30
    assert sum(weights) == pytest.approx(0.8 * hbm, rel=1e-3)
    assert sum(w > 80 * 2**30 for w in weights) == 2
    assert tables == memory_tight_tables(400, 64, fill=0.8, seed=3)
    assert tables != memory_tight_tables(400, 64, fill=0.8, seed=4)


def test_a_guided_pass_whose_options_stop_fitting_stays_near_the_bound():
    """The least-work guide asks every table for its fastest kernel; once HBM runs out the
    fallback took the option of least HBM whatever its time (2.75x the bound here)."""
    prepared = _prepared(96, 16, 0.8, 1)
    problem = prepared.problem
    guide = [
        [min(range(len(e.options)), key=lambda o: (problem.costs(e.options[o]).work, o))]
        for e in problem.tables
    ]
    least = construct._least_memory(problem)
    found = construct._greedy(problem, prepared.lower_bound.value, guide, least, lambda: False)
    assert found is not None
    assert _ratio(prepared, found.choices) < 1.5


def test_without_the_lp_the_warm_start_is_guided_by_memory_priced_options():
    """The LP runs out of time on thousands of distinct shapes: its stand-in guide was each
    table's least-work option (2.11x the bound here)."""
    prepared = _prepared(168, 32, 0.95, 1)
    without_lp = dataclasses.replace(prepared, relaxation=None, linear=None)
    choices = warm_start(without_lp, Deadline.never())
    assert choices is not None
    assert loads_of(prepared.problem, choices).fits(prepared.problem)
    assert _ratio(prepared, choices) < 1.5


def test_a_priced_guide_fits_its_share_of_hbm_and_is_the_least_work_guide_when_that_fits():
    prepared = _prepared(168, 32, 0.95, 1)
    problem, groups = prepared.problem, prepared.groups

    def hbm_of(guide):
        return sum(
            problem.costs(e.options[g[0]]).hbm_total
            for e, g in zip(problem.tables, guide, strict=True)
        )

    tight = priced_guide(problem, groups, 0.9)
    assert hbm_of(tight) <= 0.9 * problem.hbm_total
    loose = priced_guide(problem, groups, 1e6)
    fastest = [
        [min(range(len(e.options)), key=lambda o: (problem.costs(e.options[o]).work, o))]
        for e in problem.tables
    ]
    assert loose == fastest
    assert hbm_of(fastest) > 0.9 * problem.hbm_total  # so pricing had work to do


def test_making_room_demotes_a_whole_table_in_place_and_keeps_the_loads_exact():
    prepared = _prepared(96, 16, 0.8, 1)
    problem = prepared.problem
    demotions = Demotions(problem, GroupIndex(problem))
    state = construct._empty_state(problem)
    choices: list[Choice | None] = [None] * len(problem.tables)
    placed = []
    for t, entry in enumerate(problem.tables):  # the heaviest whole-table option, rank 0
        index = _heaviest_whole(problem, t)
        if index is None or entry.table.name.startswith("giant"):  # their DDR fills a rank
            continue
        hbm = problem.costs(entry.options[index]).hbm_total
        if state.hbm[0] + hbm > problem.hbm_cap[0]:
            continue
        choice = Choice(index, (0,))
        construct._commit(problem, state, t, choice)
        choices[t] = choice
        demotions.placed(t, choice)
        placed.append(t)
    free_before = int(problem.hbm_cap[0] - state.hbm[0])
    need = free_before + 1
    assert demotions.make_room(state, choices, need, {0})
    assert int(problem.hbm_cap[0] - state.hbm[0]) >= need
    demoted = [t for t in placed if choices[t].option != _heaviest_whole(problem, t)]
    assert len(demoted) == 1 and choices[demoted[0]].ranks == (0,)  # one table, in place
    exact = Loads.zeros(problem.world_size)
    for t in placed:
        option = problem.tables[t].options[choices[t].option]
        add_choice(problem, option, choices[t].ranks, exact.perf, exact.hbm, exact.ddr)
    assert np.allclose(exact.perf, state.perf)
    assert (exact.hbm == state.hbm).all() and (exact.ddr == state.ddr).all()
    assert state.free_hbm == problem.hbm_total - int(exact.hbm.sum())


def _heaviest_whole(problem, t):
    """The whole-table option of most HBM (the earlier on ties), or None."""
    options = problem.tables[t].options
    whole = [i for i, o in enumerate(options) if len(o.shards) == 1]
    return max(whole, key=lambda i: (problem.costs(options[i]).hbm_total, -i), default=None)


@pytest.mark.parametrize(
    ("count", "world", "fill", "seed"),
    [(96, 16, 0.8, 1), (168, 32, 0.95, 1), (96, 16, 0.6, 2), (120, 16, 0.9, 3)],
)
def test_passes_left_out_change_no_plan(count, world, fill, seed, monkeypatch):
    """``greedy_plans`` leaves out the MEMORY pass of a guide whose SHARE pass never fell
    back, and stops a pass once its slowest rank is above both the best plan of its
    fallback and its target: the plans are those of running every pass to its end."""
    prepared = _prepared(count, world, fill, seed)
    problem, bound = prepared.problem, prepared.lower_bound.value
    guides = _guides(
        problem, prepared.relaxation, prepared.linear, prepared.groups, Deadline.never()
    )
    least = construct._least_memory(problem)
    # Every pass run to its end, as listed (guided first; ties to the pass listed first).
    listed = [(None, f, construct.Fallback.SHARE) for f in construct.UNGUIDED_TARGET_FACTORS]
    listed += [(g, 1.0, fb) for fb in construct.Fallback for g in guides]
    order = sorted(range(len(listed)), key=lambda i: listed[i][0] is None)
    best, met, whole = {}, set(), 0
    for i in order:
        guide, factor, fallback = listed[i]
        if id(guide) in met:
            continue
        found = construct._greedy(problem, bound * factor, guide, least, lambda: False, fallback)
        whole += 1
        if found is None:
            continue
        loads = loads_of(problem, found.choices)
        key = (loads.objective, loads.peak_hbm, i)
        if fallback not in best or key < best[fallback][0]:
            best[fallback] = (key, found.choices)
        if loads.objective <= bound * factor:
            met.add(id(guide))
    ranked = [c for _, c in sorted(best.values(), key=lambda item: item[0])]
    expected = ranked[:1] + [c for c in ranked[1:] if c != ranked[0]]

    finished = []
    real = construct._greedy

    def counted(*args, **kwargs):
        found = real(*args, **kwargs)
        finished.append(found is not None and len(found.choices) == len(problem.tables))
        return found

    monkeypatch.setattr(construct, "_greedy", counted)
    assert construct.greedy_plans(problem, bound, guides) == expected
    assert len(finished) <= whole
    assert sum(finished) < whole  # some pass was left out or stopped early


def test_a_pass_stops_above_its_ceiling_and_is_unchanged_below_it():
    prepared = _prepared(96, 16, 0.6, 2)
    problem, bound = prepared.problem, prepared.lower_bound.value
    least = construct._least_memory(problem)
    found = construct._greedy(problem, bound, None, least, lambda: False)
    assert found is not None and not found.fell_back  # unguided: no fallback round
    objective = loads_of(problem, found.choices).objective
    at = construct._greedy(problem, bound, None, least, lambda: False, ceiling=objective)
    assert at == found
    assert (
        construct._greedy(problem, bound, None, least, lambda: False, ceiling=0.99 * objective)
        is None
    )


@pytest.mark.parametrize(("first_solve_s", "re_solves"), [(0.0, 3), (1.0, 0)])
def test_a_re_solve_at_less_memory_starts_only_with_time_for_it(
    first_solve_s, re_solves, monkeypatch
):
    """The LP's mixes at less memory guide the first plans; on thousands of distinct tables
    the first re-solve took 4 to 15 times the solve at full memory and, cut short by the
    LP's share, gave no guide. It is started only with ``RESOLVE_FACTOR`` times that solve
    left (here 20 s of a 5 s share when the first solve took 1 s); else the full mix guides
    alone and the deadline counts as reached."""
    prepared = _prepared(96, 16, 0.8, 1)
    linear = prepared.linear
    linear.deadline = Deadline.for_time_limit(5.0)
    linear.solve_s = first_solve_s
    fractions = []
    real = type(linear).solve

    def solve(self, memory_fraction=1.0):
        fractions.append(memory_fraction)
        return real(self, memory_fraction)

    monkeypatch.setattr(type(linear), "solve", solve)
    deadline = Deadline.for_time_limit(60.0)
    guides = _guides(prepared.problem, prepared.relaxation, linear, prepared.groups, deadline)
    assert fractions == list(prepare_module.GUIDE_MEMORY_FRACTIONS[:re_solves])
    assert 1 <= len(guides) <= 1 + re_solves
    assert deadline.reached is (re_solves == 0)


def test_the_lp_guides_run_the_least_memory_first():
    """At scale only the first guided pass may finish before the local search needs the
    time, and the guides that leave HBM free place the better plans there: the mix at the
    least memory comes first, the full-memory mix last."""
    prepared = _prepared(96, 16, 0.8, 1)
    problem = prepared.problem
    guides = _guides(
        problem, prepared.relaxation, prepared.linear, prepared.groups, Deadline.never()
    )
    assert len(guides) >= 2

    def hbm_of(guide):
        return sum(
            problem.costs(e.options[g[0]]).hbm_total
            for e, g in zip(problem.tables, guide, strict=True)
            if g
        )

    full = _table_guide(prepared, prepared.relaxation)
    assert guides[-1] == full
    assert hbm_of(guides[0]) < hbm_of(full)


def _table_guide(prepared, mix):
    return prepare_module._table_quotas(prepared.groups, mix.quotas(), len(prepared.problem.tables))


# Eight tables on 16 ranks of 1 GiB HBM at a batch of 16,384 per rank: every table's
# buffers take a large share of a rank's HBM, and every guided and unguided pass runs out
# of room for some table (a random draw, found by search).
CRAMPED = [
    {"name": "t0", "num_embeddings": 119327, "embedding_dim": 64, "pooling_factors": [4]},
    {"name": "t1", "num_embeddings": 3716, "embedding_dim": 64, "pooling_factors": [80]},
    {"name": "t2", "num_embeddings": 1138467, "embedding_dim": 16, "pooling_factors": [4]},
    {"name": "t3", "num_embeddings": 8662059, "embedding_dim": 256, "pooling_factors": [80]},
    {"name": "t4", "num_embeddings": 4195, "embedding_dim": 128, "pooling_factors": [1]},
    {"name": "t5", "num_embeddings": 10183, "embedding_dim": 128, "pooling_factors": [80]},
    {"name": "t6", "num_embeddings": 5285485, "embedding_dim": 32, "pooling_factors": [80]},
    {"name": "t7", "num_embeddings": 487637, "embedding_dim": 128, "pooling_factors": [1]},
]


def test_when_no_pass_places_every_table_the_last_resort_packs_memory_alone():
    """At scale nothing after the construction finds a first plan (issue 37: 10,000
    memory-tight tables on 4,096 ranks, all passes out of room, no plan at all). When every
    pass fails, a pass guided by each table's least-HBM option places one."""
    request = workload_request(CRAMPED, 16, hbm_gib=1, batch_size=16384)
    prepared = prepare(request, Deadline.never())
    problem, bound = prepared.problem, prepared.lower_bound.value
    guides = _guides(
        problem, prepared.relaxation, prepared.linear, prepared.groups, Deadline.never()
    )
    least = construct._least_memory(problem)
    for guide in [None, *guides]:
        for fallback in construct.Fallback:
            assert construct._greedy(problem, bound, guide, least, lambda: False, fallback) is None
    plans = construct.greedy_plans(problem, bound, guides)
    assert len(plans) == 1
    assert len(plans[0]) == len(problem.tables)
    assert loads_of(problem, plans[0]).fits(problem)
    choices = warm_start(prepared, Deadline.never())
    assert choices is not None and loads_of(problem, choices).fits(problem)
