"""``shardplan calibrate``'s library: microbenchmarks of this machine fit to a device
profile for the ``calibrated`` cost model (docs/cost-model.md, "Calibrating for your
hardware").

- ``profile``: ``calibrate`` (the stages within one budget, the profile), its settings and
  their checks, the machine's description;
- ``kernels``: FBGEMM's kernels forward and backward over a grid, and their fit;
- ``collectives``: the runtime's collectives on spawned ranks (``ranks``), and their fit;
- ``work``: the sharded module's step on one rank, less what the kernels explain;
- ``fit``: non-negative least squares and the fits' quality; ``timing``: the budget and the
  timing loop.
"""
