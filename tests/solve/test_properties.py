"""Properties of every plan the solver returns, on drawn requests: valid, and never below its bound."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner_service.plan.types import (
    SolverStatus,
)
from planner_service.solve.pipeline import solve
from planner_service.validate.validator import validate_plan
from tests.solve.oracles import (
    GIB,
    brute_force_finds_a_plan,
    table_strategy,
)
from tests.support.builders import request


@st.composite
def _requests(draw):
    hosts, local = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    tables = draw(st.lists(table_strategy, min_size=1, max_size=6, unique_by=lambda t: t["name"]))
    constraints = {}
    for t in tables:
        if draw(st.booleans()):
            constraints[t["name"]] = {
                "sharding_types": draw(
                    st.lists(
                        st.sampled_from(
                            [
                                "table_wise",
                                "column_wise",
                                "row_wise",
                                "data_parallel",
                                "table_row_wise",
                                "table_column_wise",
                            ]
                        ),
                        min_size=1,
                        max_size=3,
                        unique=True,
                    )
                ),
            }
    return request(
        tables,
        world_size=hosts * local,
        topology={"local_world_size": local, "hbm_bytes": draw(st.sampled_from([GIB, 8 * GIB]))},
        constraints={"tables": constraints},
        options={
            "time_limit_s": 0.5,
            "cost_model": draw(st.sampled_from(["shardplan", "torchrec-1.8"])),
        },
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_requests())
def test_every_plan_is_valid_and_above_its_bound(req):
    outcome = solve(req)
    if outcome.plan is None:  # small HBM can make a random request impossible: is it?
        assert outcome.infeasibility is not None
        assert outcome.infeasibility.reasons
        assert brute_force_finds_a_plan(req) in (False, None), outcome.infeasibility.render()
        return
    plan = outcome.plan
    assert validate_plan(req, plan) == []
    report = plan.solver
    assert report.objective >= report.lower_bound
    assert report.status in (SolverStatus.OPTIMAL, SolverStatus.FEASIBLE)
    assert report.objective == pytest.approx(max(s.perf.total for s in plan.rank_stats), rel=1e-12)
    assert report.critical_path >= 0
