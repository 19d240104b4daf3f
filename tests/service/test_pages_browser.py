"""The plan page in headless Chromium, served by a real ``shardplan serve`` on loopback:
what a screenshot shows, asserted on the layout (element boxes after layout) and on the
screenshot's pixels at those boxes, not only on the HTML text. A small use of memory draws
a visible bar with its number beside it, a cpu plan's memory is in DDR and not zero, every
perf component is a number on screen, the bottleneck row is highlighted with its largest
component marked, and a re-planned plan shows what moved."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from planner_service.plan.codec import parse_plan, parse_request
from planner_service.plan.diff import diff_plans
from planner_service.plan.types import ShardingPlan
from planner_service.plan.units import size
from planner_service.reports.tables import SHARDING_TYPE_SHORT
from planner_service.service.pages.plan import MIN_BAR_PX
from tests.support.browser import Box, Image, boxes, dump_dom, screenshot
from tests.support.servers import Service, started_service

pytestmark = [pytest.mark.slow, pytest.mark.browser]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "request.json"
WINDOW = (1280, 900)
HBM_RGB, DDR_RGB = (0x76, 0xB7, 0xB2), (0xED, 0xC9, 0x48)
BOTTLENECK_RGB, TAG_RGB = (0xFF, 0xF1, 0xC9), (0xD6, 0x27, 0x28)
SELECTORS = [
    "tr[data-ranks]",
    "tr[data-ranks] > td",
    ".fill",
    ".tag",
    "td.dominant",
    "tr.moved",
    "table.ranks th.comp",
]


@pytest.fixture(scope="module")
def service(shardplan_exe, tmp_path_factory):
    server = started_service(shardplan_exe, tmp_path_factory.mktemp("pages"), {})
    yield server
    server.stop()


def stored_plan(service: Service, document: dict) -> ShardingPlan:
    with httpx.Client(base_url=service.base, timeout=120) as http:
        created = http.post("/v1/plans", json=document)
    assert created.status_code in (200, 201), created.text
    return parse_plan(created.content)


def look(
    service: Service, plan: ShardingPlan, scratch: Path, window: tuple[int, int] = WINDOW
) -> tuple[Image, list[Box], str]:
    """The served page's screenshot, its boxes after layout at the same window size, and
    its HTML."""
    url = f"{service.base}/v1/plans/{plan.plan_id}/view"
    page = httpx.get(url, timeout=120)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    image = screenshot(url, scratch / "view.png", window)
    return image, boxes(page.text, SELECTORS, window, scratch), page.text


def picked(found: list[Box], selector: str, ranks: str | None = None) -> list[Box]:
    return [b for b in found if b.selector == selector and (ranks is None or b.ranks == ranks)]


def held_on(plan: ShardingPlan, rank: int) -> dict[str, str]:
    """What the plan puts on ``rank``, as the page names it: table -> "TW", "CW ×2"."""
    held: dict[str, str] = {}
    for name, sharding in plan.tables.items():
        count = sum(1 for shard in sharding.shards if shard.rank == rank)
        if count:
            short = SHARDING_TYPE_SHORT[sharding.sharding_type]
            held[name] = short if count == 1 else f"{short} ×{count}"
    return held


def test_example_plan_reads_at_a_glance_in_chromium(service, tmp_path):
    plan = stored_plan(service, json.loads(EXAMPLE.read_text()))
    image, found, page = look(service, plan, tmp_path)
    stats = {s.rank: s for s in plan.rank_stats}
    rows = picked(found, "tr[data-ranks]")
    assert [row.ranks for row in rows] == ["0-1", "2", "3"]  # 0 and 1 hold a column each
    components = [b.text for b in picked(found, "table.ranks th.comp")]
    assert components == ["fwd_compute", "fwd_comms", "bwd_compute", "bwd_comms", "input_dist"]

    for row in rows:
        first = int(row.ranks.split("-")[0])
        cells = picked(found, "tr[data-ranks] > td", row.ranks)
        # What the ranks hold, in the row itself: "items CW" on ranks 0-1, and so on.
        held = dict(part.split(" ", 1) for part in cells[1].text.split(", "))
        assert held == held_on(plan, first)
        # A bar for HBM of any width at all, and the number beside it, both on screen.
        (fill,) = picked(found, ".fill", row.ranks)
        assert fill.width >= MIN_BAR_PX and fill.inside(*WINDOW)
        assert image.rgb(*fill.centre) == HBM_RGB
        assert cells[3].text.startswith(size(stats[first].hbm_bytes)) and cells[3].inside(*WINDOW)
        # Every component's time is a number on screen, not a tooltip.
        for name, cell in zip(components, cells[-len(components) :], strict=True):
            value = getattr(stats[first].perf, name)
            assert cell.inside(*WINDOW)
            assert cell.text == ("<0.0001" if 0 < value < 5e-5 else f"{value:.4f}"), name

    # Rank 2's categories table is 1.30 MiB of 13.60 GiB usable: under 0.1%, still drawn.
    (small,) = picked(found, ".fill", "2")
    assert stats[2].hbm_bytes < 0.001 * 13.6 * 2**30 and small.width >= MIN_BAR_PX
    assert "<0.1%" in picked(found, "tr[data-ranks] > td", "2")[3].text

    # The bottleneck: highlighted on screen, tagged, its largest component marked.
    worst = max(plan.rank_stats, key=lambda s: s.perf.total)
    (tag,) = picked(found, ".tag")
    assert tag.ranks == str(worst.rank) and tag.text == "bottleneck" and tag.inside(*WINDOW)
    assert image.rgb(int(tag.x) + 2, tag.centre[1]) == TAG_RGB
    (row,) = picked(found, "tr[data-ranks]", str(worst.rank))
    assert (
        "bottleneck" in row.classes and image.rgb(int(row.x) + 2, row.centre[1]) == BOTTLENECK_RGB
    )
    (dominant,) = picked(found, "td.dominant")
    largest = max(components, key=lambda name: getattr(worst.perf, name))
    assert dominant.ranks == str(worst.rank) and dominant.font_weight >= 700
    assert dominant.cell == len(picked(found, "tr[data-ranks] > td", row.ranks)) - len(
        components
    ) + components.index(largest)
    assert f"most of it is <b>{largest}</b>" in page
    assert f"stopped on {plan.solver.stop_reason.value}" in page
    for name, sharding in plan.tables.items():  # the tables section, as before
        assert f"<td>{name}</td><td>{sharding.sharding_type.value}</td>" in page


def test_cpu_plan_shows_its_tables_in_ddr_and_not_as_zero(service, tmp_path):
    document = {
        "topology": {"world_size": 2, "compute_device": "cpu", "ddr_bytes": "8GiB"},
        "tables": [
            {"name": "users", "num_embeddings": 100_000, "embedding_dim": 64},
            {"name": "tiny", "num_embeddings": 100, "embedding_dim": 8},
        ],
    }
    plan = stored_plan(service, document)
    image, found, page = look(service, plan, tmp_path)
    assert "DDR used" in page and "HBM used" not in page
    for stats in plan.rank_stats:
        assert stats.ddr_bytes > 0 and stats.hbm_bytes == 0
    for row in picked(found, "tr[data-ranks]"):
        first = int(row.ranks.split("-")[0])
        (fill,) = picked(found, ".fill", row.ranks)
        assert "ddr" in fill.classes and fill.width >= MIN_BAR_PX
        assert image.rgb(*fill.centre) == DDR_RGB
        used = plan.rank_stats[first].ddr_bytes
        number = picked(found, "tr[data-ranks] > td", row.ranks)[3]
        assert number.text.startswith(size(used)) and not number.text.startswith("0 ")


def test_replanned_plan_shows_what_moved(service, tmp_path):
    previous = stored_plan(service, json.loads(EXAMPLE.read_text()))
    document = json.loads(EXAMPLE.read_text())
    document["topology"]["hbm_bytes"] = "4GiB"
    document["tables"][0]["num_embeddings"] = 3_000_000  # users grows
    document["tables"].append({"name": "ads", "num_embeddings": 2_000_000, "embedding_dim": 128})
    document["options"] = {"previous_plan_id": previous.plan_id}
    plan = stored_plan(service, document)
    assert plan.migration is not None and plan.migration.moved_bytes > 0
    window = (1280, 1400)
    _, found, page = look(service, plan, tmp_path, window)
    # The stored request carries the previous plan; the diff with it is the oracle.
    stored = httpx.get(f"{service.base}/v1/plans/{plan.plan_id}/request", timeout=60).content
    request = parse_request(stored)
    assert request.options.previous_plan == previous
    changes = diff_plans(previous, plan, request).tables
    moved_rows = picked(found, "tr.moved")
    assert {row.text.split("\t")[0] for row in moved_rows} == {c.name for c in changes}
    assert all(row.inside(*window) for row in moved_rows)
    for row in moved_rows:
        name = row.text.split("\t")[0]
        change = next(c for c in changes if c.name == name)
        assert row.text.endswith(size(change.moved_bytes))
    moves = {m.rank: m for m in plan.migration.ranks}
    for row in picked(found, "tr[data-ranks]"):
        last_cell = picked(found, "tr[data-ranks] > td", row.ranks)[-1]
        first = int(row.ranks.split("-")[0])
        expected = "-"
        if first in moves:
            expected = (
                f"{size(moves[first].received_bytes)} in\n{size(moves[first].sent_bytes)} out"
            )
        assert last_cell.text == expected and last_cell.inside(*window)
    assert f"{size(plan.migration.moved_bytes)} of weights and optimizer state move" in page


def test_the_page_fetches_nothing(service, tmp_path):
    """Self-contained: no script, no stylesheet, image or font from anywhere."""
    plan = stored_plan(service, json.loads(EXAMPLE.read_text()))
    dom = dump_dom(f"{service.base}/v1/plans/{plan.plan_id}/view")
    for tag in ("<script", "<link", "<img", "@import", "url("):
        assert tag not in dom
