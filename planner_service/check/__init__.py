"""The capacity check: does a request fit, how much room each rank has left, what binds
its plan, what would keep a margin, and the same questions on other clusters (what-if).
One analysis, served by ``shardplan check`` and by POST /v1/check alike; the documents it
returns are the vocabulary's (``plan/api.py``: ``CheckReport``, ``CheckResult``) and
``reports/check.py`` renders them.

- ``source``: what the check plans with (``PlanSource``: a request to its ``Answer``).
- ``headroom``: every rank's use of its usable memory, and the spread over the ranks.
- ``binding``: what limits a plan, or what stops any.
- ``margin``: the reservation that keeps every rank within a utilization limit.
- ``report``: one check, from a plan (or why there is none) to its ``CheckReport``.
- ``what_if``: the check at other world and HBM sizes, and the least world size.

Imports plan and costs only, never solve: every plan comes from the ``PlanSource`` the
caller gives (the solver in the CLI's process, the service's solver pool, or the service
over HTTP), so the service and a CI runner without OR-Tools run the same analysis.
"""
