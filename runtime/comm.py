"""Collectives the sharded module uses, with autograd where gradients cross ranks.

A ``Group`` is a process group (the module's, or a subgroup of it: the ranks of one host,
or the ranks with one local index across hosts) and this process's rank in it. On a group
of one rank every exchange is the identity, so the same code runs on one rank without a
process group at all.
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

    def subgroup(self, ranks: list[int]) -> Group:
        """The group of ``ranks`` (ranks of this group, this rank among them). Only its
        members call this; the subgroup is created once per process and reused."""
        if self.rank not in ranks:
            raise ValueError(f"rank {self.rank} is not in the subgroup {ranks}")
        if len(ranks) == 1:
            return Group(None)
        if sorted(ranks) == list(range(self.world_size)):
            return self
        assert self.pg is not None
        members = tuple(sorted(dist.get_global_rank(self.pg, r) for r in ranks))
        # Keyed by the default group too: a process that re-initialises torch.distributed
        # gets new subgroups, not ones from the destroyed group.
        key = (id(dist.group.WORLD), members)
        if key not in _SUBGROUPS:
            # Only the members rendezvous, so hosts create their groups independently.
            _SUBGROUPS[key] = dist.new_group(list(members), use_local_synchronization=True)
        return Group(_SUBGROUPS[key])

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


_SUBGROUPS: dict[tuple[int, tuple[int, ...]], dist.ProcessGroup] = {}


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


class _ReduceScatter(torch.autograd.Function):
    """Sum ``x`` over the group and give member ``j`` the rows of its chunk; backward gives
    every member the gradient of every chunk (an all-gather)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, group: Group, row_splits: list[int]
    ) -> torch.Tensor:
        ctx.group, ctx.row_splits = group, row_splits
        x = x.contiguous()
        out = x.new_empty((row_splits[group.rank],) + tuple(x.shape[1:]))
        if len(set(row_splits)) == 1:
            dist.reduce_scatter_single(out, x, group=group.pg)
        else:  # chunks of different sizes (ranks with different batch sizes)
            dist.reduce_scatter(out, list(x.split(row_splits)), group=group.pg)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        splits: list[int] = ctx.row_splits
        longest = max(splits)
        grad = grad.contiguous()
        if grad.shape[0] < longest:  # all-gather needs equal sizes: pad, then trim
            grad = torch.cat([grad, grad.new_zeros((longest - grad.shape[0],) + grad.shape[1:])])
        gathered = grad.new_empty((longest * len(splits),) + tuple(grad.shape[1:]))
        dist.all_gather_single(gathered, grad, group=ctx.group.pg)
        if longest * len(splits) != sum(splits):
            gathered = torch.cat(
                [chunk[:n] for chunk, n in zip(gathered.split(longest), splits, strict=True)]
            )
        return gathered, None, None


def reduce_scatter_with_grad(x: torch.Tensor, group: Group, row_splits: list[int]) -> torch.Tensor:
    """``x`` is ``[sum(row_splits), ...]``, chunk ``j`` for member ``j``; returns this member's
    chunk summed over the group (gradient: every member's output gradient, concatenated)."""
    if group.world_size == 1:
        return x
    result: torch.Tensor = _ReduceScatter.apply(x, group, row_splits)
    return result
