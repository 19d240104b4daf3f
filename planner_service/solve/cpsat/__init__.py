"""The CP-SAT search stage: the aggregated placement model (``model.py``) and the search
that solves it from the warm start (``search.py``). How every CP-SAT run in the planner is
configured and stopped lives beside this package, in ``solve/cpsat_runner.py``: the
relaxations in ``bounds/`` run CP-SAT too, and the search uses their bounds, so neither
package imports the other's runner."""
