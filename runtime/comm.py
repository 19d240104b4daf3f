"""Collectives the sharded module uses, with autograd where gradients cross ranks.

One process group of ``world`` ranks; on a group of one rank every exchange is a local copy,
so the same code runs unsharded-on-one-rank without a process group at all.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class Group:
    """A process group (or none, for one rank) and this process's rank in it."""

    def __init__(self, pg: dist.ProcessGroup | None) -> None:
        self.pg = pg
        self.world_size = dist.get_world_size(pg) if pg is not None else 1
        self.rank = dist.get_rank(pg) if pg is not None else 0

    def all_to_all(
        self, send: torch.Tensor, send_splits: list[int], recv_splits: list[int]
    ) -> torch.Tensor:
        """Rank r's ``send[send_splits[d] chunk]`` goes to rank d, which receives it as its
        ``recv_splits[r]`` chunk (no autograd). On one rank: ``send`` itself, not a copy."""
        if self.world_size == 1:
            return send
        recv = send.new_empty((sum(recv_splits),) + tuple(send.shape[1:]))
        dist.all_to_all_single(recv, send.contiguous(), recv_splits, send_splits, group=self.pg)
        return recv

    def all_gather_object(self, value: Any) -> list[Any]:
        if self.world_size == 1:
            return [value]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, value, group=self.pg)
        return gathered


class _AllToAll(torch.autograd.Function):
    """All-to-all whose backward sends each gradient chunk back where its value came from."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, send: torch.Tensor, group: Group, send_splits: list[int], recv_splits: list[int]
    ) -> torch.Tensor:
        ctx.group, ctx.send_splits, ctx.recv_splits = group, send_splits, recv_splits
        return group.all_to_all(send, send_splits, recv_splits)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        back = ctx.group.all_to_all(grad.contiguous(), ctx.recv_splits, ctx.send_splits)
        return back, None, None, None


def all_to_all_with_grad(
    send: torch.Tensor, group: Group, send_splits: list[int], recv_splits: list[int]
) -> torch.Tensor:
    if group.world_size == 1:
        return send
    result: torch.Tensor = _AllToAll.apply(send, group, send_splits, recv_splits)
    return result
