"""shardplan's planner, one package per stage around one vocabulary. Imports no torch.

- ``plan``: the vocabulary (requests, plans, shards, capacities), its canonical JSON and its
  errors; pydantic and numpy only. The runtime and every client import it.
- ``costs``: the options vocabulary, enumerating each table's ways to shard, estimating
  their perf and storage.
- ``validate``: the oracle that checks any plan against its request (recomputing per-rank
  usage with the cost model).
- ``solve``: from a request to a plan or an explained infeasibility (needs OR-Tools:
  ``shardplan[planner]``).
- ``check``: the capacity check (headroom, what binds, the margin fix, what-if sizes),
  served by ``shardplan check`` and POST /v1/check; it plans through a source it is given.
- ``reports``: documents and tables rendered from results, for the CLI and the service.
- ``service``: the HTTP API (``shardplan[service]``).

Each stage imports only those before it (tests/project/test_imports.py checks): plan <- costs <-
validate; plan, costs <- solve; plan, costs <- check <- reports; all of them <- service
and the CLI.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("shardplan")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+source"

PLANNER_VERSION = f"shardplan-{__version__}"
