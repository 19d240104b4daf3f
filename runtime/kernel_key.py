"""What shards share to be tables of one kernel: ``KernelKey`` (where the weights live, their
data type, the cache's load factor and, for sequence kernels, the width).

Its own module because two sides read it: the layouts (``runtime.sharding.layout``) group a
rank's shards by it, and the kernels (``runtime.kernels``) build one FBGEMM kernel per key,
while the sharded module (``runtime.sharding.module``) uses both. Held by either, the key
would make ``runtime.kernels`` and ``runtime.sharding`` import each other.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from planner_service.plan.types import DataType


class Memory(StrEnum):
    """Where a kernel's weights live (FBGEMM's ``EmbeddingLocation`` of the same name)."""

    DEVICE = "DEVICE"
    MANAGED = "MANAGED"
    MANAGED_CACHING = "MANAGED_CACHING"
    HOST = "HOST"


class KernelKey(NamedTuple):
    """What shards on one rank share to be tables of one kernel."""

    memory: Memory
    data_type: DataType
    cache_load_factor: float  # 0 unless the memory is MANAGED_CACHING
    width: int = 0  # sequence kernels: the shards' columns (FBGEMM's unpooled kernels take
    # tables of one width); 0 for pooled kernels, which mix widths
    table: int = -1  # cpu: the table (one kernel per table, see ``layout.kernel_key``); -1
    # on cuda, where one kernel batches every table of a key
