"""The solver against exhaustive search: the true optimum on tiny instances."""

from __future__ import annotations

import pytest

from planner_service.plan.types import (
    SolverStatus,
)
from tests.solve.oracles import (
    GIB,
    brute_force_optimum,
    solved,
)
from tests.support.builders import request, table


@pytest.mark.parametrize(
    ("tables", "world", "local", "hbm"),
    [
        (
            [
                table("a", rows=1000, dim=256),
                table("b", rows=50, dim=64),
                table("c", rows=10**6, dim=16, pooling_factors=[30.0]),
            ],
            2,
            2,
            8 * GIB,
        ),
        (
            [
                table("a", rows=10**5, dim=128),
                table("b", rows=10**5, dim=128),
                table("c", rows=10**5, dim=128),
                table("d", rows=20, dim=8),
            ],
            3,
            3,
            8 * GIB,
        ),
        (
            [
                table("a", rows=3 * 10**6, dim=64, pooling_factors=[5.0]),
                table("b", rows=2 * 10**6, dim=128),
            ],
            2,
            1,
            2 * GIB,
        ),  # memory pushes to UVM
        (
            [
                table("a", rows=8 * 10**6, dim=64),
                table("b", rows=4 * 10**6, dim=64, pooling_factors=[10.0]),
            ],
            2,
            2,
            3 * GIB,
        ),
    ],
)
def test_solver_finds_the_true_optimum_on_tiny_instances(tables, world, local, hbm):
    req = request(
        tables,
        world_size=world,
        topology={"local_world_size": local, "hbm_bytes": hbm},
        options={"time_limit_s": 5, "gap_limit": 0},
    )
    optimum = brute_force_optimum(req)
    plan = solved(req)
    assert plan.solver.objective == pytest.approx(optimum, rel=1e-4)
    assert plan.solver.objective >= optimum * (1 - 1e-12)
    assert plan.solver.status is SolverStatus.OPTIMAL
