"""Collectives the sharded module uses, with autograd where gradients cross ranks.

A ``Group`` is a process group (the module's, or a subgroup of it: the ranks of one host,
or the ranks with one local index across hosts) and this process's rank in it. On a group
of one rank every exchange is the identity, so the same code runs on one rank without a
process group at all.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


class SubgroupTimeoutError(RuntimeError):
    """The members of a subgroup did not all create it before the deadline."""


class Group:
    """A process group (or none, for one rank), this process's rank in it, and how long
    creating a subgroup of it may wait for the other members."""

    def __init__(self, pg: dist.ProcessGroup | None, timeout: timedelta | None = None) -> None:
        self.pg = pg
        self.world_size = dist.get_world_size(pg) if pg is not None else 1
        self.rank = dist.get_rank(pg) if pg is not None else 0
        self.timeout = timeout if timeout is not None else _timeout_of(pg)

    def subgroup_of(self, family: list[list[int]]) -> Group:
        """This rank's group in ``family``, a partition of this group's ranks; every rank of
        the group calls this with the same families in the same order.

        Why whole partitions: torch names a subgroup made with local synchronization after its
        ranks and the number of process groups the calling process already has, so the
        members rendezvous only if each has created as many before. A rank belongs to one
        group of a partition into groups of one size, so after each family every rank has
        created the same number (one, or none where the groups are single ranks or the whole
        group), whichever groups the plan then uses. A family is created once per process and
        parent group, then reused."""
        flat = sorted(r for ranks in family for r in ranks)
        if flat != list(range(self.world_size)) or len({len(ranks) for ranks in family}) != 1:
            raise ValueError(
                f"subgroups {family} must be of one size and hold each of the "
                f"{self.world_size} ranks exactly once"
            )
        mine = next(ranks for ranks in family if self.rank in ranks)
        if len(mine) == 1:
            return Group(None)
        if len(mine) == self.world_size:
            return self
        assert self.pg is not None
        members = tuple(sorted(dist.get_global_rank(self.pg, r) for r in mine))
        key = (self.pg, members)  # the cache holds the parent: its id is never reused
        if key not in _SUBGROUPS:
            _SUBGROUPS[key] = self._create(members)
        return Group(_SUBGROUPS[key], self.timeout)

    def _create(self, members: tuple[int, ...]) -> dist.ProcessGroup:
        """The process group of ``members`` (global ranks); only they take part. Past the
        deadline, an error naming them instead of a hang."""
        try:
            return dist.new_group(
                list(members), timeout=self.timeout, use_local_synchronization=True
            )
        except dist.DistError as error:  # the store's wait, or gloo's connect, timed out
            me = dist.get_rank()
            raise SubgroupTimeoutError(
                f"rank {me} waited {self.timeout.total_seconds():g} s for ranks "
                f"{list(members)} to create their subgroup and they did not all join: every "
                "rank must create the same subgroups in the same order (a rank that sharded "
                "another plan, or created other process groups with "
                f"use_local_synchronization, names its groups differently). torch: {error}"
            ) from error

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


_SUBGROUPS: dict[tuple[dist.ProcessGroup, tuple[int, ...]], dist.ProcessGroup] = {}


def _timeout_of(pg: dist.ProcessGroup | None) -> timedelta:
    """How long ``pg``'s collectives wait (``init_process_group``'s or ``new_group``'s
    ``timeout``), so creating its subgroups waits no longer; torch's default where the
    backend does not say."""
    for device in getattr(pg, "_device_types", []):
        try:
            timeout = pg._get_backend(device).options._timeout  # type: ignore[union-attr]
        except (AttributeError, RuntimeError):
            continue
        if isinstance(timeout, timedelta):
            return timeout
    return dist.default_pg_timeout


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
    result: torch.Tensor = _AllToAll.apply(_in_graph(send), group, send_splits, recv_splits)
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
    result: torch.Tensor = _ReduceScatter.apply(_in_graph(x), group, row_splits)
    return result


def _in_graph(x: torch.Tensor) -> torch.Tensor:
    """``x``, recorded by autograd even where it carries no gradient (a rank that only
    receives sends an empty block): a collective's backward is a collective too, so every
    member must run it when one does, or the others wait for this rank."""
    if x.requires_grad or not torch.is_grad_enabled():
        return x
    return x.detach().requires_grad_()
