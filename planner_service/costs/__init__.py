"""Costs: the ways each table can be sharded and what each costs.

``options`` is the vocabulary of a sharding option and its shards' estimates;
``enumerate`` lists every table's options and keeps those a rank can hold; ``estimate`` is
the cost model (perf and storage per shard). Imports only ``plan``.
"""
