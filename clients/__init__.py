"""shardplan's clients: the ``shardplan`` command line (``clients.cli``) and the HTTP
client (``clients.http``: ``PlannerClient``, ``AsyncPlannerClient`` and their errors).
Imports no torch, and needs the solver or the service stack only for the commands that
run them.

The HTTP client's names are exported here too (``from clients import PlannerClient``),
loaded on first use, so that the command line does not pay for importing them at start.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    """``clients.PlannerClient`` and the rest of ``clients.http.__all__``, imported now."""
    if not name.startswith("__"):
        http = importlib.import_module("clients.http")
        if name in http.__all__:
            return getattr(http, name)
    raise AttributeError(f"module 'clients' has no attribute {name!r}")
