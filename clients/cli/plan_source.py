"""Where ``shardplan check`` gets its plans: one function from a request to its plan or
the reason there is none (``PlanSource``). Everything else the check does (headroom,
limits, the sweep's matrix, rendering) needs only the request and that answer, so a
source backed by the service (``--server``, through the HTTP client) replaces
``solve_locally`` and nothing else."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from clients.cli.extras import needs_extra
from planner_service.plan.types import Infeasibility, PlanRequest, ShardingPlan

if TYPE_CHECKING:
    from clients.http import PlannerClient


@dataclass(frozen=True)
class Answer:
    """A request's plan, or why it has none (exactly one of the two)."""

    plan: ShardingPlan | None
    infeasibility: Infeasibility | None

    def __post_init__(self) -> None:
        assert (self.plan is None) != (self.infeasibility is None)


# (stage, best objective so far, best bound so far), as the solver reports its progress
OnProgress = Callable[[str, float | None, float | None], None]


class PlanSource(Protocol):
    def __call__(self, request: PlanRequest, *, on_progress: OnProgress | None = None) -> Answer:
        """``request``'s plan, or why it has none; ``on_progress`` hears how it goes."""
        ...


def solve_locally(request: PlanRequest, *, on_progress: OnProgress | None = None) -> Answer:
    """The planner in this process, within the request's ``options.time_limit_s``: the plan
    ``shardplan plan`` (and the service) would make. Needs ``shardplan[planner]``."""
    with needs_extra("check", "planner"):
        from planner_service.solve.pipeline import solve
    outcome = solve(request, on_progress=on_progress)
    return Answer(outcome.plan, outcome.infeasibility)


class ServiceSource:
    """The service plans (POST /v1/plans, through the HTTP client): the plan it stores for
    the request, or its infeasibility report (a 422 ``NoPlanFound``). Needs no OR-Tools,
    so a CI runner with the core install can check; each request is one solve there (or
    none, when the service has its plan stored already)."""

    def __init__(self, client: PlannerClient) -> None:
        self.client = client

    def __call__(self, request: PlanRequest, *, on_progress: OnProgress | None = None) -> Answer:
        from clients.http import NoPlanFound

        if on_progress is not None:
            on_progress(f"on {self.client.base_url}", None, None)
        try:
            return Answer(self.client.create_plan(request), None)
        except NoPlanFound as none:
            return Answer(None, none.infeasibility)
