"""``PlanStore``: the one object the service holds, composing the store's parts over one
database: plans (``plans.py``), aliases (``aliases.py``) and the job queue (``jobs.py``).

Each operation is one of those parts' methods, under the name the service calls it by;
the backends (``sqlite.py``, ``postgres.py``) subclass this with their database.
"""

from __future__ import annotations

from planner_service.service.store.aliases import Aliases
from planner_service.service.store.database import Database
from planner_service.service.store.jobs import SolveJobs
from planner_service.service.store.plans import Plans


class PlanStore:
    """Plans by content address, the request each was planned from, aliases, and jobs."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.ping = database.ping
        self.close = database.close
        self.plans = plans = Plans(database)
        self.put_plan = plans.put
        self.list_plans = plans.page
        self.get_plan = plans.get
        self.plan_bodies = plans.bodies
        self.plan_for_request = plans.for_request
        self.aliases = aliases = Aliases(database)
        self.set_alias = aliases.set
        self.list_aliases = aliases.page
        self.get_alias = aliases.get
        self.alias_history = aliases.history
        self.jobs = jobs = SolveJobs(database)
        self.get_solve = jobs.get
        self.solve_request = jobs.request
        self.claim_solve = jobs.claim
        self.add_done_solve = jobs.add_done
        self.lapsed_solves = jobs.lapsed
        self.record_progress = jobs.record_progress
        self.end_solve = jobs.end
        self.renew_solves = jobs.renew
        self.release_solves = jobs.release
