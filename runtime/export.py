"""``full_state``: the full (unsharded) tables and fused optimizer state of a sharded
collection or of every sharded collection in a model, for export or inspection.

Keys are the model's, as in a checkpoint: the collection's path in front of each of its
``full_state`` keys (``runtime.sharding.gather`` lists them with their shapes). The model's
dense part (its other parameters and buffers) is its own ``state_dict``'s.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.sharding.module import sharded_collections


def full_state(
    module: nn.Module, *, dst: int | None = None, optimizer_state: bool = True
) -> dict[str, torch.Tensor]:
    """``full_state`` of every sharded collection in ``module`` (``module`` itself when it
    is one), keyed by the model's state-dict keys, on rank ``dst`` or every rank (``None``);
    the other ranks get an empty dict. Every rank calls it."""
    parts = sharded_collections(module)
    if not parts:
        raise TypeError(
            f"{type(module).__name__} holds no sharded collection; shard it with shard_modules "
            "first (an unsharded module's tables are its state_dict)"
        )
    result: dict[str, torch.Tensor] = {}
    for path, sharded in parts:
        prefix = f"{path}." if path else ""
        gathered = sharded.full_state(dst=dst, optimizer_state=optimizer_state)
        result.update((prefix + key, value) for key, value in gathered.items())
    return result
