"""``shardplan check``, run as the installed console script: the verdict and its exit code,
the headroom and limits against the plan ``shardplan plan`` makes, the smallest fix when
it does not fit, the least world size and the what-if sweep."""

from __future__ import annotations

import json
import math
import os
import pty
import subprocess
from pathlib import Path

import pytest

from clients.cli.numbers import parse_byte_size
from planner_service.plan.capacity import usable_capacity
from planner_service.plan.codec import parse_request
from planner_service.plan.errors import InputError
from planner_service.plan.units import GiB, size

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
# docs/ci.md's example: 50M rows that must stay in HBM do not fit two 8 GiB ranks.
TOO_BIG = {
    "topology": {"world_size": 2, "hbm_bytes": 8 * GiB},
    "tables": [
        {"name": "users", "num_embeddings": 50_000_000, "embedding_dim": 128},
        {"name": "items", "num_embeddings": 2_000_000, "embedding_dim": 64},
    ],
    "constraints": {"tables": {"users": {"compute_kernels": ["fused"]}}},
}


def _write(path: Path, document: dict) -> Path:
    path.write_text(json.dumps(document))
    return path


def _with_topology(path: Path, **fields: object) -> dict:
    document = json.loads(path.read_text())
    document["topology"].update(fields)
    return document


@pytest.fixture
def too_big(tmp_path) -> Path:
    return _write(tmp_path / "too-big.json", TOO_BIG)


@pytest.fixture
def four_ranks(tmp_path, too_big) -> Path:
    """Fits, with every rank near 90% of its usable HBM."""
    return _write(tmp_path / "four-ranks.json", _with_topology(too_big, world_size=4))


def _json(result: subprocess.CompletedProcess[str]) -> dict:
    assert "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


# --------------------------------------------------------------------------- one check


def test_fits_exits_0_with_the_headroom_of_the_plan_that_plan_makes(run_cli):
    request = EXAMPLES / "request.json"
    result = run_cli("check", request, "--format", "json")
    assert result.returncode == 0, result.stderr
    report = _json(result)
    plan = json.loads(run_cli("plan", request).stdout)
    capacities = usable_capacity(*_topology_and_constraints(request))
    free = [
        c.hbm_bytes - used
        for c, used in zip(capacities, plan["rank_stats"]["hbm_bytes"], strict=True)
    ]
    assert (report["fits"], report["verdict"], report["plan_id"]) == (True, "fits", plan["plan_id"])
    assert [r["hbm_free_bytes"] for r in report["ranks"]] == free
    least = report["headroom"]["least"]
    assert (least["free_bytes"], least["rank"]) == (min(free), free.index(min(free)))
    assert least["usable_bytes"] == capacities[0].hbm_bytes == 16 * GiB - int(16 * GiB * 0.15)
    assert report["headroom"]["most"]["free_bytes"] == max(free)
    assert [u["rank"] for u in report["headroom"]["tightest"]] == sorted(
        range(4), key=lambda r: (free[r], r)
    )[:3]
    slowest = max(range(4), key=lambda r: plan["rank_stats"]["perf"]["total"][r])
    assert report["binding"]["kind"] == "perf" and report["binding"]["rank"] == slowest


def _topology_and_constraints(path: Path):
    request = parse_request(path.read_bytes())
    return request.topology, request.constraints


def test_fits_in_text_and_markdown(run_cli):
    request = EXAMPLES / "request.json"
    text = run_cli("check", request)
    assert text.returncode == 0
    assert text.stdout.startswith(f"{request} fits: 3 table(s) on 4 rank(s)\nPlan ")
    assert (
        "HBM headroom, of each rank's usable HBM, after the reservation (hbm_headroom_fraction "
        "0.15" in text.stdout
    )
    markdown = run_cli("check", request, "--format", "markdown")
    assert markdown.returncode == 0
    lines = markdown.stdout.splitlines()
    assert lines[:2] == [
        "<!-- shardplan-check -->",
        f"### ✅ `{request}` fits: 3 table(s) on 4 rank(s)",
    ]
    assert "| HBM headroom | rank | free | used | usable |" in lines
    assert sum(line.startswith(("| least |", "| median |", "| most |")) for line in lines) == 3
    assert any(
        line.startswith("**Binding constraint:** perf: rank 2 is the slowest") for line in lines
    )


def test_does_not_fit_exits_3_with_the_reason_and_a_smallest_fix_that_works(run_cli, too_big):
    result = run_cli("check", too_big, "--format", "markdown")
    assert result.returncode == 3, result.stderr
    body = result.stdout
    assert body.startswith(
        "<!-- shardplan-check -->\n"
        f"### ❌ `{too_big}` does not fit: no plan exists for 2 table(s) on 2 rank(s)\n"
    )
    assert "**Why** (binding constraint: memory):" in body
    assert (
        "- table 'users' fits no rank under any allowed option: its smallest option "
        "(row_wise/fused) needs 11.92 GiB HBM" in body
    )
    assert "- `world_size` 4 (same devices) fits\n" in body
    assert "- allow `fused_uvm_caching` for `users`: then the whole model fits\n" in body
    # The fixes are real: at world_size 4 the same check passes.
    fixed = _write(too_big.with_name("fixed.json"), _with_topology(too_big, world_size=4))
    assert run_cli("check", fixed).returncode == 0
    report = _json(run_cli("check", too_big, "--format", "json"))
    assert (report["fits"], report["verdict"], report["plan_id"]) == (False, "no_plan", None)
    assert report["infeasibility"]["fixes"]["min_world_size"] == 4


@pytest.mark.parametrize(
    ("args", "content", "expected"),
    [
        (
            (),
            '{"topology": {"world_size": 2}, "tables": [{"name": "a", "num_embeddings": 3, "embedding_dim": 0}]}',
            "request.json: tables[0].embedding_dim = 0: Input should be greater than or equal to 1",
        ),
        (
            (),
            '{"topology": {"world_size": 2, "hbm": 1}, "tables": [{"name": "a", "num_embeddings": 3, "embedding_dim": 4}]}',
            "request.json: topology.hbm = 1: unknown field; accepted fields here: world_size, ",
        ),
        ((), "{not json", "request.json: (document): not valid JSON"),
        (
            ("--max-hbm-utilization", "1.5"),
            None,
            "shardplan: --max-hbm-utilization = '1.5': a fraction in (0, 1] is accepted, e.g. 0.9",
        ),
        (("--max-hbm-utilization", "0"), None, "--max-hbm-utilization = '0': a fraction in (0, 1]"),
        (
            ("--hbm", "40GB/s"),
            None,
            "shardplan: --hbm = '40GB/s': is not a byte size; write an integer number of bytes",
        ),
        (("--hbm", "1.3KiB"), None, "--hbm = '1.3KiB': is 1,331.200 bytes, not a whole number"),
        (("--world-sizes", "4,0"), None, "--world-sizes = '0': not a positive whole number"),
        (("--world-sizes", "4,4"), None, "--world-sizes = '4,4': lists 4 twice"),
        (
            ("--world-sizes", "6"),
            None,
            "--world-sizes = 6: 6 ranks are not whole hosts of the request's local_world_size 4; "
            "accepted: 1 to 4 (one host) or a multiple of 4",
        ),
        (
            (
                "--world-sizes",
                ",".join(map(str, range(4, 40, 4))),
                "--hbm",
                "1GiB,2GiB,4GiB,8GiB,16GiB,32GiB,64GiB,80GiB",
            ),
            None,
            "--world-sizes x --hbm = 72: at most 64 cells",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_the_field(
    run_cli, tmp_path, args, content, expected
):
    request = tmp_path / "request.json"
    request.write_text(content if content is not None else (EXAMPLES / "request.json").read_text())
    result = run_cli("check", request, *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_a_pinned_rank_bounds_the_sweep_with_a_clear_error(run_cli, tmp_path):
    document = json.loads((EXAMPLES / "request.json").read_text())
    document["constraints"]["tables"]["users"] = {"ranks": [3]}
    request = _write(tmp_path / "pinned.json", document)
    result = run_cli("check", request, "--world-sizes", "2")
    assert result.returncode == 2
    assert result.stderr.startswith(
        "shardplan: --world-sizes = 2: the request on 2 ranks is not valid: "
    )
    assert (
        "constraints.tables.users.ranks has rank 3, out of range for world_size 2" in result.stderr
    )


def test_missing_request_file_exits_2(run_cli, tmp_path):
    result = run_cli("check", tmp_path / "nope.json")
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == f"{tmp_path / 'nope.json'}: (document): cannot read file: No such file or directory"
    )


# --------------------------------------------------------------------------- the HBM limit


def test_max_hbm_utilization_tips_a_fitting_plan_into_failure(run_cli, four_ranks):
    plain = _json(run_cli("check", four_ranks, "--format", "json"))
    assert plain["fits"] and plain["max_hbm_utilization"] is None
    fullest = max(plain["ranks"], key=lambda r: r["hbm_used_bytes"] / r["hbm_usable_bytes"])
    used = fullest["hbm_used_bytes"] / fullest["hbm_usable_bytes"]
    assert 0.85 < used < 0.9  # the margin the limits below straddle
    above, below = math.ceil(used * 100) / 100, math.floor(used * 100) / 100
    passed = run_cli("check", four_ranks, "--max-hbm-utilization", str(above), "--format", "json")
    assert passed.returncode == 0 and _json(passed)["plan_id"] == plain["plan_id"]

    failed = run_cli("check", four_ranks, "--max-hbm-utilization", str(below), "--format", "json")
    assert failed.returncode == 3
    report = _json(failed)
    assert (report["fits"], report["verdict"], report["plan_id"]) == (
        False,
        "over_limit",
        plain["plan_id"],
    )
    over = report["over_limit"]
    assert over[0]["rank"] == fullest["rank"] and over[0]["utilization"] == pytest.approx(used)
    assert {u["rank"] for u in over} == {
        r["rank"] for r in plain["ranks"] if r["hbm_used_bytes"] / r["hbm_usable_bytes"] > below
    }
    assert report["binding"] == {
        "kind": "max_hbm_utilization",
        "rank": fullest["rank"],
        "message": report["binding"]["message"],
    }
    # The smallest fix: plan for the margin, with the reservation that keeps it; and it
    # works: that request's plan keeps every rank within the limit of today's usable HBM.
    fix = report["margin_fix"]
    fraction = fix["hbm_headroom_fraction"]
    assert 8 * GiB * (1 - fraction) <= below * fullest["hbm_usable_bytes"]
    assert 8 * GiB * (1 - fraction + 0.001) > below * fullest["hbm_usable_bytes"]
    assert fix["fits"] is True
    document = json.loads(four_ranks.read_text())
    document["constraints"]["hbm_headroom_fraction"] = fraction
    fixed = _write(four_ranks.with_name("fixed.json"), document)
    replanned = _json(run_cli("check", fixed, "--format", "json"))
    assert replanned["fits"] and replanned["objective"] == fix["objective"]
    today = fullest["hbm_usable_bytes"]
    assert all(r["hbm_used_bytes"] <= below * today for r in replanned["ranks"])


def test_over_the_limit_in_text_says_which_rank_how_much_and_the_base(run_cli, four_ranks):
    result = run_cli("check", four_ranks, "--max-hbm-utilization", "0.85")
    assert result.returncode == 3
    first = result.stdout.splitlines()[0]
    assert first == (
        f"{four_ranks} is over the limit: rank 0 would use 89.4% of its usable HBM "
        "(6.08 GiB of 6.80 GiB), more than --max-hbm-utilization 0.85 allows"
    )
    assert (
        "fix: with constraints.hbm_headroom_fraction 0.278 (now 0.15), which keeps every rank "
        "within 85% of today's usable memory, no plan exists; world_size 8 (same devices) fits"
    ) in result.stdout


def test_a_margin_the_planner_can_keep_is_planned(run_cli):
    result = run_cli(
        "check", EXAMPLES / "request.json", "--max-hbm-utilization", "0.03", "--format", "json"
    )
    assert result.returncode == 3
    fix = _json(result)["margin_fix"]
    assert fix["fits"] is True and fix["objective"] > 0
    assert fix["hbm_headroom_fraction"] == pytest.approx(1 - 0.03 * 0.85, abs=0.001)


# --------------------------------------------------------------------------- what-if


def test_sweep_matrix_cells_are_the_checks_of_the_changed_requests(run_cli, too_big, tmp_path):
    result = run_cli(
        "check", too_big, "--world-sizes", "2,4,8", "--hbm", "8GiB,16GiB", "--format", "json"
    )
    assert result.returncode == 0, result.stderr
    sweep = _json(result)
    assert (sweep["world_sizes"], sweep["hbm_bytes"]) == ([2, 4, 8], [8 * GiB, 16 * GiB])
    cells = {(c["world_size"], c["hbm_bytes"] // GiB): c["check"] for c in sweep["cells"]}
    assert list(cells) == [(2, 8), (2, 16), (4, 8), (4, 16), (8, 8), (8, 16)]
    assert cells[2, 8]["verdict"] == "no_plan"
    assert cells[2, 8]["infeasibility"]["fixes"]["min_world_size"] == 4
    assert all(cells[key]["fits"] for key in cells if key != (2, 8))
    assert all(cell["ranks"] == [] for cell in cells.values())
    # A cell is exactly the check of the request edited that way.
    # (In hosts of the request's local_world_size: it has 2 ranks, and so 2 a host.)
    at = {"world_size": 4, "local_world_size": 2, "hbm_bytes": 16 * GiB}
    edited = _write(tmp_path / "edited.json", _with_topology(too_big, **at))
    alone = _json(run_cli("check", edited, "--format", "json"))
    assert cells[4, 16] == {**alone, "ranks": []}
    # Not a terminal: one line per cell on stderr.
    lines = result.stderr.splitlines()
    assert len(lines) == 6
    assert lines[0].startswith(
        "cell 1/6: world_size 2, HBM 8.00 GiB: no plan (world_size 4 fits) ("
    )
    assert lines[5].startswith("cell 6/6: world_size 8, HBM 16.00 GiB: ")


def test_sweep_text_matrix(run_cli, too_big):
    result = run_cli("check", too_big, "--world-sizes", "2,4", "--hbm", "8GiB,16GiB")
    assert result.returncode == 0
    header, rule, row2, row4, legend = result.stdout.splitlines()
    assert [cell.strip() for cell in header.split(" | ")] == [
        "world size",
        "HBM 8.00 GiB",
        "HBM 16.00 GiB",
    ]
    assert [cell.strip() for cell in row2.split(" | ")][:2] == ["2", "no plan (world_size 4 fits)"]
    assert row4.startswith("4          | ") and " ms, " in row4 and "GiB free" in row4
    assert legend.startswith(
        "(world sizes in hosts of 2 ranks, as the request's; each cell: max-rank perf"
    )


def test_sweep_where_nothing_fits_exits_3(run_cli, too_big):
    result = run_cli("check", too_big, "--world-sizes", "1,2", "--format", "markdown")
    assert result.returncode == 3
    assert result.stdout.splitlines()[:4] == [
        "| world size | HBM 8.00 GiB |",
        "| --- | --- |",
        "| 1 | no plan (world_size 4 fits) |",
        "| 2 | no plan (world_size 4 fits) |",
    ]


def test_the_hbm_limit_applies_to_every_cell(run_cli, too_big):
    result = run_cli(
        "check", too_big, "--world-sizes", "4,8", "--max-hbm-utilization", "0.5", "--format", "json"
    )
    cells = {c["world_size"]: c["check"] for c in _json(result)["cells"]}
    for check in cells.values():
        fullest = max(u["utilization"] for u in check["headroom"]["tightest"])
        assert check["verdict"] == ("over_limit" if fullest > 0.5 else "fits")
        assert check["margin_fix"] is None  # a sweep does not plan again for the margin
    assert cells[4]["verdict"] == "over_limit"  # 89% of usable HBM, as above
    assert result.returncode == (0 if cells[8]["fits"] else 3)


def test_sweep_progress_bar_on_a_terminal(shardplan_exe, too_big):
    """On a terminal, stderr gets one bar redrawn in place, then cleared."""
    controller, terminal = pty.openpty()
    try:
        result = subprocess.run(
            [shardplan_exe, "check", too_big, "--world-sizes", "2,4", "--hbm", "8GiB,16GiB"],
            stdout=subprocess.PIPE,
            stderr=terminal,
            text=True,
            timeout=60,
            check=False,
        )
        os.close(terminal)
        terminal = -1
        shown = _read_all(controller)
    finally:
        os.close(controller)
        if terminal >= 0:
            os.close(terminal)
    assert result.returncode == 0
    frames = shown.split("\r\x1b[K")
    assert "[" + "#" * 24 + "] 4/4 world_size 4, HBM 16.00 GiB" in frames
    assert "[" + "." * 24 + "] 0/4 world_size 2, HBM 8.00 GiB" in frames
    assert frames[-1] == ""  # cleared at the end
    assert "cell 1/4" not in shown


def _read_all(fd: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the other end is closed and everything was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


def test_min_world_size_above_a_request_that_does_not_fit(run_cli, too_big):
    result = run_cli("check", too_big, "--min-world-size", "--format", "json")
    assert result.returncode == 0, result.stderr
    (row,) = _json(result)["rows"]
    assert (row["hbm_bytes"], row["min_world_size"]) == (8 * GiB, 4)
    assert row["check"]["fits"] and row["check"]["world_size"] == 4


def test_min_world_size_exits_3_when_no_world_size_would_do(run_cli, too_big, tmp_path):
    """A table-wise 24 GiB table fits no 8 GiB rank, however many there are."""
    document = json.loads(too_big.read_text())
    document["constraints"]["tables"]["users"]["sharding_types"] = ["table_wise"]
    never = _write(tmp_path / "never.json", document)
    result = run_cli("check", never, "--min-world-size", "--format", "json")
    assert result.returncode == 3
    (row,) = _json(result)["rows"]
    # Searched up to 64 times the request's world size, the planner's fix search's limit.
    assert (row["min_world_size"], row["searched_up_to"], row["check"]) == (None, 128, None)


def test_min_world_size_below_a_request_that_fits_is_the_least_that_fits(
    run_cli, too_big, tmp_path
):
    """Eight ranks of 16 GiB on one host: fewer would do. The size found fits; one fewer
    does not."""
    roomy = _write(
        tmp_path / "roomy.json",
        _with_topology(too_big, world_size=8, local_world_size=8, hbm_bytes=16 * GiB),
    )
    result = run_cli("check", roomy, "--min-world-size", "--hbm", "16GiB,32GiB", "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = _json(result)["rows"]
    assert [row["hbm_bytes"] for row in rows] == [16 * GiB, 32 * GiB]
    for row in rows:
        least = row["min_world_size"]
        assert 1 <= least < 8 and row["check"]["fits"]
        at = {"world_size": least, "local_world_size": least, "hbm_bytes": row["hbm_bytes"]}
        assert (
            run_cli("check", _write(tmp_path / "at.json", _with_topology(roomy, **at))).returncode
            == 0
        )
        if least > 1:
            fewer = {**at, "world_size": least - 1, "local_world_size": least - 1}
            fewer_path = _write(tmp_path / "fewer.json", _with_topology(roomy, **fewer))
            assert run_cli("check", fewer_path).returncode == 3
    assert rows[0]["min_world_size"] > rows[1]["min_world_size"]  # more HBM, fewer ranks
    text = run_cli("check", roomy, "--min-world-size", "--hbm", "16GiB")
    header, _, line, legend = text.stdout.splitlines()
    assert header.startswith("HBM per rank | least world size | there: max-rank perf")
    assert line.startswith(f"16.00 GiB    | {rows[0]['min_world_size']}  ")


def test_check_reads_the_request_from_stdin(shardplan_exe):
    result = subprocess.run(
        [shardplan_exe, "check", "-"],
        input=(EXAMPLES / "request.json").read_text(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("<stdin> fits: 3 table(s) on 4 rank(s)\n")


def test_on_cpu_headroom_is_ddr_and_hbm_sizes_are_refused(run_cli, tmp_path):
    """On cpu, tables live in DDR: the headroom and the limit are DDR's."""
    request = _write(
        tmp_path / "cpu.json",
        {
            "topology": {"world_size": 2, "compute_device": "cpu", "ddr_bytes": 8 * GiB},
            "tables": [{"name": "users", "num_embeddings": 10_000_000, "embedding_dim": 128}],
        },
    )
    report = _json(run_cli("check", request, "--format", "json"))
    least = report["headroom"]["least"]
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert report["headroom"]["tier"] == "ddr"
    assert least["used_bytes"] == ranks[least["rank"]]["ddr_used_bytes"] > 0
    assert least["usable_bytes"] == 8 * GiB - int(8 * GiB * 0.15)
    limit = math.floor(least["utilization"] * 100) / 100
    over = run_cli("check", request, "--max-hbm-utilization", str(limit))
    assert over.returncode == 3
    assert f"of its usable DDR ({size(least['used_bytes'])} of 6.80 GiB)" in over.stdout
    refused = run_cli("check", request, "--hbm", "8GiB")
    assert refused.returncode == 2
    assert "--hbm applies to cuda topologies only" in refused.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GiB", 80 * GiB),
        ("80 GiB", 80 * GiB),
        ("512MB", 512 * 10**6),
        ("1.5TiB", 3 * 2**39),
        ("17179869184", 16 * GiB),
        ("0.5KiB", 512),
    ],
)
def test_byte_sizes(text, expected):
    assert parse_byte_size(text, "--hbm") == expected


def test_byte_sizes_read_as_the_request_format_reads_them():
    with pytest.raises(InputError) as refused:
        parse_byte_size("80gib", "--hbm")
    (problem,) = refused.value.problems
    assert problem.path == "--hbm" and problem.value == "80gib"
    assert "case-sensitive: 'GiB'" in problem.message
