"""Where ids go and where pooled columns land: the index plans of the input and output
exchanges on one rank, pure functions of the plan and every rank's layout (no torch).

Input distribution works on a rank's *pool* of id segments, each a bag per sample of its
batch: segment ``f`` is feature ``f``'s ids (``F`` features), and for row-split tables
segment ``F + b * R + j`` is bucket ``b`` of the ``j``-th row-split feature (``R`` of
them): its ids in row block ``b``, made local to the block. Rank ``d`` receives from every
sender the segments for its routes, in route order.

Output distribution works on *local columns* (the columns this rank's kernels produce, in
``RankLayout.columns`` order, and one more, ``zero``, standing for zeros) and on *gathered
columns*: the blocks the exchanges hand back, whole columns from every rank in rank order,
then row-wise sums, then table-row-wise sums host by host. ``targets`` places each gathered
column in the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate

from planner_service.plan.shards import row_block_size
from planner_service.plan.types import ShardingType
from runtime.modules import BaseEmbeddingConfig
from runtime.plan import ROW_SPLIT, ModulePlan
from runtime.sharding.layout import Feature, Hosts, RankLayout, features_of, hosts_of


def is_identity(order: Sequence[int]) -> bool:
    """Whether picking ``order`` from a sequence of its length changes nothing (skip it)."""
    return list(order) == list(range(len(order)))


@dataclass(frozen=True)
class InputExchange:
    """What this rank sends (its pool's segments, to each rank) and how it orders what it
    receives for its kernels."""

    row_features: tuple[int, ...]  # features of row-split tables: bucketed by row block
    block_rows: tuple[int, ...]  # rows per block, per row-split feature
    buckets: int  # blocks of the most split table
    send_segments: tuple[int, ...]  # pool segments sent, destination by destination
    send_ranks: tuple[int, ...]  # the destination of each
    routes_to: tuple[int, ...]  # segments each rank receives from each sender (its routes)
    recv_order: tuple[int, ...]  # received segment (sender * routes + route) per kernel bag

    @cached_property
    def send_identity(self) -> bool:
        """Every feature goes once, in order, unbucketed (one rank holding everything)."""
        return not self.row_features and is_identity(self.send_segments)

    @cached_property
    def recv_identity(self) -> bool:
        """What arrives is already in kernel order (one sender or one route, each route
        pooled by one kernel feature)."""
        return is_identity(self.recv_order)


def input_exchange(
    plan: ModulePlan,
    tables: Sequence[BaseEmbeddingConfig],
    layouts: Sequence[RankLayout],
    rank: int,
) -> InputExchange:
    """What ``rank`` sends and how it orders what it receives. What goes where is the same
    on every rank (each sends its own batch); only the kernel order is this rank's."""
    features = features_of(tables)
    row_split = [plan.tables[table.name].sharding_type in ROW_SPLIT for table in tables]
    row_features = tuple(f for f, feature in enumerate(features) if row_split[feature.table])
    blocks = [len(plan.tables[table.name].shards) for table in tables]
    segment_of_bucket = {
        (f, b): len(features) + b * len(row_features) + j
        for j, f in enumerate(row_features)
        for b in range(blocks[features[f].table])
    }
    segments, ranks = [], []
    for d, layout in enumerate(layouts):
        block_of = {shard.table: shard.shard for shard in layout.shards}
        for f in layout.routes:
            table = features[f].table
            segments.append(segment_of_bucket[f, block_of[table]] if row_split[table] else f)
            ranks.append(d)
    return InputExchange(
        row_features=row_features,
        block_rows=tuple(
            row_block_size(tables[features[f].table].num_embeddings, blocks[features[f].table])
            for f in row_features
        ),
        buckets=max((blocks[t] for t in range(len(tables)) if row_split[t]), default=0),
        send_segments=tuple(segments),
        send_ranks=tuple(ranks),
        routes_to=tuple(len(layout.routes) for layout in layouts),
        recv_order=_kernel_order(layouts[rank], len(layouts)),
    )


def _kernel_order(layout: RankLayout, world_size: int) -> tuple[int, ...]:
    """Received segments come by (sender, route); kernels pool them by (kernel, kernel
    feature, sender), each kernel feature's ids for every sender's batch."""
    routes = len(layout.routes)
    return tuple(
        sender * routes + route
        for group in layout.groups
        for route, _ in group.features
        for sender in range(world_size)
    )


@dataclass(frozen=True)
class OutputExchange:
    """Which local columns each exchange sends and where the gathered columns land."""

    rank: int
    hosts: Hosts
    whole_columns: tuple[int, ...]  # whole columns each rank sends back (all-to-all)
    whole_index: tuple[int, ...]  # this rank's local columns that are whole
    row_wise_index: tuple[int, ...]  # local columns of the row-wise features (reduce-scatter)
    host_columns: tuple[int, ...]  # table-row-wise columns of each host
    host_index: tuple[int, ...]  # local columns of this host's table-row-wise features
    zero: int  # the local column of zeros, for features this rank holds no rows of
    targets: tuple[int, ...]  # the output column of each gathered column
    ghosts: tuple[bool, ...]  # gathered column is another rank's data-parallel replica
    width: int  # output columns: every feature's embedding, side by side

    @property
    def host(self) -> int:
        return self.rank // self.hosts.size

    @cached_property
    def all_whole(self) -> bool:
        """Every local column is whole: they are sent as they are."""
        return list(self.whole_index) == list(range(self.zero))

    @cached_property
    def pads_zero(self) -> bool:
        """Some row-split feature has no rows here: the local columns need the zero column."""
        return self.zero in self.row_wise_index or self.zero in self.host_index

    @cached_property
    def targets_identity(self) -> bool:
        """The gathered columns are the output as they are."""
        return len(self.targets) == self.width and is_identity(self.targets)

    def collectives(self) -> list[tuple[str, list[int]]]:
        """The collectives the output distribution runs on this rank, in order, with the
        ranks each runs on."""
        everyone = list(range(self.hosts.size * self.hosts.count))
        steps = [("all_to_all", everyone)]
        if self.row_wise_index:
            steps.append(("reduce_scatter", everyone))
        if any(self.host_columns):
            if self.host_columns[self.host]:  # a host without such tables only receives
                steps.append(("reduce_scatter", self.hosts.members(self.host)))
            steps.append(("all_to_all", self.hosts.peers(self.rank)))
        return steps


def output_exchange(
    plan: ModulePlan,
    tables: Sequence[BaseEmbeddingConfig],
    layouts: Sequence[RankLayout],
    rank: int,
) -> OutputExchange:
    """Whole columns (table-wise, column-wise, table-column-wise, data-parallel) go straight
    back to the sample's rank. Row blocks hold partial sums: row-wise ones are
    reduce-scattered over all ranks; table-row-wise ones inside their host (local rank ``j``
    gets the sums for the samples of every host's local rank ``j``), then exchanged across
    hosts among the ranks with one local index, so each sample's sum crosses hosts once,
    not once per block."""
    features = features_of(tables)
    dims = [tables[feature.table].embedding_dim for feature in features]
    starts = list(accumulate(dims, initial=0))
    me, hosts = layouts[rank], hosts_of(plan)
    whole, row_split_at = _local_columns(me)
    row_wise = _features_of_kind(plan, tables, features, ShardingType.ROW_WISE)
    on_host: list[list[int]] = [[] for _ in range(hosts.count)]
    for f in _features_of_kind(plan, tables, features, ShardingType.TABLE_ROW_WISE):
        on_host[plan.tables[tables[features[f].table].name].shards[0].rank // hosts.size].append(f)

    def gather(row_features: list[int]) -> tuple[int, ...]:
        """Local columns of each feature's partial sums; zeros where this rank has none
        (a table with fewer rows than blocks)."""
        return tuple(
            column
            for f in row_features
            for column in (
                range(row_split_at[f], row_split_at[f] + dims[f])
                if f in row_split_at
                else [me.width] * dims[f]
            )
        )

    targets: list[int] = []
    ghosts: list[bool] = []
    for d, layout in enumerate(layouts):
        for c in layout.columns:
            if not c.row_split:
                start = starts[c.feature] + c.offset
                targets.extend(range(start, start + c.width))
                ghosts.extend([c.replicated and d != rank] * c.width)
    for f in row_wise + [f for fs in on_host for f in fs]:
        targets.extend(range(starts[f], starts[f + 1]))
        ghosts.extend([False] * dims[f])
    return OutputExchange(
        rank=rank,
        hosts=hosts,
        whole_columns=tuple(layout.whole_width for layout in layouts),
        whole_index=whole,
        row_wise_index=gather(row_wise),
        host_columns=tuple(sum(dims[f] for f in fs) for fs in on_host),
        host_index=gather(on_host[rank // hosts.size]),
        zero=me.width,
        targets=tuple(targets),
        ghosts=tuple(ghosts),
        width=starts[-1],
    )


def _local_columns(layout: RankLayout) -> tuple[tuple[int, ...], dict[int, int]]:
    """The local columns that are whole, and each row-split feature's first local column."""
    whole: list[int] = []
    row_split_at: dict[int, int] = {}
    at = 0
    for c in layout.columns:
        if c.row_split:
            row_split_at[c.feature] = at
        else:
            whole.extend(range(at, at + c.width))
        at += c.width
    return tuple(whole), row_split_at


def _features_of_kind(
    plan: ModulePlan,
    tables: Sequence[BaseEmbeddingConfig],
    features: Sequence[Feature],
    kind: ShardingType,
) -> list[int]:
    return [
        f
        for f, feature in enumerate(features)
        if plan.tables[tables[feature.table].name].sharding_type is kind
    ]


@dataclass(frozen=True)
class SequenceExchange:
    """Where the rows a sequence module looked up go back to: one row per id, so nothing is
    reduced; each rank returns to every sender the rows of that sender's ids, and the sender
    places each row where its id stands in its own batch.

    A *segment* is one kernel feature's ids from one sender. This rank's kernels produce
    rows segment by segment in (kernel feature, sender) order; ``back_order`` regroups them
    sender by sender. Each rank receives back, from each holder ``d``, a *block* per kernel
    feature of ``d`` (in ``d``'s kernel order): the rows of the ids it sent ``d`` on that
    feature's route, ``width`` columns each, which land at ``column`` of the feature's
    embedding."""

    rank: int
    world_size: int
    kernel_widths: tuple[int, ...]  # columns of each kernel feature of this rank
    kernel_features: tuple[int, ...]  # kernel features of each of this rank's kernels
    back_order: tuple[int, ...]  # the (kernel feature, sender) segment of each sent segment
    blocks_from: tuple[int, ...]  # blocks each rank sends back
    block_segment: tuple[int, ...]  # the segment this rank sent, whose ids the block's rows are
    block_width: tuple[int, ...]
    block_column: tuple[int, ...]  # where the block's columns start in the feature's embedding
    block_feature: tuple[int, ...]
    block_ghost: tuple[bool, ...]  # another rank's data-parallel replica: gradient only
    block_row_split: tuple[bool, ...]  # a row block's rows: some of the segment's ids only
    dims: tuple[int, ...]  # each feature's embedding_dim

    @cached_property
    def back_identity(self) -> bool:
        return is_identity(self.back_order)


def sequence_exchange(
    tables: Sequence[BaseEmbeddingConfig], layouts: Sequence[RankLayout], rank: int
) -> SequenceExchange:
    """This rank's part in returning rows, from every rank's layout (the same send order
    as ``input_exchange``: destination by destination, each destination's routes)."""
    world = len(layouts)
    me = layouts[rank]
    widths = [me.shards[i].cols for group in me.groups for _, i in group.features]
    sent_from = list(accumulate((len(layout.routes) for layout in layouts), initial=0))
    blocks: list[tuple[int, int, int, int, bool, bool]] = []
    blocks_from = []
    for d, layout in enumerate(layouts):
        mine = [
            (
                sent_from[d] + r,
                shard.cols,
                shard.col_offset,
                layout.routes[r],
                shard.replicated and d != rank,
                shard.row_split,
            )
            for group in layout.groups
            for r, i in group.features
            for shard in [layout.shards[i]]
        ]
        blocks.extend(mine)
        blocks_from.append(len(mine))
    features = features_of(tables)
    return SequenceExchange(
        rank=rank,
        world_size=world,
        kernel_widths=tuple(widths),
        kernel_features=tuple(len(group.features) for group in me.groups),
        back_order=tuple(j * world + s for s in range(world) for j in range(len(widths))),
        blocks_from=tuple(blocks_from),
        block_segment=tuple(b[0] for b in blocks),
        block_width=tuple(b[1] for b in blocks),
        block_column=tuple(b[2] for b in blocks),
        block_feature=tuple(b[3] for b in blocks),
        block_ghost=tuple(b[4] for b in blocks),
        block_row_split=tuple(b[5] for b in blocks),
        dims=tuple(tables[feature.table].embedding_dim for feature in features),
    )
