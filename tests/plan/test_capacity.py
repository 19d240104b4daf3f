"""What each rank offers after the reservation, overrides included."""

from __future__ import annotations

from planner_service.plan.capacity import rank_capacities, usable_capacity
from planner_service.solve.pipeline import solve
from planner_service.validate.validator import validate_plan
from tests.support.builders import request, table

GIB = 2**30


def _small_rank_0(tables: list[dict], world_size: int = 3):
    return request(
        tables,
        world_size=world_size,
        topology={"hbm_bytes": 8 * GIB, "rank_overrides": [{"rank": 0, "hbm_bytes": GIB}]},
        constraints={"hbm_headroom_fraction": 0.25},
    )


def test_an_override_of_rank_0_is_rank_0s_alone():
    """Every rank started from rank 0's device, its override included: a small rank 0
    made every rank small."""
    req = _small_rank_0([table("a")])
    hbm = [c.hbm_bytes for c in usable_capacity(req.topology, req.constraints)]
    assert hbm == [GIB * 3 // 4, 6 * GIB, 6 * GIB]
    sparse = rank_capacities(req.topology, req.constraints)
    assert [sparse.of(rank) for rank in range(3)] == usable_capacity(req.topology, req.constraints)


def test_a_table_too_big_for_rank_0_is_placed_on_another():
    req = _small_rank_0([table("big", rows=10**7, dim=64)], world_size=2)  # 2.4 GiB
    outcome = solve(req)
    assert outcome.plan is not None, outcome.infeasibility
    assert validate_plan(req, outcome.plan) == []
    assert outcome.plan.tables["big"].ranks == [1]
