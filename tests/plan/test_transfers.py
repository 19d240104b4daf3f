"""The regions that move between two plans (``plan.transfers.table_transfers``,
``plan_transfers``) and those a rank keeps (``table_kept``): one rectangle per new shard
and source shard that overlap, in a fixed order, summing to the moved bytes that
``shardplan diff`` and the planner's ``migration`` report count."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_service.plan.diff import diff_plans
from planner_service.plan.transfers import (
    Box,
    Element,
    Transfer,
    plan_moves,
    plan_transfers,
    table_kept,
    table_moves,
    table_transfers,
)
from planner_service.plan.types import OptimizerType
from tests.support import builders
from tests.support.builders import request, table

ROWS, DIM = 100, 16
FP32 = Element()


def _transfers(old: list[Box], new: list[Box], *, replicated: bool = False, element=FP32):
    found = table_transfers("t", old, new, old_replicated=replicated, element=element)
    return [(t.src, t.dst, t.rows, t.cols, t.bytes) for t in found]


def _row_blocks(ranks: list[int], rows: int = ROWS) -> list[Box]:
    block = rows // len(ranks)
    return [(i * block, 0, block, DIM, rank) for i, rank in enumerate(ranks)]


def _replicas(ranks: list[int]) -> list[Box]:
    return [(0, 0, ROWS, DIM, rank) for rank in ranks]


def _bytes(rows: int, cols: int = DIM) -> int:
    return rows * cols * 4


def test_table_wise_to_row_wise_sends_every_block_but_the_one_its_rank_keeps():
    old = [(0, 0, ROWS, DIM, 1)]
    new = _row_blocks([0, 1, 2, 3])
    assert _transfers(old, new) == [
        (1, 0, (0, 25), (0, DIM), _bytes(25)),
        (1, 2, (50, 75), (0, DIM), _bytes(25)),
        (1, 3, (75, 100), (0, DIM), _bytes(25)),
    ]
    assert table_kept(old, new) == [(1, (25, 50), (0, DIM))]


def test_column_wise_to_table_wise_sends_the_other_ranks_columns():
    old = [(0, 0, ROWS, 8, 0), (0, 8, ROWS, 8, 1)]
    new = [(0, 0, ROWS, DIM, 1)]
    assert _transfers(old, new) == [(0, 1, (0, ROWS), (0, 8), _bytes(ROWS, 8))]
    assert table_kept(old, new) == [(1, (0, ROWS), (8, DIM))]


def test_data_parallel_to_row_wise_on_more_ranks_sends_from_replica_rank_mod_replicas():
    """Replicas on ranks 0 and 1 (world size 2); row-wise over 4 ranks: ranks 0 and 1 keep
    their block of their replica, ranks 2 and 3 receive theirs from replicas 0 and 1."""
    old = _replicas([1, 0])  # replicas count in rank order, whatever the shard order
    new = _row_blocks([0, 1, 2, 3])
    assert _transfers(old, new, replicated=True) == [
        (0, 2, (50, 75), (0, DIM), _bytes(25)),
        (1, 3, (75, 100), (0, DIM), _bytes(25)),
    ]
    assert table_kept(old, new) == [(0, (0, 25), (0, DIM)), (1, (25, 50), (0, DIM))]


def test_row_wise_over_2_ranks_to_3_moves_the_rows_whose_rank_changes():
    old = _row_blocks([0, 1], rows=90)
    new = _row_blocks([0, 1, 2], rows=90)
    assert _transfers(old, new) == [
        (0, 1, (30, 45), (0, DIM), _bytes(15)),
        (1, 2, (60, 90), (0, DIM), _bytes(30)),
    ]
    assert table_kept(old, new) == [(0, (0, 30), (0, DIM)), (1, (45, 60), (0, DIM))]


def test_row_wise_over_4_ranks_to_2_gathers_each_half_from_its_old_blocks_in_old_order():
    old = _row_blocks([0, 1, 2, 3])
    new = _row_blocks([0, 1])
    assert _transfers(old, new) == [
        (1, 0, (25, 50), (0, DIM), _bytes(25)),
        (2, 1, (50, 75), (0, DIM), _bytes(25)),
        (3, 1, (75, 100), (0, DIM), _bytes(25)),
    ]
    assert table_kept(old, new) == [(0, (0, 25), (0, DIM))]  # rank 1's old rows are not its new


def test_identical_layouts_move_nothing_in_any_shard_order():
    layout = _row_blocks([3, 1, 0, 2])
    assert _transfers(layout, list(reversed(layout))) == []
    assert _transfers(_replicas([0, 1]), _replicas([1, 0]), replicated=True) == []
    assert table_moves(layout, layout, old_replicated=False, element=FP32).moved_bytes == 0
    assert sorted(table_kept(layout, layout)) == sorted(
        (rank, (row, row + rows), (0, DIM)) for row, _, rows, _, rank in layout
    )


def test_a_new_replica_on_a_rank_that_had_one_receives_nothing():
    old = _replicas([0, 1])
    new = _replicas([0, 1, 2, 3])
    assert _transfers(old, new, replicated=True) == [
        (0, 2, (0, ROWS), (0, DIM), _bytes(ROWS)),
        (1, 3, (0, ROWS), (0, DIM), _bytes(ROWS)),
    ]


@pytest.mark.parametrize(
    ("optimizer", "state"),
    [
        (OptimizerType.SGD, 0),
        (OptimizerType.ROWWISE_ADAGRAD, 4 * 25),  # one fp32 per row of the region
        (OptimizerType.ADAGRAD, 4 * 25 * 8),  # one per element
        (OptimizerType.ADAM, 8 * 25 * 8),  # two per element
    ],
)
def test_each_region_carries_its_optimizer_state(optimizer, state):
    """Column shards become row blocks: every region is 25 rows x 8 columns, and a
    rowwise_adagrad region carries the state of its rows, once per region."""
    old = [(0, 0, ROWS, 8, 0), (0, 8, ROWS, 8, 1)]
    new = _row_blocks([2, 3, 0, 1])
    element = Element(weight_bytes=2, optimizer=optimizer)
    found = table_transfers("t", old, new, old_replicated=False, element=element)
    assert len(found) == 6  # ranks 2 and 3 from both; ranks 0 and 1 from the other's half
    assert {t.bytes for t in found} == {25 * 8 * 2 + state}
    moves = table_moves(old, new, old_replicated=False, element=element)
    assert moves.moved_bytes == sum(t.bytes for t in found)
    assert moves.elements == sum(t.elements for t in found) == 6 * 25 * 8


LAYOUTS: dict[str, tuple[list[Box], bool]] = {
    "table_wise": ([(0, 0, ROWS, DIM, 2)], False),
    "column_wise": ([(0, 0, ROWS, 4, 3), (0, 4, ROWS, 12, 0)], False),
    "row_wise_4": (_row_blocks([0, 1, 2, 3]), False),
    "row_wise_3": ([(0, 0, 33, DIM, 2), (33, 0, 33, DIM, 0), (66, 0, 34, DIM, 1)], False),
    "row_wise_2": (_row_blocks([1, 0]), False),
    "data_parallel_2": (_replicas([0, 1]), True),
    "data_parallel_4": (_replicas([0, 1, 2, 3]), True),
    "grid": ([(0, 0, 50, 8, 0), (0, 8, 50, 8, 1), (50, 0, 50, 8, 2), (50, 8, 50, 8, 3)], False),
}


@pytest.mark.parametrize(("before", "after"), list(itertools.permutations(LAYOUTS, 2)))
def test_kept_and_received_regions_tile_every_new_shard_exactly(before, after):
    """Every element of a new shard is kept or received, once: the regions of one new
    shard do not overlap and add up to it (no rows are new here: the table keeps its
    size)."""
    old, replicated = LAYOUTS[before]
    new, _ = LAYOUTS[after]
    transfers = table_transfers("t", old, new, old_replicated=replicated, element=FP32)
    regions = [(t.dst, t.rows, t.cols) for t in transfers] + table_kept(old, new)
    for shard in new:
        cells = [
            (row, col)
            for rank, rows, cols in regions
            if rank == shard[4]
            for row in range(max(rows[0], shard[0]), min(rows[1], shard[0] + shard[2]))
            for col in range(max(cols[0], shard[1]), min(cols[1], shard[1] + shard[3]))
        ]
        assert len(cells) == len(set(cells)) == shard[2] * shard[3], (before, after, shard)
    for transfer in transfers:
        assert transfer.src != transfer.dst
        assert transfer.bytes == 4 * transfer.elements


@st.composite
def _layouts(draw, rows: int, cols: int) -> tuple[list[Box], bool]:
    """A random layout of a rows x cols table on up to 5 ranks: whole replicas, or a grid
    of row and column cuts whose cells go to any ranks (a rank may hold several; past
    ``_RowIndex.SEARCHED_FROM`` shards, the search by rows is used)."""
    if draw(st.booleans()):
        ranks = draw(st.lists(st.integers(0, 4), min_size=1, max_size=5, unique=True))
        return [(0, 0, rows, cols, rank) for rank in ranks], True
    row_cuts = sorted(draw(st.sets(st.integers(1, rows - 1), max_size=rows // 2)))
    col_cuts = sorted(draw(st.sets(st.integers(1, cols - 1), max_size=3)))
    row_edges, col_edges = [0, *row_cuts, rows], [0, *col_cuts, cols]
    boxes = [
        (r0, c0, r1 - r0, c1 - c0, draw(st.integers(0, 4)))
        for r0, r1 in itertools.pairwise(row_edges)
        for c0, c1 in itertools.pairwise(col_edges)
    ]
    return draw(st.permutations(boxes)), False


def _meet(a: Box, b: Box):
    rows = (max(a[0], b[0]), min(a[0] + a[2], b[0] + b[2]))
    cols = (max(a[1], b[1]), min(a[1] + a[3], b[1] + b[3]))
    return (rows, cols) if rows[0] < rows[1] and cols[0] < cols[1] else None


def _every_pair(old: list[Box], new: list[Box], replicated: bool):
    """The module docstring's rule tried on every pair of shards, as (src, dst, rows,
    cols) and kept (rank, rows, cols): the oracle for the indexed search."""
    replicas = sorted(old, key=lambda box: box[4])
    moved, kept = [], []
    for box in new:
        if replicated:
            holders = {other[4] for other in old}
            sources = [] if box[4] in holders else [replicas[box[4] % len(replicas)]]
        else:
            sources = [other for other in old if other[4] != box[4]]
        moved += [(s[4], box[4], *_meet(box, s)) for s in sources if _meet(box, s)]
        kept += [(box[4], *_meet(box, o)) for o in old if o[4] == box[4] and _meet(box, o)]
    return ([] if sorted(old) == sorted(new) else moved), kept


@settings(max_examples=200, deadline=None)
@given(data=st.data(), rows=st.integers(2, 40), cols=st.integers(2, 12))
def test_any_two_layouts_tile_every_new_shard_with_kept_and_received_regions(data, rows, cols):
    (old, replicated), (new, _) = data.draw(_layouts(rows, cols)), data.draw(_layouts(rows, cols))
    element = Element(2, OptimizerType.ROWWISE_ADAGRAD)
    transfers = table_transfers("t", old, new, old_replicated=replicated, element=element)
    kept = table_kept(old, new)
    assert ([(t.src, t.dst, t.rows, t.cols) for t in transfers], kept) == _every_pair(
        old, new, replicated
    )
    replica_ranks = {box[4] for box in old}
    for shard in new:
        cells = [
            (row, col)
            for rank, (r0, r1), (c0, c1) in [(t.dst, t.rows, t.cols) for t in transfers] + kept
            if rank == shard[4]
            for row in range(max(r0, shard[0]), min(r1, shard[0] + shard[2]))
            for col in range(max(c0, shard[1]), min(c1, shard[1] + shard[3]))
        ]
        # once each (a rank's other new shards are disjoint from this one)
        assert len(cells) == len(set(cells)) == shard[2] * shard[3]
    for transfer in transfers:
        assert transfer.src != transfer.dst and transfer.elements > 0
        assert transfer.bytes == element.region_bytes(
            transfer.rows[1] - transfer.rows[0], transfer.cols[1] - transfer.cols[0]
        )
        if replicated:
            assert transfer.dst not in replica_ranks
    moves = table_moves(old, new, old_replicated=replicated, element=element)
    assert moves.moved_bytes == sum(t.bytes for t in transfers)
    assert moves.elements == sum(t.elements for t in transfers)


def _ceil_blocks(rows: int, ranks: int, shift: int) -> list[Box]:
    block = -(-rows // ranks)
    starts = range(0, rows, block)
    return [
        (row, 0, min(block, rows - row), 4, (i + shift) % ranks) for i, row in enumerate(starts)
    ]


def test_row_wise_resplits_over_many_ranks_find_every_overlapping_block():
    """Row blocks from 16 to 40 ranks (searched by rows) re-split over 1 to 40, blocks of
    every size meeting at every offset: the same regions as trying every pair."""
    for before in range(16, 41):
        for after in range(1, 41):
            old, new = _ceil_blocks(997, before, 0), _ceil_blocks(997, after, 1)
            transfers = table_transfers("t", old, new, old_replicated=False, element=FP32)
            found = [(t.src, t.dst, t.rows, t.cols) for t in transfers], table_kept(old, new)
            assert found == _every_pair(old, new, False), (before, after)


# --------------------------------------------------------------------------- whole plans


def test_plan_transfers_sum_to_the_moved_bytes_that_diff_and_plan_moves_count():
    tables = [
        table("a", rows=1000, dim=64, optimizer="rowwise_adagrad"),
        table("b", rows=500, dim=32, data_type="fp16", optimizer="adam"),
        table("c", rows=200, dim=8),
    ]
    old_req, new_req = request(tables, world_size=2), request(tables, world_size=3)
    old = builders.plan(
        old_req,
        {
            "a": builders.column_wise(old_req, "a", [32, 32], [0, 1]),
            "b": builders.data_parallel(old_req, "b"),
            "c": builders.table_wise(old_req, "c", 1),
        },
    )
    new = builders.plan(
        new_req,
        {
            "a": builders.row_wise(new_req, "a"),
            "b": builders.row_wise(new_req, "b"),
            "c": builders.table_wise(new_req, "c", 1),
        },
    )
    transfers = plan_transfers(old, new.tables, new_req)
    moves = plan_moves(old, new.tables, new_req)
    diff = diff_plans(old, new, new_req)
    assert sum(t.bytes for t in transfers) == moves.moved_bytes == diff.moved_bytes > 0
    assert [t.table for t in transfers] == sorted(
        (t.table for t in transfers), key=list(new.tables).index
    )
    assert {t.table for t in transfers} == {"a", "b"}  # c stays on rank 1
    for rank in range(3):
        assert sum(t.bytes for t in transfers if t.src == rank) == moves.sent.get(rank, 0)
        assert sum(t.bytes for t in transfers if t.dst == rank) == moves.received.get(rank, 0)
    # b (fp16, adam) moves only to rank 2, from replica 2 mod 2 = 0, rows 334-499 (166 rows)
    (b,) = [t for t in transfers if t.table == "b"]
    assert (b.src, b.dst, b.rows, b.cols) == (0, 2, (334, 500), (0, 32))
    assert b.bytes == 166 * 32 * 2 + 2 * 166 * 32 * 4


def test_elements_override_the_request_and_default_to_fp32_without_state():
    req = request([table("a", rows=100, dim=16, optimizer="adagrad")], world_size=2)
    old = builders.plan(req, {"a": builders.table_wise(req, "a", 0)})
    new = builders.plan(req, {"a": builders.table_wise(req, "a", 1)})
    assert [t.bytes for t in plan_transfers(old, new.tables)] == [100 * 16 * 4]
    assert [t.bytes for t in plan_transfers(old, new.tables, req)] == [2 * 100 * 16 * 4]
    adam = {"a": Element(4, OptimizerType.ADAM)}
    assert plan_transfers(old, new.tables, req, elements=adam) == [
        Transfer("a", 0, 1, (0, 100), (0, 16), 3 * 100 * 16 * 4)
    ]
