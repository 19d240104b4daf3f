"""``shardplan check``'s truth and gates, run as the console script (and POST /v1/check on a
real server on loopback): where every byte lives and the tables that left HBM, the
predicted step time, DDR headroom; ``--require-kernels``, ``--max-step-ms``,
``--baseline`` with ``--max-regression``; and bad gates refused as bad input.

Three requests: the README's example, which fits in HBM; the same with 64 MiB of HBM per
rank, which fits only with tables in host memory; and the example as the baseline of the
64 MiB one, a change that makes the model about 130 times slower."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import httpx
import pytest

from clients.http import PlannerClient
from tests.clients.cli.conftest import TOKEN, import_made_elsewhere

pytestmark = pytest.mark.timeout(120)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _request(tmp_path: Path, hbm: str | None, name: str) -> Path:
    document = json.loads((EXAMPLES / "request.json").read_text())
    if hbm is not None:
        document["topology"]["hbm_bytes"] = hbm
    document.setdefault("options", {})["time_limit_s"] = 2
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


@pytest.fixture(scope="module")
def paths(tmp_path_factory, shardplan_exe):
    """(fits in HBM, spills to host memory, the first one's plan file)."""
    directory = tmp_path_factory.mktemp("gates")
    fits = _request(directory, None, "fits.json")
    spills = _request(directory, "64MiB", "spills.json")
    plan = directory / "baseline.json"
    made = subprocess.run(
        [str(shardplan_exe), "plan", str(fits), "-o", str(plan)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    return fits, spills, plan


def _json(result: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(result.stdout)


# --------------------------------------------------------------------------- the truth


def test_a_plan_in_hbm_says_so_with_its_step_time_and_both_tiers(cli, paths):
    fits, _, _ = paths
    result = cli("check", fits, "--format", "json")
    assert result.returncode == 0, result.stderr
    report = _json(result)
    assert report["schema_version"] == "1.1"
    assert report["passed"] is True and report["verdict"] == "fits"
    assert report["step_ms"] == report["objective"] > 0
    assert report["cost_model"] == "shardplan"
    kernels = report["placement"]["kernels"]
    assert [k["compute_kernel"] for k in kernels] == ["fused"]
    assert kernels[0]["tables"] == 3 and not kernels[0]["outside_hbm"]
    assert report["placement"]["outside_hbm"] == []
    # The bytes per kernel add up to what the ranks use.
    assert kernels[0]["hbm_bytes"] == sum(r["hbm_used_bytes"] for r in report["ranks"])
    assert report["ddr_headroom"]["tier"] == "ddr"
    markdown = cli("check", fits, "--format", "markdown").stdout.splitlines()
    assert markdown[1].startswith("### ✅ ")
    assert "| compute kernel | tables | HBM | DDR |" in markdown
    # Nothing in DDR: its headroom is in the JSON, not in the text
    assert "| DDR headroom | rank | free | used | usable |" not in markdown


def test_tables_that_leave_hbm_are_called_out_and_counted_in_ddr(cli, paths):
    _, spills, _ = paths
    result = cli("check", spills, "--format", "json")
    assert result.returncode == 0, result.stderr  # no gate set: it fits, in host memory
    report = _json(result)
    placement = report["placement"]
    outside = {t["name"]: t for t in placement["outside_hbm"]}
    assert {"items", "users"} <= set(outside)
    assert all(t["compute_kernel"] in ("fused_uvm", "fused_uvm_caching") for t in outside.values())
    assert outside["users"]["ddr_bytes"] > 400 * 2**20  # 1M x 64 fp32 rows, in host memory
    ddr_used = sum(r["ddr_used_bytes"] for r in report["ranks"])
    assert sum(k["ddr_bytes"] for k in placement["kernels"]) == ddr_used
    assert report["ddr_headroom"]["least"]["used_bytes"] == max(
        r["ddr_used_bytes"] for r in report["ranks"]
    )
    text = cli("check", spills).stdout
    assert "DDR headroom, of each rank's DDR" in text
    assert "table(s) left HBM" in text and "users (fused_uvm" in text
    assert "<- outside HBM" in text
    assert "DDR headroom" in text
    markdown = cli("check", spills, "--format", "markdown").stdout.splitlines()
    assert markdown[1].startswith("### ⚠️ ")  # not a plain green check
    assert any(line.startswith("**⚠️ ") and "left HBM" in line for line in markdown)


# --------------------------------------------------------------------------- the gates


def test_require_kernels_fails_when_anything_leaves_hbm(cli, paths):
    fits, spills, _ = paths
    assert cli("check", fits, "--require-kernels", "fused").returncode == 0
    failed = cli("check", spills, "--require-kernels", "fused", "--format", "json")
    assert failed.returncode == 3
    report = _json(failed)
    assert (report["fits"], report["passed"], report["verdict"]) == (True, False, "gate_failed")
    (gate,) = report["gates"]
    off = len(report["placement"]["outside_hbm"])
    assert (gate["gate"], gate["passed"], gate["value"]) == ("require_kernels", False, off)
    markdown = cli("check", spills, "--require-kernels", "fused", "--format", "markdown")
    lines = markdown.stdout.splitlines()
    assert lines[1].startswith("### ❌ ") and "fails --require-kernels" in lines[1]
    row = next(line for line in lines if line.startswith("| `--require-kernels` |"))
    assert "❌ failed" in row and "users (fused_uvm" in row


def test_max_step_ms_holds_the_predicted_step_time(cli, paths):
    fits, _, _ = paths
    step = _json(cli("check", fits, "--format", "json"))["step_ms"]
    assert cli("check", fits, "--max-step-ms", str(step * 1.01)).returncode == 0
    failed = cli("check", fits, "--max-step-ms", str(step * 0.99))
    assert failed.returncode == 3
    assert f"FAIL --max-step-ms: predicted step time {step:.4g} ms" in failed.stdout


def test_a_regression_against_the_baseline_fails_with_its_numbers(cli, paths):
    fits, spills, baseline = paths
    plan = json.loads(baseline.read_text())
    same = cli("check", fits, "--baseline", baseline, "--max-regression", "5%", "--format", "json")
    assert same.returncode == 0, same.stdout
    unchanged = _json(same)["baseline"]
    assert unchanged["plan_id"] == plan["plan_id"] and unchanged["change"] == 0
    assert unchanged["moved_bytes"] == 0 and unchanged["kernel_moves"] == []
    assert unchanged["repriced"] and unchanged["still_valid"]

    result = cli(
        "check", spills, "--baseline", baseline, "--max-regression", "5%", "--format", "json"
    )
    assert result.returncode == 3
    report = _json(result)
    compared = report["baseline"]
    assert compared["step_ms"] == pytest.approx(plan["solver"]["objective"])
    assert compared["plan_step_ms"] == report["step_ms"]
    assert compared["change"] == pytest.approx(report["step_ms"] / compared["step_ms"] - 1)
    assert compared["change"] > 10  # the 64 MiB request is over ten times slower
    assert compared["still_valid"] is False  # the baseline no longer fits 64 MiB ranks
    assert (compared["outside_hbm"], compared["plan_outside_hbm"]) >= (0, 2)
    assert {m["name"] for m in compared["kernel_moves"]} >= {"items", "users"}
    # The bytes that move are those ``shardplan diff`` counts between the baseline and the
    # plan check made (the same request planned again: the same plan).
    new_plan = baseline.with_name("spills-plan.json")
    assert cli("plan", spills, "-o", new_plan).returncode == 0
    assert json.loads(new_plan.read_text())["plan_id"] == report["plan_id"]
    diffed = cli("diff", baseline, new_plan, "--request", spills, "--format", "json")
    assert compared["moved_bytes"] == _json(diffed)["moved_bytes"]
    (gate,) = report["gates"]
    assert (gate["gate"], gate["passed"], gate["limit"]) == ("max_regression", False, 0.05)
    markdown = cli(
        "check", spills, "--baseline", baseline, "--max-regression", "5%", "--format", "markdown"
    ).stdout
    assert "**Against the baseline:**" in markdown
    assert "x slower" in markdown and "| `--max-regression` | ❌ failed |" in markdown


def test_an_edited_baseline_file_is_bad_input(cli, paths, tmp_path):
    fits, _, baseline = paths
    plan = json.loads(baseline.read_text())
    plan["solver"]["objective"] *= 10
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(plan))
    result = cli("check", fits, "--baseline", edited)
    assert result.returncode == 2
    assert "plan_id" in result.stderr and "edited" in result.stderr


@pytest.mark.parametrize(
    ("args", "named", "says"),
    [
        (["--max-regression", "5%"], "--max-regression", "needs --baseline"),
        (["--require-kernels", "fast"], "--require-kernels", "fused_uvm_caching"),
        (["--max-step-ms", "-1"], "--max-step-ms", "positive number of milliseconds"),
        (["--max-step-ms", "nan"], "--max-step-ms", "positive number of milliseconds"),
        (["--baseline", "x", "--max-regression", "lots"], "--max-regression", "5% or 0.05"),
        (["--baseline", "0" * 64], "--baseline", "--server"),
        (["--world-sizes", "2,4", "--max-step-ms", "1"], "--max-step-ms", "what-if"),
    ],
)
def test_bad_gates_are_bad_input_naming_the_option(cli, paths, args, named, says):
    fits, _, _ = paths
    result = cli("check", fits, *args)
    assert result.returncode == 2, result.stdout
    assert named in result.stderr and says in result.stderr
    assert result.stdout == ""


# --------------------------------------------------------------------------- the service


@pytest.fixture(scope="module")
def production(service, paths):
    """The fitting request's plan stored on the service, and an alias naming it."""
    fits, _, _ = paths
    with PlannerClient(service.base, token=TOKEN) as client:
        plan = client.create_plan(json.loads(fits.read_text()))
        alias = f"prod-{random.getrandbits(32):08x}"
        client.set_alias(alias, plan.plan_id)
    return plan.plan_id, alias


def test_post_check_applies_the_gates_the_cli_applies(cli, service, paths, production):
    _, spills, _ = paths
    plan_id, alias = production
    gates = ["--require-kernels", "fused", "--max-step-ms", "1", "--max-regression", "5%"]
    local = cli("check", spills, *gates, "--baseline", f"alias:{alias}", "--server", service.base)
    assert local.returncode == 3, local.stderr
    unnamed = cli("check", spills, *gates, "--baseline", alias, "--server", service.base)
    assert unnamed.returncode == 2 and "--baseline" in unnamed.stderr
    answer = httpx.post(
        f"{service.base}/v1/check",
        params={
            "require_kernels": "fused",
            "max_step_ms": "1",
            "baseline": f"alias:{alias}",
            "max_regression": "0.05",
        },
        content=spills.read_bytes(),
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    remote = answer.json()
    remote.pop("stored"), remote.pop("min_hbm_free_bytes")
    via_cli = _json(
        cli(
            "check",
            spills,
            *gates,
            "--baseline",
            f"alias:{alias}",
            "--server",
            service.base,
            "--format",
            "json",
        )
    )
    assert remote == via_cli
    assert [g["passed"] for g in remote["gates"]] == [False, False, False]
    assert remote["baseline"]["plan_id"] == plan_id
    for named in (plan_id, plan_id[:10]):  # an id, or a unique prefix of one
        by_id = httpx.post(
            f"{service.base}/v1/check",
            params={"baseline": named, "max_regression": "0.05"},
            content=spills.read_bytes(),
            timeout=60,
        )
        assert by_id.json()["baseline"]["change"] == remote["baseline"]["change"]
    short = cli("check", spills, "--baseline", plan_id[:12], "--server", service.base)
    assert short.returncode == 0, short.stderr  # no gate set: the comparison only
    assert f"plan {plan_id[:12]} ({plan_id[:12]})" in short.stdout


def test_an_imported_baseline_is_said_unverified_as_post_check_says(
    cli, service, paths, production
):
    fits, spills, _ = paths
    plan_id = import_made_elsewhere(service, fits)
    on_server = ["--baseline", plan_id, "--server", service.base]
    answer = httpx.post(
        f"{service.base}/v1/check",
        params={"baseline": plan_id},
        content=spills.read_bytes(),
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    remote = answer.json()
    remote.pop("stored"), remote.pop("min_hbm_free_bytes")
    via_cli = _json(cli("check", spills, *on_server, "--format", "json"))
    assert via_cli["baseline"]["imported"] is True
    assert remote == via_cli
    said = ", imported: its solver report is unverified"
    for format in ("text", "markdown"):
        printed = cli("check", spills, *on_server, "--format", format)
        assert printed.returncode == 0, printed.stderr
        assert said in printed.stdout
    # The planner's own plan as the baseline: no mark.
    own = cli("check", spills, "--baseline", production[0], "--server", service.base)
    assert own.returncode == 0 and said not in own.stdout


@pytest.mark.parametrize(
    ("params", "status", "named"),
    [
        ({"max_regression": "0.05"}, 422, "max_regression"),
        ({"require_kernels": "fused,fast"}, 422, "require_kernels"),
        ({"max_step_ms": "0"}, 422, "max_step_ms"),
        ({"max_hbm_utilization": "1.5"}, 422, "max_hbm_utilization"),
        ({"baseline": "not-a-plan"}, 422, "baseline"),
        ({"baseline": "0" * 64}, 404, "baseline"),
        ({"baseline": "0" * 9}, 404, "no plan id starts with 000000000"),
        ({"baseline": "0" * 7}, 422, "baseline"),
        ({"baseline": "alias:no-such-alias-here"}, 404, "no-such-alias-here"),
    ],
)
def test_post_check_refuses_bad_gates_naming_them(service, paths, params, status, named):
    fits, _, _ = paths
    answer = httpx.post(
        f"{service.base}/v1/check", params=params, content=fits.read_bytes(), timeout=60
    )
    assert answer.status_code == status, answer.text
    assert named in answer.text
