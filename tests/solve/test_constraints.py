"""Placement constraints (colocate, separate, pins), slow ranks and tiny time limits."""

from __future__ import annotations

from planner_service.solve.deadline import Deadline
from planner_service.solve.pipeline import solve
from planner_service.validate.validator import validate_plan
from tests.solve.oracles import (
    GIB,
    solved,
)
from tests.support.builders import request, table


def test_colocate_separate_and_pins_are_honoured():
    req = request(
        [table("a"), table("b"), table("c"), table("d"), table("e", rows=10**6, dim=64)],
        world_size=4,
        constraints={
            "tables": {
                "e": {"ranks": [3]},
                "c": {"sharding_types": ["table_wise"]},
                "d": {"sharding_types": ["table_wise"]},
            },
            "colocate": [["a", "b"]],
            "separate": [["c", "d", "e"]],
        },
        options={"time_limit_s": 2},
    )
    plan = solved(req)
    ranks = {name: set(s.ranks) for name, s in plan.tables.items()}
    assert ranks["a"] == ranks["b"]
    assert ranks["e"] == {3}
    assert not (ranks["c"] & ranks["d"]) and not (ranks["c"] & ranks["e"])
    assert not (ranks["d"] & ranks["e"])


def test_slow_ranks_get_less_work():
    tables = [table(f"t{i}", rows=10**5, dim=128) for i in range(12)]
    req = request(
        tables,
        world_size=2,
        topology={"rank_overrides": [{"rank": 1, "hbm_bw_bytes_per_s": 897 * GIB / 4}]},
        constraints={"tables": {f"t{i}": {"sharding_types": ["table_wise"]} for i in range(12)}},
        options={"time_limit_s": 2},
    )
    plan = solved(req)
    per_rank = [sum(1 for s in plan.tables.values() if s.ranks == [r]) for r in range(2)]
    assert per_rank[0] > per_rank[1]


def test_tiny_time_limit_answers_with_the_warm_start():
    tables = [table(f"t{i}", rows=1000 * (i + 1), dim=64) for i in range(30)]
    req = request(tables, world_size=8, options={"time_limit_s": 0.001})
    # Below MIN_CPSAT_TIME_S the search is not started, whatever the clock says: the
    # deadline itself (a race with the machine's load here) is tested on a virtual clock
    # in test_deadline.py.
    outcome = solve(req, deadline=Deadline.never())
    assert "cpsat_status" not in outcome.details
    assert "packing_objective" not in outcome.details
    assert outcome.plan is not None and validate_plan(req, outcome.plan) == []
