"""The capacity check's analysis (``planner_service/check``) in-process, planned by a fake
``PlanSource`` that answers with hand-built plans: no solver, no subprocess. The CLI's
output is checked end to end in tests/clients/cli/test_check.py, the service's in
tests/service/test_api.py and tests/clients/cli/test_fetch.py."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from planner_service.check.report import check, check_report, check_result
from planner_service.check.source import Answer, OnProgress
from planner_service.check.what_if import WhatIf, WhatIfNames, least_world_sizes, sweep
from planner_service.plan.api import BindingKind, CheckGates, CheckReport, MemoryTier, Verdict
from planner_service.plan.capacity import usable_capacity
from planner_service.plan.errors import InputError
from planner_service.plan.types import (
    Infeasibility,
    InfeasibilityCode,
    InfeasibilityReason,
    PlanRequest,
    SmallestFixes,
    SolverStatus,
)
from tests.support import builders
from tests.support.builders import request, table

GIB = 2**30
NAMES = WhatIfNames(source="caller", world_sizes="sizes", hbm="memory")


def _request(world_size: int = 2, hbm_bytes: int = GIB, **fields) -> PlanRequest:
    tables = [table("a", rows=1_000_000, dim=64), table("b", rows=1_000, dim=16)]
    return request(tables, world_size=world_size, topology={"hbm_bytes": hbm_bytes}, **fields)


class FakeSource:
    """Plans every request table-wise, ``a`` on rank 0 and ``b`` on the last rank; or,
    for the world sizes in ``no_plan``, answers that none exists. Records each request."""

    def __init__(self, no_plan: frozenset[int] = frozenset()) -> None:
        self.no_plan = no_plan
        self.asked: list[PlanRequest] = []

    def __call__(self, req: PlanRequest, *, on_progress: OnProgress | None = None) -> Answer:
        self.asked.append(req)
        size = req.topology.world_size
        if size in self.no_plan:
            return Answer(None, _infeasibility(min_world_size=2 * size))
        shardings = {
            "a": builders.table_wise(req, "a", 0),
            "b": builders.table_wise(req, "b", size - 1),
        }
        return Answer(builders.plan(req, shardings), None)


def _infeasibility(min_world_size: int | None) -> Infeasibility:
    reason = InfeasibilityReason(
        code=InfeasibilityCode.TOTAL_MEMORY, message="the tables need more HBM", ranks=[1]
    )
    return Infeasibility(
        status=SolverStatus.INFEASIBLE,
        reasons=[reason],
        fixes=SmallestFixes(min_world_size=min_world_size),
    )


def _rank0_utilization(req: PlanRequest) -> float:
    plan = FakeSource()(req).plan
    assert plan is not None
    return (
        plan.rank_stats[0].hbm_bytes / usable_capacity(req.topology, req.constraints)[0].hbm_bytes
    )


# --------------------------------------------------------------------------- one check


def test_a_plan_reports_every_ranks_headroom_and_the_spread_in_hbm():
    req = _request()
    plan = FakeSource()(req).plan
    assert plan is not None
    report = check_report(req, plan, None)
    usable = usable_capacity(req.topology, req.constraints)
    assert (report.fits, report.verdict, report.plan_id) == (True, Verdict.FITS, plan.plan_id)
    assert [r.hbm_free_bytes for r in report.ranks] == [
        c.hbm_bytes - s.hbm_bytes for c, s in zip(usable, plan.rank_stats, strict=True)
    ]
    assert report.headroom is not None and report.headroom.tier is MemoryTier.HBM
    assert report.headroom.least.rank == 0  # it holds the big table
    assert report.binding.kind is BindingKind.PERF and report.binding.rank == 0


def test_over_the_limit_plans_again_with_the_reservation_that_keeps_the_margin():
    req = _request()
    used = _rank0_utilization(req)
    source = FakeSource()
    report = check(req, source, CheckGates(max_hbm_utilization=round(used / 2, 3)))
    assert (report.fits, report.verdict) == (False, Verdict.OVER_LIMIT)
    assert report.binding.kind is BindingKind.MAX_HBM_UTILIZATION
    assert [u.rank for u in report.over_limit] == [0]
    assert len(source.asked) == 2  # the request, then the tightened request
    tightened = source.asked[1].constraints.hbm_headroom_fraction
    assert report.margin_fix is not None and report.margin_fix.fits is True
    assert report.margin_fix.hbm_headroom_fraction == tightened
    assert tightened > req.constraints.hbm_headroom_fraction


def test_within_the_limit_plans_once():
    source = FakeSource()
    report = check(_request(), source, CheckGates(max_hbm_utilization=1.0))
    assert report.fits and report.margin_fix is None and len(source.asked) == 1


def test_without_a_plan_the_first_reason_binds():
    req = _request()
    report = check(req, FakeSource(no_plan=frozenset({2})))
    assert (report.fits, report.verdict, report.status) == (
        False,
        Verdict.NO_PLAN,
        SolverStatus.INFEASIBLE,
    )
    assert (report.binding.kind, report.binding.rank) == (BindingKind.MEMORY, 1)
    assert report.headroom is None and report.ranks == [] and report.plan_id is None


@pytest.mark.parametrize("fits", [True, False])
def test_the_service_answer_is_the_report_and_what_its_store_knows(fits):
    req = _request()
    answer = FakeSource(no_plan=frozenset() if fits else frozenset({2}))(req)
    report = check_report(req, answer.plan, answer.infeasibility)
    result = check_result(report, stored=True)
    assert CheckReport.model_validate(result.model_dump(exclude={"stored", "min_hbm_free_bytes"}))
    assert result.model_dump(exclude={"stored", "min_hbm_free_bytes"}) == report.model_dump()
    assert result.stored is True
    free = min(r.hbm_free_bytes for r in report.ranks) if fits else None
    assert result.min_hbm_free_bytes == free


# --------------------------------------------------------------------------- what-if


def test_a_sweep_checks_every_cell_without_its_ranks():
    source = FakeSource(no_plan=frozenset({2}))
    result = sweep(_request(), [2, 4], [GIB, 2 * GIB], WhatIf(source, NAMES))
    cells = {(c.world_size, c.hbm_bytes): c.check for c in result.cells}
    assert list(cells) == [(2, GIB), (2, 2 * GIB), (4, GIB), (4, 2 * GIB)]
    assert cells[2, GIB].verdict is Verdict.NO_PLAN and cells[4, GIB].fits
    assert all(check.ranks == [] for check in cells.values())
    assert [(r.topology.world_size, r.topology.hbm_bytes) for r in source.asked] == list(cells)
    assert result.passed


def test_a_sweep_refuses_a_bad_cell_before_any_solve_naming_the_callers_input():
    source = FakeSource()
    with pytest.raises(InputError) as raised:  # 3 ranks are not whole hosts of 2
        sweep(_request(world_size=2), [2, 3], [], WhatIf(source, NAMES))
    assert raised.value.source == "caller" and raised.value.problems[0].path == "sizes"
    assert "local_world_size 2" in raised.value.problems[0].message
    assert source.asked == []


@dataclass(frozen=True)
class Found:
    min_world_size: int | None
    searched_up_to: int | None = None


def test_the_least_world_size_searches_only_below_a_request_that_fits():
    searched: list[int] = []

    def search(req: PlanRequest) -> Found:
        searched.append(req.topology.world_size)
        return Found(min_world_size=1)

    fits = least_world_sizes(_request(), [], search, WhatIf(FakeSource(), NAMES))
    assert searched == [2] and fits.rows[0].min_world_size == 1 and fits.passed
    assert fits.rows[0].check is not None and fits.rows[0].check.world_size == 1

    source = FakeSource(no_plan=frozenset({2}))
    found = least_world_sizes(_request(), [], search, WhatIf(source, NAMES))
    assert searched == [2]  # the planner's own fix: no search
    assert found.rows[0].min_world_size == 4 and found.passed


class _Heard:
    def __init__(self, cells: int) -> None:
        self.events: list[tuple[str, str]] = [("cells", str(cells))]
        HEARD.append(self)

    def start(self, label: str) -> None:
        self.events.append(("start", label))

    def finish(self, label: str, outcome: object) -> None:
        self.events.append(("finish", type(outcome).__name__))

    def close(self) -> None:
        self.events.append(("close", ""))


HEARD: list[_Heard] = []


def test_progress_hears_each_cell_start_and_finish():
    HEARD.clear()
    sweep(_request(), [2], [GIB], WhatIf(FakeSource(), NAMES, progress=_Heard))
    assert HEARD[0].events == [
        ("cells", "1"),
        ("start", "world_size 2, HBM 1.00 GiB"),
        ("finish", "CheckReport"),
        ("close", ""),
    ]
