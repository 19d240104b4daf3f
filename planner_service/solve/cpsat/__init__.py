"""The CP-SAT search stage: the aggregated placement model (``model.py``), the search that
solves it from the warm start (``search.py``), and how every CP-SAT run in the planner is
configured and stopped (``run.py``)."""
