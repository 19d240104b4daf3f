"""The solving engine, one module per stage (``pipeline.py`` runs them in order):

- ``problem.py``: the placement problem every stage shares; ``prepare.py``: options fitted,
  the problem built and bounded, and the warm start;
- ``construct.py`` (greedy construction) and ``improve.py`` (local search), both placing
  tables with ``placement.py``;
- ``bounds/``: the simple bounds, the LP, the option-mix and packing relaxations;
- ``cpsat/``: the CP-SAT model and search;
- ``explain.py``: why there is no plan and the smallest fixes; ``emit.py``: the sealed plan.
"""

from planner_service.solve.pipeline import SolveOutcome, solve

__all__ = ["SolveOutcome", "solve"]
