"""Output distribution: pooled columns back to the rank whose samples they belong to, with
autograd-aware collectives (backward runs each one's adjoint).

Whole columns go back in one all-to-all and land by a fixed column map, so column shards
on one rank in any order are stitched in column order. Row-wise partial sums are
reduce-scattered over all ranks; table-row-wise partial sums are reduce-scattered inside the
host, then exchanged across hosts among the ranks with one local index. Data-parallel
replicas: a rank's output takes its own replica's values, while every replica gets the
gradient of every rank's output. Mean pooling divides by the bag length last.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from planner_service.plan.types import PoolingType
from runtime.comm import Group, all_to_all_with_grad, reduce_scatter_with_grad
from runtime.modules import EmbeddingBagConfig
from runtime.sharding.exchange import OutputExchange
from runtime.sharding.layout import features_of
from runtime.sparse import KeyedTensor, concat, index_tensor


class OutputDistribution:
    """This rank's ``OutputExchange`` as tensors on the device, and the subgroups it runs
    on: turns the columns its kernels pooled into its batch's output."""

    def __init__(
        self,
        exchange: OutputExchange,
        tables: Sequence[EmbeddingBagConfig],
        group: Group,
        families: list[list[list[int]]],
        device: torch.device,
    ) -> None:
        self.exchange, self.group = exchange, group
        self.host_group, self.cross_group = self._subgroups(families)
        self.whole_index = (
            None if exchange.all_whole else index_tensor(exchange.whole_index, device)
        )
        self.row_wise_index = index_tensor(exchange.row_wise_index, device)
        self.host_index = index_tensor(exchange.host_index, device)
        self.targets = None if exchange.targets_identity else index_tensor(exchange.targets, device)
        self.ghosts = (
            index_tensor(exchange.ghosts, device, torch.bool) if any(exchange.ghosts) else None
        )
        features = features_of(tables)
        self.keys = [feature.name for feature in features]
        self.dims = [tables[feature.table].embedding_dim for feature in features]
        self.mean_columns = _mean_columns(tables, device)

    def _subgroups(self, families: list[list[list[int]]]) -> tuple[Group | None, Group | None]:
        """The host's group (when it holds table-row-wise tables) and the cross-host group
        of this local index (when any host does). Every rank creates every family's group it
        belongs to, used or not (``subgroup_families`` says why)."""
        subgroups = [self.group.subgroup_of(family) for family in families]
        columns = self.exchange.host_columns
        if not any(columns):
            return None, None
        host_group, cross_group = subgroups
        return (host_group if columns[self.exchange.host] else None), cross_group

    def __call__(
        self, pooled: torch.Tensor, batches: list[int], lengths: torch.Tensor
    ) -> KeyedTensor:
        """This rank's output, every feature for its batch, from the columns its kernels
        pooled for every sender's batch (``batches``, this rank's included); ``lengths`` are
        its own batch's bags."""
        batch = batches[self.group.rank]
        gathered = concat(self._blocks(pooled, batches, batch), dim=1)
        if self.ghosts is not None:  # replicas elsewhere: gradient only, the value is our own
            gathered = gathered - gathered.detach() * self.ghosts
        out = gathered
        if self.targets is not None:
            out = gathered.new_zeros(batch, self.exchange.width)
            out = out.index_add(1, self.targets, gathered)
        if self.mean_columns is not None:
            feature_of_column, mean = self.mean_columns
            bags = lengths.view(len(self.keys), batch).t()[:, feature_of_column]
            out = out / torch.where(mean, bags.clamp(min=1), 1).to(out.dtype)
        return KeyedTensor(self.keys, self.dims, out)

    def _blocks(self, pooled: torch.Tensor, batches: list[int], batch: int) -> list[torch.Tensor]:
        """``[batch, columns]`` blocks of this rank's output, in ``targets`` order: whole
        columns from every rank, then row-wise sums, then table-row-wise sums by host."""
        exchange, group = self.exchange, self.group
        whole = pooled if self.whole_index is None else pooled.index_select(1, self.whole_index)
        mine = exchange.whole_columns[group.rank]
        blocks = _exchange_columns(
            whole, group, [b * mine for b in batches], batch, exchange.whole_columns
        )
        if not exchange.row_wise_index and self.cross_group is None:
            return blocks
        if exchange.pads_zero:
            pooled = torch.nn.functional.pad(pooled, (0, 1))
        if exchange.row_wise_index:
            partial = pooled.index_select(1, self.row_wise_index)
            blocks.append(reduce_scatter_with_grad(partial, group, batches))
        if self.cross_group is not None:
            blocks.extend(self._table_row_wise(pooled, batches, batch, self.cross_group))
        return blocks

    def _table_row_wise(
        self, pooled: torch.Tensor, batches: list[int], batch: int, cross_group: Group
    ) -> list[torch.Tensor]:
        """Reduce-scatter inside the host, then all-to-all among the ranks with this local
        index (one per host): ``[batch, columns of host g]`` for every host ``g``."""
        hosts, host = self.exchange.hosts, self.exchange.host
        # Host member j reduces the batches of local rank j of every host.
        per_member = [sum(batches[r] for r in hosts.peers(j)) for j in range(hosts.size)]
        if self.host_group is not None:
            partial = pooled.index_select(1, self.host_index)
            if hosts.count > 1 and hosts.size > 1:
                rows = partial.split(batches)
                partial = torch.cat([rows[r] for r in hosts.by_local_index()])
            reduced = reduce_scatter_with_grad(partial, self.host_group, per_member)
        else:  # nothing of this kind on this host: it only receives
            reduced = pooled.new_zeros(per_member[self.group.rank % hosts.size], 0)
        columns = self.exchange.host_columns
        send = [batches[r] * columns[host] for r in hosts.peers(self.group.rank)]
        return _exchange_columns(reduced, cross_group, send, batch, columns)


def _exchange_columns(
    block: torch.Tensor, group: Group, send_splits: list[int], batch: int, columns: Sequence[int]
) -> list[torch.Tensor]:
    """All-to-all of ``block``'s rows; member ``g`` sends back ``[batch, columns[g]]``."""
    recv_splits = [batch * c for c in columns]
    back = all_to_all_with_grad(block.reshape(-1), group, send_splits, recv_splits)
    return [chunk.view(batch, c) for chunk, c in zip(back.split(recv_splits), columns, strict=True)]


def _mean_columns(
    tables: Sequence[EmbeddingBagConfig], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each output column's feature and whether it is mean-pooled; ``None`` if none is."""
    per_feature = [tables[feature.table] for feature in features_of(tables)]
    if not any(table.pooling is PoolingType.MEAN for table in per_feature):
        return None
    feature_of_column = [f for f, t in enumerate(per_feature) for _ in range(t.embedding_dim)]
    mean = [t.pooling is PoolingType.MEAN for t in per_feature for _ in range(t.embedding_dim)]
    return index_tensor(feature_of_column, device), index_tensor(mean, device, torch.bool)
