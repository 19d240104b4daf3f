"""What the check plans with: a ``PlanSource`` answers a request with its plan or the
reason there is none. The analysis needs nothing else from a planner, so the CLI's
solver, the service over HTTP (``shardplan check --server``) and a test's fake are
interchangeable."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from planner_service.plan.types import Infeasibility, PlanRequest, ShardingPlan


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
