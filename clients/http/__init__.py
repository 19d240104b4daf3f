"""The planner service from Python: ``PlannerClient`` (blocking) and
``AsyncPlannerClient`` (asyncio), on httpx, with the core install only
(``planner_service.plan`` and httpx: no solver, no web stack).

::

    from clients import PlannerClient

    with PlannerClient("http://planner:8000", cache_dir="/var/cache/shardplan") as client:
        plan = client.get_plan(plan_id)  # hashed again; from the cache when held

- Retries: connection errors, 429, 502, 503 (after its Retry-After) and 504, with
  exponential backoff and full jitter; never an answer about the input (``retry.py``).
- Integrity: every plan is hashed again and must be the one asked for, else
  ``IntegrityError``; nothing unverified is returned or cached (``integrity.py``).
- Imported plans: ``fetch_plan`` (and ``Resolved``, ``Imported``) say whether the service
  vouches for a plan's solver report (``solver_report_verified``: False for a plan stored
  by ``import_plan``, whose status, bound and gap are the importer's word), from the
  cache too (``fetched.py``).
- Cache: with ``cache_dir``, plans fetched are kept on disk, verified when read back; an
  alias is answered from it only with ``allow_stale_alias=True``, and says so
  (``Resolved.stale``; ``cache.py``).
- Errors: one hierarchy under ``PlannerError`` (``errors.py``).
- Long solves: ``wait_for_plan`` submits an async job (``Prefer: respond-async``) and
  follows its server-sent events, reconnecting through a restart; ``submit_plan``,
  ``get_solve`` and ``watch_solve`` are its steps.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clients.http.client import AsyncPlannerClient, PlannerClient
    from clients.http.core import Imported, Resolved
    from clients.http.errors import (
        BadRequest,
        Conflict,
        Forbidden,
        IntegrityError,
        InvalidPlan,
        NoPlanFound,
        NotFound,
        Overloaded,
        PlannerError,
        PlannerHTTPError,
        PlannerUnavailable,
        ServerError,
        Unauthorized,
        UnexpectedResponse,
    )
    from clients.http.fetched import FetchedPlan
    from clients.http.retry import RetryPolicy

# Where each name lives: loaded on first use, so that reading a cached plan
# (``cache.py``) does not import httpx and the transports.
_HOMES = {
    "AsyncPlannerClient": "client",
    "FetchedPlan": "fetched",
    "PlannerClient": "client",
    "Imported": "core",
    "Resolved": "core",
    "RetryPolicy": "retry",
}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'clients.http' has no attribute {name!r}")
    module = importlib.import_module(f"clients.http.{_HOMES.get(name, 'errors')}")
    return getattr(module, name)


__all__ = [
    "AsyncPlannerClient",
    "BadRequest",
    "Conflict",
    "FetchedPlan",
    "Forbidden",
    "Imported",
    "IntegrityError",
    "InvalidPlan",
    "NoPlanFound",
    "NotFound",
    "Overloaded",
    "PlannerClient",
    "PlannerError",
    "PlannerHTTPError",
    "PlannerUnavailable",
    "Resolved",
    "RetryPolicy",
    "ServerError",
    "Unauthorized",
    "UnexpectedResponse",
]
