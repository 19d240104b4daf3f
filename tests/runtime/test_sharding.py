"""The sharded module's plan of work, checked by hand: layouts, kernel groups and the index
plans of both exchanges, for small plans on two and four ranks (pure functions: no process
group, no kernels)."""

from __future__ import annotations

import torch

from planner_service.plan.types import ComputeKernel, DataType, PoolingType
from runtime import (
    EmbeddingBagConfig,
    EmbeddingConfig,
    ModulePlan,
    column_wise,
    construct_module_plan,
    data_parallel,
    row_wise,
    table_row_wise,
    table_wise,
)
from runtime.comm import Group
from runtime.kernel_key import KernelKey, Memory
from runtime.sharding.exchange import input_exchange, output_exchange, sequence_exchange
from runtime.sharding.layout import (
    Column,
    Feature,
    Hosts,
    LocalShard,
    build_layouts,
    features_of,
    hosts_of,
    subgroup_families,
)
from runtime.sharding.sequence import SequenceOutputDistribution

HOST = KernelKey(Memory.HOST, DataType.FP32, 0.0)

# Two ranks. Features f1, f2 (table tw), cw, rw, dp: 4 + 4 + 8 + 4 + 4 = 24 output columns.
MIXED = [
    EmbeddingBagConfig("tw", 6, 4, feature_names=["f1", "f2"]),
    EmbeddingBagConfig("cw", 5, 8),  # columns 0..4 on rank 0, 4..8 on rank 1
    EmbeddingBagConfig("rw", 5, 4, pooling=PoolingType.MEAN),  # rows 0..3 on 0, 3..5 on 1
    EmbeddingBagConfig("dp", 3, 4),
]
MIXED_PLAN = construct_module_plan(
    MIXED,
    {"tw": table_wise(1), "cw": column_wise([0, 1]), "rw": row_wise(), "dp": data_parallel()},
    world_size=2,
)


def test_features_are_in_table_then_feature_order():
    assert features_of(MIXED) == (
        Feature("f1", 0),
        Feature("f2", 0),
        Feature("cw", 1),
        Feature("rw", 2),
        Feature("dp", 3),
    )


def host(table: int) -> KernelKey:
    return HOST._replace(table=table)


def test_each_rank_holds_its_shards_pooled_by_one_kernel_per_table_on_cpu():
    zero, one = build_layouts(MIXED_PLAN, MIXED)
    assert zero.shards == (
        LocalShard(1, 0, 0, 5, 0, 4, replicated=False, row_split=False, key=host(1)),
        LocalShard(2, 0, 0, 3, 0, 4, replicated=False, row_split=True, key=host(2)),
        LocalShard(3, 0, 0, 3, 0, 4, replicated=True, row_split=False, key=host(3)),
    )
    assert zero.routes == (2, 3, 4)  # cw, rw, dp: the features of the tables it holds
    assert [g.key for g in zero.groups] == [host(1), host(2), host(3)]
    assert [g.shards for g in zero.groups] == [(0,), (1,), (2,)]
    assert [g.features for g in zero.groups] == [((0, 0),), ((1, 1),), ((2, 2),)]
    assert zero.columns == (
        Column(2, 0, 4, replicated=False, row_split=False),
        Column(3, 0, 4, replicated=False, row_split=True),
        Column(4, 0, 4, replicated=True, row_split=False),
    )
    assert (zero.width, zero.whole_width) == (12, 8)
    # Rank 1: both features of tw look up its one table-wise shard.
    assert [(s.table, s.shard, s.row_offset, s.rows, s.col_offset) for s in one.shards] == [
        (0, 0, 0, 6, 0),
        (1, 1, 0, 5, 4),
        (2, 1, 3, 2, 0),
        (3, 1, 0, 3, 0),
    ]
    assert one.routes == (0, 1, 2, 3, 4)
    assert [g.features for g in one.groups] == [((0, 0), (1, 0)), ((2, 1),), ((3, 2),), ((4, 3),)]
    assert [g.feature_table_map() for g in one.groups] == [[0, 0], [0], [0], [0]]
    assert [(c.feature, c.offset) for c in one.columns] == [(0, 0), (1, 0), (2, 4), (3, 0), (4, 0)]


def test_kernels_are_split_by_memory_data_type_and_cache_load_factor_on_cuda_only():
    tables = [
        EmbeddingBagConfig("fused", 4, 4),
        EmbeddingBagConfig("half", 4, 4, data_type=DataType.FP16),
        EmbeddingBagConfig("dense", 4, 4),
        EmbeddingBagConfig("cached", 4, 4),
    ]
    plan = construct_module_plan(
        tables,
        {
            "fused": table_wise(0),
            "half": table_wise(0),
            "dense": table_wise(0, ComputeKernel.DENSE),
            "cached": table_wise(0, ComputeKernel.FUSED_UVM_CACHING),
        },
        world_size=1,
    )
    [cuda] = build_layouts(plan, tables, cuda=True)
    assert [(g.key, g.shards) for g in cuda.groups] == [
        (KernelKey(Memory.DEVICE, DataType.FP16, 0.0), (1,)),
        (KernelKey(Memory.DEVICE, DataType.FP32, 0.0), (0, 2)),  # dense and fused: one kernel
        (KernelKey(Memory.MANAGED_CACHING, DataType.FP32, 0.2), (3,)),  # the default factor
    ]
    [cpu] = build_layouts(plan, tables, cuda=False)  # all host memory: a kernel per table
    assert [(g.key.data_type, g.shards) for g in cpu.groups] == [
        (DataType.FP16, (1,)),
        (DataType.FP32, (0,)),
        (DataType.FP32, (2,)),
        (DataType.FP32, (3,)),
    ]


def test_input_exchange_sends_row_buckets_to_their_blocks_and_orders_for_the_kernels():
    layouts = build_layouts(MIXED_PLAN, MIXED)
    zero = input_exchange(MIXED_PLAN, MIXED, layouts, 0)
    # Pool segments: features 0..4, then rw's buckets: 5 (rows 0..3) and 6 (rows 3..5).
    assert (zero.row_features, zero.block_rows, zero.buckets) == ((3,), (3,), 2)
    assert zero.send_segments == (2, 5, 4, 0, 1, 2, 6, 4)
    assert zero.send_ranks == (0, 0, 0, 1, 1, 1, 1, 1)
    assert zero.routes_to == (3, 5)
    # Received by (sender, route), 3 routes: the kernel takes route 0 from both senders, ...
    assert zero.recv_order == (0, 3, 1, 4, 2, 5)
    assert not zero.send_identity and not zero.recv_identity
    one = input_exchange(MIXED_PLAN, MIXED, layouts, 1)
    assert one.send_segments == zero.send_segments  # what goes where is the same on every rank
    assert one.recv_order == (0, 5, 1, 6, 2, 7, 3, 8, 4, 9)


def test_output_exchange_places_whole_columns_and_reduces_row_blocks():
    layouts = build_layouts(MIXED_PLAN, MIXED)
    zero = output_exchange(MIXED_PLAN, MIXED, layouts, 0)
    # Local columns: cw 0..4, rw's partial sums 4..8, dp 8..12; 12 stands for zeros.
    assert zero.whole_columns == (8, 16)
    assert zero.whole_index == (0, 1, 2, 3, 8, 9, 10, 11) and not zero.all_whole
    assert zero.row_wise_index == (4, 5, 6, 7) and zero.zero == 12 and not zero.pads_zero
    assert zero.host_columns == (0,) and zero.host_index == ()
    # Output columns: f1 0..4, f2 4..8, cw 8..16, rw 16..20, dp 20..24.
    from_zero = [*range(8, 12), *range(20, 24)]  # cw's first half, dp
    from_one = [*range(0, 8), *range(12, 16), *range(20, 24)]  # f1, f2, cw's second half, dp
    assert zero.targets == (*from_zero, *from_one, *range(16, 20))  # then the rw sums
    # Rank 1's dp replica lands on rank 0's output for the gradient only.
    assert zero.ghosts == (False,) * 20 + (True,) * 4 + (False,) * 4
    assert zero.width == 24 and not zero.targets_identity
    assert zero.collectives() == [("all_to_all", [0, 1]), ("reduce_scatter", [0, 1])]


def test_column_shards_on_one_rank_in_any_order_land_at_their_column_offsets():
    tables = [EmbeddingBagConfig("t", 4, 12)]
    plan = construct_module_plan(tables, {"t": column_wise([1, 0, 1])}, world_size=2)
    # The shards listed right to left, as a plan may list them.
    sharding = plan.tables["t"]
    shards = sharding.shards[::-1]
    reversed_plan = ModulePlan(
        2, {"t": sharding.model_copy(update={"shards": shards, "ranks": [1, 0, 1]})}
    )
    layouts = build_layouts(reversed_plan, tables)
    assert [(s.shard, s.col_offset) for s in layouts[1].shards] == [(0, 8), (2, 0)]
    assert layouts[1].groups[0].feature_table_map() == [0, 1]  # the feature, once per shard
    out = output_exchange(reversed_plan, tables, layouts, 0)
    assert out.whole_columns == (4, 8)
    assert out.targets == (*range(4, 8), *range(8, 12), *range(0, 4))


def test_table_row_wise_sums_reduce_in_the_host_then_cross_hosts():
    # Four ranks, hosts of two: a (3 rows) on host 1, c (1 row) on host 0, b on rank 0.
    tables = [
        EmbeddingBagConfig("a", 3, 4),
        EmbeddingBagConfig("b", 2, 4),
        EmbeddingBagConfig("c", 1, 4),
    ]
    plan = construct_module_plan(
        tables,
        {"a": table_row_wise(1), "b": table_wise(0), "c": table_row_wise(0)},
        world_size=4,
        local_world_size=2,
    )
    layouts = build_layouts(plan, tables)
    assert [layout.routes for layout in layouts] == [(1, 2), (), (0,), (0,)]  # c's block 1: 0 rows
    inputs = input_exchange(plan, tables, layouts, 0)
    # Buckets: a's block b is segment 3 + 2b, c's is 4 + 2b.
    assert (inputs.row_features, inputs.block_rows, inputs.buckets) == ((0, 2), (2, 1), 2)
    assert inputs.send_segments == (1, 4, 3, 5) and inputs.send_ranks == (0, 0, 2, 3)
    assert inputs.routes_to == (2, 0, 1, 1)
    outputs = [output_exchange(plan, tables, layouts, rank) for rank in range(4)]
    assert [o.host_columns for o in outputs] == [(4, 4)] * 4
    assert outputs[0].host_index == (4, 5, 6, 7)  # after b's whole columns
    assert outputs[1].host_index == (0, 0, 0, 0) and outputs[1].pads_zero  # no rows of c
    assert outputs[2].host_index == (0, 1, 2, 3)
    # b's whole columns, then the sums of host 0 (c), then of host 1 (a).
    assert outputs[2].targets == (*range(4, 8), *range(8, 12), *range(0, 4))
    everyone = [0, 1, 2, 3]
    assert outputs[1].collectives() == [
        ("all_to_all", everyone),
        ("reduce_scatter", [0, 1]),
        ("all_to_all", [1, 3]),
    ]
    assert outputs[2].collectives() == [
        ("all_to_all", everyone),
        ("reduce_scatter", [2, 3]),
        ("all_to_all", [0, 2]),
    ]


def test_a_host_without_table_row_wise_tables_only_receives():
    tables = [EmbeddingBagConfig("a", 4, 4), EmbeddingBagConfig("b", 4, 4)]
    plan = construct_module_plan(
        tables, {"a": table_row_wise(1), "b": row_wise()}, world_size=4, local_world_size=2
    )
    layouts = build_layouts(plan, tables)
    zero = output_exchange(plan, tables, layouts, 0)
    assert zero.host_columns == (0, 4) and zero.host_index == ()
    assert zero.collectives() == [
        ("all_to_all", [0, 1, 2, 3]),
        ("reduce_scatter", [0, 1, 2, 3]),
        ("all_to_all", [0, 2]),
    ]


def test_hosts_and_the_subgroup_families_every_rank_creates():
    hosts = Hosts(size=2, count=3)
    assert hosts.members(1) == [2, 3]
    assert hosts.peers(3) == [1, 3, 5]
    assert hosts.by_local_index() == [0, 2, 4, 1, 3, 5]
    tables = [EmbeddingBagConfig("a", 4, 4), EmbeddingBagConfig("b", 4, 4)]
    with_hosts = construct_module_plan(
        tables, {"a": table_row_wise(2), "b": table_wise(0)}, world_size=6, local_world_size=2
    )
    assert hosts_of(with_hosts) == hosts
    assert subgroup_families(with_hosts) == [[[0, 1], [2, 3], [4, 5]], [[0, 2, 4], [1, 3, 5]]]
    without = construct_module_plan(
        tables, {"a": row_wise(), "b": table_wise(0)}, world_size=6, local_world_size=2
    )
    assert hosts_of(without) == Hosts(size=6, count=1)  # one host of every rank
    assert subgroup_families(without) == []


def test_one_rank_holding_everything_skips_every_permutation():
    tables = [EmbeddingBagConfig("a", 4, 4), EmbeddingBagConfig("b", 4, 8)]
    plan = construct_module_plan(tables, {"a": table_wise(0), "b": table_wise(0)}, world_size=1)
    layouts = build_layouts(plan, tables)
    inputs = input_exchange(plan, tables, layouts, 0)
    assert inputs.send_identity and inputs.recv_identity
    outputs = output_exchange(plan, tables, layouts, 0)
    assert outputs.all_whole and outputs.targets_identity and not any(outputs.ghosts)
    assert outputs.collectives() == [("all_to_all", [0])]


# --------------------------------------------------------------------------- sequence

# Two ranks, sequence tables: a (features a1, a2; columns 0..4 and 8..12 on rank 0, 4..8
# on rank 1, listed [0, 1, 0]), b (rows 0..2 on rank 0, 2..3 on rank 1), c (rank 1).
SEQUENCE = [
    EmbeddingConfig("a", 5, 12, feature_names=["a1", "a2"]),
    EmbeddingConfig("b", 3, 4),
    EmbeddingConfig("c", 7, 8),
]
SEQUENCE_PLAN = construct_module_plan(
    SEQUENCE,
    {"a": column_wise([0, 1, 0]), "b": row_wise(), "c": table_wise(1)},
    world_size=2,
)


def test_sequence_kernels_hold_one_width_and_take_features_shard_by_shard():
    zero, one = build_layouts(SEQUENCE_PLAN, SEQUENCE, sequence=True)
    # Rank 0: a's two column shards and b's first row block, all 4 wide: one kernel, whose
    # features go shard by shard (a1, a2 on shard 0; a1, a2 on shard 1; b on shard 2).
    assert [(s.table, s.col_offset, s.cols) for s in zero.shards] == [
        (0, 0, 4),
        (0, 8, 4),
        (1, 0, 4),
    ]
    # On cpu a kernel per table: a's two shards in one, b's block in another.
    assert [g.key.width for g in zero.groups] == [4, 4]
    assert [g.features for g in zero.groups] == [((0, 0), (1, 0), (0, 1), (1, 1)), ((2, 2),)]
    # never back to an earlier table
    assert [g.feature_table_map() for g in zero.groups] == [[0, 0, 1, 1], [0]]
    # Rank 1: a's middle shard, b's block (both 4 wide) and c (8 wide): three kernels.
    assert [g.key.width for g in one.groups] == [4, 4, 8]
    assert [g.feature_table_map() for g in one.groups] == [[0, 0], [0], [0]]
    # On cuda one kernel per width: the features still go shard by shard.
    zero_cuda, one_cuda = build_layouts(SEQUENCE_PLAN, SEQUENCE, cuda=True, sequence=True)
    [group] = zero_cuda.groups
    assert group.features == ((0, 0), (1, 0), (0, 1), (1, 1), (2, 2))
    assert group.feature_table_map() == [0, 0, 1, 1, 2]
    assert [g.feature_table_map() for g in one_cuda.groups] == [[0, 0, 1], [0]]


def test_sequence_rows_come_back_to_their_columns_from_every_holder():
    layouts = build_layouts(SEQUENCE_PLAN, SEQUENCE, sequence=True)
    zero = sequence_exchange(SEQUENCE, layouts, 0)
    # Rank 0 sends rank 0 its routes a1, a2, b (segments 0..2), rank 1 a1, a2, b, c (3..6).
    assert zero.kernel_widths == (4, 4, 4, 4, 4)
    assert zero.kernel_features == (4, 1)  # a's two shards, two features each; b's block
    assert zero.back_order == (0, 2, 4, 6, 8, 1, 3, 5, 7, 9)  # (feature, sender) by sender
    assert zero.blocks_from == (5, 4)
    assert zero.block_segment == (0, 1, 0, 1, 2, 3, 4, 5, 6)
    assert zero.block_column == (0, 0, 8, 8, 0, 4, 4, 0, 0)
    assert zero.block_width == (4, 4, 4, 4, 4, 4, 4, 4, 8)
    assert zero.block_feature == (0, 1, 0, 1, 2, 0, 1, 2, 3)
    assert not any(zero.block_ghost) and zero.dims == (12, 12, 4, 8)
    # Only b's row blocks hold some of a segment's ids; a's column blocks and c hold all.
    assert zero.block_row_split == (False, False, False, False, True, False, False, True, False)


def test_sequence_features_whose_blocks_hold_all_their_ids_are_handed_over_not_gathered():
    layouts = build_layouts(SEQUENCE_PLAN, SEQUENCE, sequence=True)
    outputs = SequenceOutputDistribution(
        sequence_exchange(SEQUENCE, layouts, 0), SEQUENCE, Group(None), torch.device("cpu")
    )
    # a1, a2 (a's column blocks at columns 0, 4, 8) and c come back whole; b, row-wise, from
    # its row blocks by a gather of its chunks alone (4 wide, where the module's unit is 4).
    assert outputs.whole == {0: [0, 5, 2], 1: [1, 6, 3], 3: [8]}
    assert outputs.placement is not None and outputs.placement.blocks.tolist() == [4, 7]
    assert outputs.placement.unit == 4
    # The received buffer is cut at whole blocks; b's two blocks are two runs here.
    assert outputs.runs == [(0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,), (8,)]
