"""``PlanStore``: the one object the service holds, composing the store's parts over one
database: plans (``plans.py``), aliases (``aliases.py``), the job queue (``jobs.py``) and
device profiles (``profiles.py``).

Callers reach each part by name (``store.plans.get``, ``store.aliases.set``,
``store.jobs.claim``, ``store.profiles.get``); the backends (``sqlite.py``,
``postgres.py``) subclass this with their database.
"""

from __future__ import annotations

from planner_service.service.store.aliases import Aliases
from planner_service.service.store.database import Database
from planner_service.service.store.jobs import SolveJobs
from planner_service.service.store.plans import Plans
from planner_service.service.store.profiles import Profiles


class PlanStore:
    """Plans by content address, the request each was planned from, aliases, jobs, and
    device profiles by content address."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.ping = database.ping
        self.close = database.close
        self.plans = Plans(database)
        self.aliases = Aliases(database)
        self.jobs = SolveJobs(database)
        self.profiles = Profiles(database)
