"""Solving: from a request to a sealed plan, or to an explanation of why none exists.

``pipeline.solve`` runs the stages in order (prepare the problem, construct and improve a
warm start, prove bounds, search with CP-SAT, explain an infeasibility). Imports ``plan``
and ``costs``; needs OR-Tools (``shardplan[planner]``).
"""
