"""Sharding a module by a plan: pure functions build the plan of work, a thin module runs it.

- ``layout``: what each rank holds (shards, routed features, kernel groups, columns).
- ``exchange``: the index plans of the input and output exchanges on one rank.
- ``inputs`` / ``outputs``: those plans as tensors, run by the collectives of a forward pass.
- ``weights``: initial shard weights and the state dict.
- ``state`` / ``gather``: each shard's weight and optimizer state; the full tables and state
  gathered from every rank.
- ``module``: ``ShardedEmbeddingBagCollection`` and ``shard_modules``.

The layouts and exchange plans take the plan, the tables and a rank, and need no process
group: every rank computes them for itself and all agree (tests/runtime/test_sharding.py
checks them by hand).
"""
