"""The plan page in process (``service/pages``): what it computes at a glance (tiers,
bottleneck, fullest ranks, fixed costs, what moved) and that it stays bounded for plans of
thousands of ranks and tables. How it looks in a browser: test_pages_browser.py."""

from __future__ import annotations

import json
import re
import time

from planner_service.costs.calibrated import fixed_perf
from planner_service.plan.codec import parse_request
from planner_service.plan.types import ComputeKernel, ShardingType
from planner_service.plan.units import size
from planner_service.service.pages.glance import (
    HELD_NAMES_SHOWN,
    MAX_RANK_ROWS,
    Tier,
    plan_glance,
)
from planner_service.service.pages.plan import render_plan_page
from planner_service.solve.pipeline import solve
from tests.support import builders
from tests.support.builders import request, table


def _rows(page: str) -> list[str]:
    return re.findall(r'<tr data-ranks="([0-9-]+)"', page)


def _held_cells(page: str) -> list[str]:
    return re.findall(r"<td class=held>(.*?)</td>", page)


def test_each_row_names_what_its_ranks_hold_and_the_bottleneck_its_component():
    req = request([table("a", rows=10_000, dim=64), table("b"), table("c")], world_size=4)
    plan = builders.plan(
        req,
        {
            "a": builders.row_wise(req, "a"),
            "b": builders.table_wise(req, "b", 2),
            "c": builders.column_wise(req, "c", [8, 8], [2, 2]),
        },
    )
    glance = plan_glance(req, plan)
    held = {
        row.label: [(h.table, h.sharding_type, h.shards) for h in row.held] for row in glance.rows
    }
    assert held == {
        "0-1": [("a", ShardingType.ROW_WISE, 1)],
        "2": [
            ("a", ShardingType.ROW_WISE, 1),
            ("b", ShardingType.TABLE_WISE, 1),
            ("c", ShardingType.COLUMN_WISE, 2),
        ],
        "3": [("a", ShardingType.ROW_WISE, 1)],
    }
    worst = max(plan.rank_stats, key=lambda stats: stats.perf.total)
    assert glance.bottleneck is not None and glance.bottleneck.rank == worst.rank == 2
    components = {name: getattr(worst.perf, name) for name in glance.summed}
    assert glance.bottleneck.component == max(components, key=lambda name: components[name])
    page = render_plan_page(req, plan)
    assert "a <small>RW</small>" in page and "c <small>CW ×2</small>" in page
    assert '<tr data-ranks="2" class="bottleneck">' in page
    assert f"most of it is <b>{glance.bottleneck.component}</b>" in page


def test_tiers_are_where_the_tables_live_and_sizes_show_their_numbers():
    cpu = request([table("a", rows=1000, dim=16)], world_size=2, topology={"compute_device": "cpu"})
    cpu_plan = builders.plan(cpu, {"a": builders.table_wise(cpu, "a", 0)})
    assert plan_glance(cpu, cpu_plan).tiers == (Tier.DDR,)
    page = render_plan_page(cpu, cpu_plan)
    used = cpu_plan.rank_stats[0].ddr_bytes
    assert 0 < used < 2**20 and f"{size(used)} <span class=note>&lt;0.1%</span>" in page
    assert "HBM used" not in page and "DDR used" in page

    cuda = request([table("a"), table("b")], world_size=2, topology={"hbm_bytes": "1GiB"})
    tables = {
        "a": builders.table_wise(cuda, "a", 0),
        "b": builders.table_wise(cuda, "b", 1, ComputeKernel.FUSED_UVM),
    }
    assert plan_glance(cuda, builders.plan(cuda, tables)).tiers == (Tier.HBM, Tier.DDR)
    only_hbm = {"a": tables["a"], "b": builders.table_wise(cuda, "b", 1)}
    assert plan_glance(cuda, builders.plan(cuda, only_hbm)).tiers == (Tier.HBM,)


def test_a_tight_rank_is_called_out():
    req = request([table("a"), table("b")], world_size=2, topology={"hbm_bytes": "1GiB"})
    tables = {"a": builders.table_wise(req, "a", 0), "b": builders.table_wise(req, "b", 1)}
    usable = plan_glance(req, builders.plan(req, tables)).rows[0].capacity.hbm_bytes
    plan = builders.plan(req, tables, hbm_bytes=[int(usable * 0.95), 2**20])
    (fullest,) = plan_glance(req, plan).fullest
    assert (fullest.rank, fullest.tight_ranks) == (0, 1)
    page = render_plan_page(req, plan)
    assert "1 rank(s) at 90% or more of usable" in page
    assert 'class="fill hbm tight" style="width:95.00%"' in page


def test_fixed_costs_of_the_calibrated_model_have_their_own_row():
    req = request(
        [table("a", rows=1000, dim=16), table("b", rows=2000, dim=16)],
        world_size=2,
        topology={"compute_device": "cpu"},
        options={"cost_model": "calibrated", "device_profile": builders.device_profile("cpu")},
    )
    plan = builders.plan(
        req, {"a": builders.row_wise(req, "a"), "b": builders.table_wise(req, "b", 1)}
    )
    fixed = fixed_perf(req, {ShardingType.ROW_WISE, ShardingType.TABLE_WISE})
    glance = plan_glance(req, plan)
    assert glance.fixed == fixed and fixed.total > 0
    page = render_plan_page(req, plan)
    row = re.search(r"<tr class=fixed>(.*?)</tr>", page)
    assert row is not None
    assert (
        f"<td class=num>{fixed.total:.4f}</td><td class=num>{fixed.fwd_compute:.4f}</td>" in row[1]
    )
    assert "ms of every rank's time is paid whatever it holds" in page


def test_a_replanned_plan_shows_what_moved():
    old_req = request([table("a", rows=10_000, dim=64), table("b", rows=20_000, dim=64)])
    old = solve(old_req).plan
    assert old is not None
    document = old_req.model_dump(mode="json")
    document["tables"][0]["num_embeddings"] = 400_000  # a grows: the plan changes
    document["options"] = {"previous_plan": old.model_dump(mode="json")}
    req = parse_request(json.dumps(document))
    plan = solve(req).plan
    assert plan is not None and plan.migration is not None
    moved = plan_glance(req, plan).moved
    assert moved is not None and moved.previous_known
    page = render_plan_page(req, plan)
    assert f"{size(plan.migration.moved_bytes)} of weights and optimizer state move" in page
    for change in moved.tables:
        assert f"<tr class=moved><td>{change.name}</td>" in page
        assert f"<td class=num>{size(change.moved_bytes)}</td></tr>" in page
    for ranks in plan.migration.ranks:
        row = re.search(rf'<tr data-ranks="[0-9-]*\b{ranks.rank}\b[^"]*".*?</tr>', page)
        assert row is not None
        text = f"{size(ranks.received_bytes)} in<br>{size(ranks.sent_bytes)} out</td></tr>"
        assert row[0].endswith(text)


def test_a_page_of_thousands_of_ranks_and_tables_stays_bounded():
    world, count = 1024, 4000
    req = request(
        [table(f"t{i}", rows=1000 + i) for i in range(count)] + [table("big", rows=10**6, dim=64)],
        world_size=world,
        topology={"local_world_size": 8},
    )
    tables = {f"t{i}": builders.table_wise(req, f"t{i}", i % world) for i in range(count)}
    tables["big"] = builders.row_wise(req, "big")
    plan = builders.plan(req, tables)
    began = time.perf_counter()
    page = render_plan_page(req, plan)
    seconds = time.perf_counter() - began
    assert len(_rows(page)) == world  # every rank differs: a row each, none left out
    assert len(page) < 3 * 2**20, len(page)
    assert seconds < 10, seconds  # a guard against a quadratic page, not a benchmark
    for cell in _held_cells(page):  # "big" and four or five t* each
        names = re.findall(r"<span class=t>(\S+) <small>", cell)
        assert len(names) <= HELD_NAMES_SHOWN and names[0] == "big"
    assert "+1 more" not in page  # at most 6 tables per rank here: every name is shown


def test_rows_beyond_the_cap_keep_the_bottleneck_the_fullest_and_the_most_loaded():
    world = MAX_RANK_ROWS + 512
    wide = world - 1  # its table is wider: more loaded than the other t* ranks
    req = request(
        [table(f"t{i}", dim=64 if i == wide else 16) for i in range(world)]
        + [table(f"x{i}") for i in range(9)],
        world_size=world,
        topology={"local_world_size": 8, "hbm_bytes": "1GiB"},
    )
    tables = {f"t{i}": builders.table_wise(req, f"t{i}", i) for i in range(world)}
    tables |= {f"x{i}": builders.table_wise(req, f"x{i}", 7) for i in range(9)}
    usable = plan_glance(req, builders.plan(req, {"t0": tables["t0"]})).rows[0].capacity
    hbm = [2**20] * world
    hbm[world // 2] = usable.hbm_bytes  # the fullest, though among the least loaded
    plan = builders.plan(req, tables, hbm_bytes=hbm)
    glance = plan_glance(req, plan)
    assert glance.bottleneck is not None and glance.bottleneck.rank == 7  # ten tables
    assert glance.fullest[0].rank == world // 2
    page = render_plan_page(req, plan)
    rows = _rows(page)
    assert len(rows) == MAX_RANK_ROWS
    assert {"7", str(world // 2), str(wide)} <= set(rows)
    assert f"Shown: {MAX_RANK_ROWS} of {world} rows" in page
    assert "+4 more</span>" in page  # rank 7: t7 and x0-x8, six named
    hidden = re.findall(r"ranks ([0-9]+)(?:-([0-9]+))? not shown", page)
    assert sum(int(last or first) - int(first) + 1 for first, last in hidden) == world - len(rows)


def test_a_plan_over_16384_alike_ranks_is_a_few_rows():
    world = 16_384
    req = request(
        [table("t0", rows=1_000_000, dim=64), table("t1", rows=20_000, dim=128)],
        world_size=world,
        topology={"local_world_size": 8},
    )
    plan = builders.plan(
        req, {"t0": builders.table_wise(req, "t0", 0), "t1": builders.row_wise(req, "t1")}
    )
    began = time.perf_counter()
    page = render_plan_page(req, plan)
    seconds = time.perf_counter() - began
    # t1's 20,000 rows in blocks of two: the ranks from 10,000 on hold none
    assert _rows(page) == ["0", "1-9999", f"10000-{world - 1}"]
    assert len(page) < 64 * 1024 and seconds < 10, (len(page), seconds)
