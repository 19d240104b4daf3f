"""shardplan's planner: the plan vocabulary (``plan/``), the cost model (``costs/``), the
validator (``validate/``), the solver (``solve/``) and the HTTP service (``service/``).
Imports no torch."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("shardplan")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+source"

PLANNER_VERSION = f"shardplan-{__version__}"
