"""The oracle: ``validator`` checks any plan against its request, and ``usage`` recomputes
each rank's memory and perf with the cost model. Imports ``plan`` and ``costs`` only, so the
runtime (which imports it to check a served plan) needs no solver.
"""
