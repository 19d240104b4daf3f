"""Perf and storage estimates: TorchRec 1.8's pinned values and our own fixes."""

from __future__ import annotations

import pytest

from planner_service.costs.enumerate import enumerate_options
from planner_service.costs.estimate import TableLoad
from planner_service.costs.options import ShardingOption
from planner_service.plan.types import ComputeKernel, Perf, ShardingType
from tests.support.builders import request, table

TW, RW, CW = ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE
TWRW, TWCW, DP = (
    ShardingType.TABLE_ROW_WISE,
    ShardingType.TABLE_COLUMN_WISE,
    ShardingType.DATA_PARALLEL,
)
FUSED, UVM, CACHING, DENSE = (
    ComputeKernel.FUSED,
    ComputeKernel.FUSED_UVM,
    ComputeKernel.FUSED_UVM_CACHING,
    ComputeKernel.DENSE,
)
EXACT = 1e-12


def _options(tables, world_size=2, cost_model="torchrec-1.8", **fields) -> list[ShardingOption]:
    options = fields.pop("options", {})
    req = request(
        tables, world_size=world_size, options={"cost_model": cost_model, **options}, **fields
    )
    return [o for entry in enumerate_options(req) for o in entry.options]


def _pick(options, kind, kernel, shards=None) -> ShardingOption:
    found = [
        o
        for o in options
        if o.sharding_type is kind
        and o.compute_kernel is kernel
        and (shards is None or len(o.shards) == shards)
    ]
    assert len(found) == 1, found
    return found[0]


def _perf(option: ShardingOption, shard: int = 0) -> Perf:
    return option.shards[shard].perf[0]


@pytest.fixture(scope="module")
def pinned():
    """The issue's reference case: world 2 on one host, cuda, batch 512, 100 x 10 fp32."""
    return _options([table("t", rows=100, dim=10)], topology={"local_world_size": 2})


def test_torchrec_table_wise_fused(pinned):
    perf = _perf(_pick(pinned, TW, FUSED))
    assert perf.fwd_compute == pytest.approx(3.27460077428233e-04, rel=EXACT)
    assert perf.fwd_comms == pytest.approx(6.357828776041667e-05, rel=EXACT)
    assert perf.bwd_compute == pytest.approx(6.54920154856466e-04, rel=EXACT)
    assert perf.bwd_comms == pytest.approx(6.357828776041667e-05, rel=EXACT)
    assert perf.total == pytest.approx(
        perf.fwd_compute + perf.fwd_comms + perf.bwd_compute + perf.bwd_comms + perf.prefetch,
        rel=EXACT,
    )
    assert perf.input_dist > 0  # reported separately, not in TorchRec's total


def test_torchrec_table_wise_uvm(pinned):
    assert _perf(_pick(pinned, TW, UVM)).fwd_compute == pytest.approx(
        0.09179115295410156, rel=EXACT
    )


def test_torchrec_row_wise_fused(pinned):
    option = _pick(pinned, RW, FUSED)
    for shard in range(2):
        perf = _perf(option, shard)
        assert perf.fwd_compute == pytest.approx(6.804365245261984e-05, rel=EXACT)
        assert perf.bwd_comms == pytest.approx(1.6798276699240525e-04, rel=EXACT)


def test_torchrec_data_parallel(pinned):
    perf = _perf(_pick(pinned, DP, DENSE))
    assert perf.fwd_compute == pytest.approx(9.356002212235228e-05, rel=EXACT)
    assert perf.bwd_comms == pytest.approx(2.25593945387348e-04, rel=EXACT)
    assert perf.fwd_comms == 0.0 and perf.input_dist == 0.0


@pytest.mark.parametrize(("rows", "dim", "hbm"), [(100, 64, 295_936), (200, 128, 634_880)])
def test_torchrec_table_wise_storage(rows, dim, hbm):
    storage = _pick(_options([table("t", rows=rows, dim=dim)]), TW, FUSED).shards[0].storage
    assert (storage.hbm_bytes, storage.ddr_bytes) == (hbm, 0)


def test_block_penalties_and_min_lookup_dim():
    options = _options([table("a", dim=32), table("b", dim=64), table("c", dim=128)])
    fwd = [
        _perf(o).fwd_compute for o in options if o.sharding_type is TW and o.compute_kernel is FUSED
    ]
    # read = 512*2*8; lookup = 512*2*max(d,32)*4; write = 512*2*d*4; HBM 897 GiB/s
    hbm_bytes_per_ms = 897 * 2**30 / 1000
    expected = [
        (8192 + 512 * 2 * d * 4 * 2) * penalty / hbm_bytes_per_ms
        for d, penalty in ((32, 1.75), (64, 1.15), (128, 1.0))
    ]
    assert fwd == pytest.approx(expected, rel=EXACT)


def test_weighted_tables_pay_double_reads_and_the_weights_kernel():
    plain = _perf(_pick(_options([table("t", dim=128)]), TW, FUSED))
    weighted = _perf(_pick(_options([table("t", dim=128, is_weighted=True)]), TW, FUSED))
    assert weighted.fwd_compute - plain.fwd_compute == pytest.approx(
        512 * 2 * 8 / (897 * 2**30 / 1000), rel=1e-9
    )
    assert weighted.bwd_compute == pytest.approx(weighted.fwd_compute * (2 + 1.1), rel=EXACT)


def test_uvm_caching_bandwidth_mixes_hbm_and_host_link():
    tw = _pick(
        _options([table("t", dim=128)], constraints={"tables": {"t": {"cache_load_factor": 0.5}}}),
        TW,
        CACHING,
    )
    fused = _pick(_options([table("t", dim=128)]), TW, FUSED)
    hbm, link = 897 * 2**30 / 1000, 32 * 2**30 / 1000
    ratio = _perf(tw).fwd_compute / _perf(fused).fwd_compute
    assert ratio == pytest.approx(hbm / ((0.5 * hbm + 0.5 * link) / 10), rel=1e-9)
    assert tw.cache_load_factor == 0.5


def test_multi_host_collectives_use_inter_host_bandwidth():
    one_host = _perf(_pick(_options([table("t")], world_size=4), TW, FUSED))
    two_hosts = _perf(
        _pick(_options([table("t")], world_size=4, topology={"local_world_size": 2}), TW, FUSED)
    )
    assert two_hosts.fwd_comms / one_host.fwd_comms == pytest.approx(600 / 12.5, rel=1e-9)
    twrw = _perf(
        _pick(_options([table("t")], world_size=4, topology={"local_world_size": 2}), TWRW, FUSED)
    )
    rw = _perf(
        _pick(_options([table("t")], world_size=4, topology={"local_world_size": 2}), RW, FUSED)
    )
    assert twrw.fwd_comms < rw.fwd_comms  # reduce-scatter inside the host, a2a across


INTRA, INTER = 600 * 2**30 / 1000, 12.5 * 2**30 / 1000  # bytes per ms
HBM = 897 * 2**30 / 1000


def test_table_row_wise_reduces_inside_the_host_then_exchanges_across_hosts():
    """Two hosts of two ranks, 512 bags of 16 fp32 columns per rank: each host reduce-
    scatters the global batch's bags inside itself (intra-host bandwidth), then sends its
    reduced bags to the other host (an all-to-all over the hosts, inter-host); backward
    gathers and exchanges the same amounts, plus the batched copy."""
    twrw = _perf(
        _pick(_options([table("t")], world_size=4, topology={"local_world_size": 2}), TWRW, FUSED)
    )
    inside = 512 * 4 * 16 * 4 / INTRA
    across = 512 * 2 * 16 * 4 / INTER
    assert twrw.fwd_comms == pytest.approx(inside + across, rel=EXACT)
    batched_copy = 512 * 4 * 16 * 4 * 2.455 / HBM
    assert twrw.bwd_comms == pytest.approx(inside + across + batched_copy, rel=EXACT)
    one_host = _perf(_pick(_options([table("t")], world_size=2), TWRW, FUSED))
    assert one_host.fwd_comms == pytest.approx(512 * 2 * 16 * 4 / INTRA, rel=EXACT)


def test_a_sequence_tables_host_local_shards_send_their_rows_back_in_one_all_to_all():
    """Two hosts of two ranks, 512 ids of 16 fp32 columns per rank, no pooling. Table-row-
    wise: each of the host's two row blocks gets half of the world's ids and sends their
    rows straight back to the four ranks (an all-to-all over both hosts: nothing to reduce
    inside the host first, unlike a pooled table), as row-wise does with its four blocks;
    backward adds the batched copy. Table-column-wise: one column shard serves every id, as
    column-wise does. Storage: a row block's buffers hold its share of the ids and rows."""
    options = _options([table("s", pooling="none")], world_size=4, topology={"local_world_size": 2})
    twrw, rw = _perf(_pick(options, TWRW, FUSED)), _perf(_pick(options, RW, FUSED))
    rows_back = 512 / 2 * 4 * 16 * 4  # a block's share of the world's ids, as rows
    assert twrw.fwd_comms == pytest.approx(rows_back / INTER, rel=EXACT)
    batched_copy = rows_back * 2.455 / HBM
    assert twrw.bwd_comms == pytest.approx(rows_back / INTER + batched_copy, rel=EXACT)
    assert rw.fwd_comms == pytest.approx(rows_back / 2 / INTER, rel=EXACT)  # four blocks
    twcw, cw = (_pick(options, kind, FUSED, shards=1) for kind in (TWCW, CW))
    assert _perf(twcw).fwd_comms == pytest.approx(512 * 4 * 16 * 4 / INTER, rel=EXACT)
    assert _perf(twcw) == _perf(cw)
    storage = _pick(options, TWRW, FUSED).shards[0].storage
    assert (storage.input_bytes, storage.output_bytes) == (512 / 2 * 4 * 8, rows_back)


@pytest.mark.parametrize(("world", "doubled"), [(4, 1), (6, 2), (8, 2)])
def test_data_parallel_all_reduce_doubles_beyond_two_hosts(world, doubled):
    """A replica's gradient (100 x 16 fp32) is all-reduced over the NICs of a host's two
    ranks, as a ring over min(hosts, 2) nodes, and TorchRec counts twice that beyond two
    hosts; the optimizer's elementwise kernels add 9.22 passes at dense bandwidth."""
    dp = _perf(
        _pick(_options([table("t")], world_size=world, topology={"local_world_size": 2}), DP, DENSE)
    )
    gradient = 100 * 16 * 4
    all_reduce = gradient * (2 * 2 - 1) / 2 / (INTER * 2) * doubled
    optimizer = gradient * 9.22 / (0.5 * HBM)
    assert dp.bwd_comms == pytest.approx(all_reduce + optimizer, rel=EXACT)


def test_table_load_counts_features_and_variable_batches():
    t = table("t", feature_names=["a", "b"], pooling_factors=[0.5, 3.0], batch_sizes=[100, 200])
    load = TableLoad.of(request([t]).tables[0], batch_size=512)
    assert load.batch_inputs == 0.5 * 100 + 3.0 * 200
    assert load.batch_outputs == 0.5 * 100 + 1.0 * 200  # a bag per sample with ids
    sequence = request([table("s", pooling="none", pooling_factors=[4.0])]).tables[0]
    assert TableLoad.of(sequence, 512).batch_outputs == 4.0 * 512  # one row per id


# --------------------------------------------------------------------------- storage


def test_kernel_storage_placement():
    rows, dim = 1000, 128
    weights = rows * dim * 4
    options = _options([table("t", rows=rows, dim=dim)])
    io = 512 * 2 * 8 + 512 * 2 * dim * 4
    fused = _pick(options, TW, FUSED).shards[0].storage
    uvm = _pick(options, TW, UVM).shards[0].storage
    caching = _pick(options, TW, CACHING).shards[0].storage
    assert (fused.hbm_bytes, fused.ddr_bytes) == (weights + io, 0)
    assert (uvm.hbm_bytes, uvm.ddr_bytes) == (io, weights)
    cache = round(weights * 0.2) + rows * (4 + 0.2 * 16)
    assert (caching.hbm_bytes, caching.ddr_bytes) == (io + cache, weights)


def test_row_wise_storage_splits_weights_and_empty_shards_cost_nothing():
    option = _pick(_options([table("t", rows=5, dim=16)], world_size=4), RW, FUSED)
    assert [s.sizes for s in option.shards] == [(2, 16), (2, 16), (1, 16), (0, 16)]
    assert option.offsets() == [(0, 0), (2, 0), (4, 0), (5, 0)]
    hbm = [s.storage.hbm_bytes for s in option.shards]
    io = 512 * 8 + 512 * 4 * 16 * 4  # ids / 4 ranks * 4 ranks * 8; pooled bags * 4 * 16 * 4
    assert hbm == [2 * 16 * 4 + io, 2 * 16 * 4 + io, 1 * 16 * 4 + io, 0]


def test_cpu_keeps_everything_in_ddr_and_uses_ddr_bandwidth():
    options = _options([table("t", dim=128)], topology={"compute_device": "cpu"})
    assert {(o.sharding_type, o.compute_kernel) for o in options} == {
        (TW, FUSED),
        (RW, FUSED),
        (CW, FUSED),
        (TWRW, FUSED),
        (TWCW, FUSED),
        (DP, DENSE),
    }
    tw = _pick(options, TW, FUSED)
    assert tw.shards[0].storage.hbm_bytes == 0
    assert tw.shards[0].storage.ddr_bytes == 100 * 128 * 4 + 512 * 2 * 8 + 512 * 2 * 128 * 4
    cuda = _pick(_options([table("t", dim=128)]), TW, FUSED)
    assert _perf(tw).fwd_compute / _perf(cuda).fwd_compute == pytest.approx(897 / 51, rel=1e-9)


@pytest.mark.parametrize(
    ("optimizer", "data_type", "state_bytes"),
    [
        ("sgd", "fp32", 0),
        ("rowwise_adagrad", "fp32", 1000 * 4),
        ("adagrad", "fp32", 1000 * 64 * 4),
        ("adam", "fp32", 2 * 1000 * 64 * 4),
        ("adam", "fp16", 2 * 1000 * 64 * 4),  # FBGEMM keeps fp32 moments for fp16 weights
    ],
)
def test_shardplan_counts_optimizer_state_torchrec_does_not(optimizer, data_type, state_bytes):
    t = table("t", rows=1000, dim=64, optimizer=optimizer, data_type=data_type)
    ours = _pick(_options([t], cost_model="shardplan"), TW, FUSED).shards[0].storage
    theirs = _pick(_options([t]), TW, FUSED).shards[0].storage
    assert ours.hbm_bytes - theirs.hbm_bytes == state_bytes
    uvm_ours = _pick(_options([t], cost_model="shardplan"), TW, UVM).shards[0].storage
    uvm_theirs = _pick(_options([t]), TW, UVM).shards[0].storage
    assert uvm_ours.ddr_bytes - uvm_theirs.ddr_bytes == state_bytes  # state lives with weights
    assert uvm_ours.hbm_bytes == uvm_theirs.hbm_bytes


def test_shardplan_counts_row_shard_state_per_shard_and_dp_gradient():
    t = table("t", rows=10, dim=16, optimizer="rowwise_adagrad")
    ours = _pick(_options([t], world_size=4, cost_model="shardplan"), RW, FUSED)
    theirs = _pick(_options([t], world_size=4), RW, FUSED)
    deltas = [
        a.storage.hbm_bytes - b.storage.hbm_bytes
        for a, b in zip(ours.shards, theirs.shards, strict=True)
    ]
    assert deltas == [3 * 4, 3 * 4, 3 * 4, 1 * 4]
    dp_ours = _pick(_options([t], cost_model="shardplan"), DP, DENSE).shards[0].storage
    dp_theirs = _pick(_options([t]), DP, DENSE).shards[0].storage
    assert dp_ours.hbm_bytes - dp_theirs.hbm_bytes == 10 * 4 + 10 * 16 * 4  # state + gradient


def test_shardplan_total_includes_input_dist():
    ours = _perf(_pick(_options([table("t")], cost_model="shardplan"), TW, FUSED))
    theirs = _perf(_pick(_options([table("t")]), TW, FUSED))
    assert ours.fwd_compute == theirs.fwd_compute
    assert ours.total == pytest.approx(theirs.total + theirs.input_dist, rel=EXACT)


def test_heterogeneous_ranks_price_shards_per_device_class():
    fields = {"topology": {"rank_overrides": [{"rank": 1, "hbm_bw_bytes_per_s": 897 * 2**30 / 2}]}}
    options = _options([table("t", dim=128)], **fields)
    tw = _pick(options, TW, FUSED)
    assert len(tw.shards[0].perf) == 2
    slow, fast = tw.shards[0].perf[1], tw.shards[0].perf[0]
    assert slow.fwd_compute == pytest.approx(2 * fast.fwd_compute, rel=1e-12)
    assert slow.fwd_comms == fast.fwd_comms


@pytest.mark.parametrize("cost_model", ["torchrec-1.8", "shardplan"])
def test_the_dense_kernel_streams_at_half_the_fused_kernels_bandwidth_on_cpu_too(cost_model):
    """TorchRec's kernel_bw_lookup prices the dense kernel at half the fused kernel's
    bandwidth on either device (HBM on cuda, DDR on cpu), so data-parallel's forward compute
    relative to table-wise fused is the same on both."""

    def data_parallel_over_table_wise(device: str) -> float:
        options = _options(
            [table("t", rows=1000, dim=64)],
            topology={"compute_device": device, "local_world_size": 2},
            cost_model=cost_model,
        )
        dense = _perf(_pick(options, DP, DENSE)).fwd_compute
        return dense / _perf(_pick(options, TW, FUSED)).fwd_compute

    assert data_parallel_over_table_wise("cpu") == pytest.approx(
        data_parallel_over_table_wise("cuda"), rel=EXACT
    )
