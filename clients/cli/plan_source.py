"""Where ``shardplan check`` gets its plans: the planner in this process
(``solve_locally``, with its world-size search, ``search_locally``), or the service
(``ServiceSource``, ``--server``, through the HTTP client). The check itself
(``planner_service/check``) needs only a request's answer (a ``PlanSource``), so the
service replaces the local solver and nothing else."""

from __future__ import annotations

from typing import TYPE_CHECKING

from clients.cli.extras import needs_extra
from planner_service.check.source import Answer, OnProgress
from planner_service.plan.types import PlanRequest

if TYPE_CHECKING:
    from clients.http import PlannerClient
    from planner_service.check.what_if import FoundWorldSize


def solve_locally(request: PlanRequest, *, on_progress: OnProgress | None = None) -> Answer:
    """The planner in this process, within the request's ``options.time_limit_s``: the plan
    ``shardplan plan`` (and the service) would make. Needs ``shardplan[planner]``."""
    with needs_extra("check", "planner"):
        from planner_service.solve.pipeline import solve
    outcome = solve(request, on_progress=on_progress)
    return Answer(outcome.plan, outcome.infeasibility)


def search_locally(request: PlanRequest) -> FoundWorldSize:
    """The planner's world-size search below ``request``'s world size (``request`` has a
    plan), within its ``options.time_limit_s``, in this process: it runs here also when
    the service planned (``--server``), so it needs ``shardplan[planner]`` either way."""
    with needs_extra("check --min-world-size", "planner"):
        from planner_service.solve.deadline import Deadline
        from planner_service.solve.explain import least_world_size
    deadline = Deadline.for_time_limit(request.options.time_limit_s)
    return least_world_size(request, deadline, fits=True)


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
