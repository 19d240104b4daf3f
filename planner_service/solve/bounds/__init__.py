"""Lower bounds on the best achievable max-rank cost: each proves how far a plan can be
from optimal, and lets the search stop at a plan proven optimal or within the gap limit.
"""
