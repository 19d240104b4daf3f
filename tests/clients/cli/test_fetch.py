"""The commands that talk to the service, run as the installed console script against a
real ``shardplan serve`` on loopback (and a real faulty proxy in front of it,
tests/support/servers.py): ``fetch`` by id and alias, from the cache while the service is down,
a stale alias only when allowed, a corrupted plan, an unreachable service; ``plan
--server`` and ``check --server`` print what the local commands print."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from clients.http import PlannerClient
from planner_service.plan.units import GiB
from tests.clients.cli.conftest import TOKEN, import_made_elsewhere
from tests.service.test_plan_ids import put_rows
from tests.support.servers import FaultyProxy, free_port

pytestmark = pytest.mark.timeout(120)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TOO_BIG = {  # tests/clients/cli/test_check.py's: does not fit two 8 GiB ranks
    "topology": {"world_size": 2, "hbm_bytes": 8 * GiB},
    "tables": [
        {"name": "users", "num_embeddings": 50_000_000, "embedding_dim": 128},
        {"name": "items", "num_embeddings": 2_000_000, "embedding_dim": 64},
    ],
    "constraints": {"tables": {"users": {"compute_kernels": ["fused"]}}},
}


@pytest.fixture(scope="module")
def stored(service):
    """A plan stored on the service, an alias naming it, and its bytes as served."""
    with PlannerClient(service.base, token=TOKEN) as client:
        plan = client.create_plan(json.loads((EXAMPLES / "request.json").read_text()))
        alias = f"job-{random.getrandbits(32):08x}"
        client.set_alias(alias, plan.plan_id)
    served = httpx.get(f"{service.base}/v1/plans/{plan.plan_id}", timeout=30).content
    return plan.plan_id, alias, served


def _one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


# --------------------------------------------------------------------------- fetch


def test_fetch_by_id_writes_the_plan_as_stored(cli, service, stored, tmp_path):
    plan_id, _, served = stored
    printed = cli("fetch", plan_id, "--server", service.base)
    assert (printed.returncode, printed.stdout, printed.stderr) == (0, served.decode() + "\n", "")
    output = tmp_path / "plan.json"
    written = cli("fetch", plan_id, "-o", output, "--server", service.base, token=None)
    assert (written.returncode, written.stdout) == (0, "")  # reads need no token here
    assert output.read_bytes() == served
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temporary left


def test_fetch_by_alias_says_which_plan(cli, service, stored, tmp_path):
    plan_id, alias, served = stored
    result = cli("fetch", f"alias:{alias}", "-o", tmp_path / "p.json", "--server", service.base)
    assert result.returncode == 0
    assert _one_line(result.stderr) == f"alias:{alias} -> plan {plan_id}, version 1"
    assert (tmp_path / "p.json").read_bytes() == served


def test_unknown_plan_alias_and_bad_ids_exit_2(cli, service):
    missing = cli("fetch", "e" * 64, "--server", service.base)
    assert missing.returncode == 2
    assert _one_line(missing.stderr) == f"shardplan fetch: no plan {'e' * 64} on {service.base}"
    no_alias = cli("fetch", "alias:nobody-here", "--server", service.base)
    assert no_alias.returncode == 2
    assert "no alias 'nobody-here' on " + service.base in no_alias.stderr
    bad_id = cli("fetch", "ABC", "--server", service.base)
    assert bad_id.returncode == 2
    assert _one_line(bad_id.stderr) == (
        "shardplan fetch: PLAN_ID = 'ABC': must be a plan id (64 lowercase hex digits) or a "
        "unique prefix of one (8 to 64 digits), or alias:NAME"
    )
    bad_alias = cli("fetch", "alias:../etc", "--server", service.base)
    assert (bad_alias.returncode, bad_alias.stdout) == (2, "")
    assert "alias = '../etc'" in bad_alias.stderr
    no_server = cli("fetch", "e" * 64)
    assert no_server.returncode == 2 and "--server: is required" in no_server.stderr


def test_fetch_by_a_prefix_of_the_id_says_which_plan(cli, service, stored, tmp_path):
    plan_id, _, served = stored
    output = tmp_path / "plan.json"
    result = cli("fetch", plan_id[:12], "-o", output, "--server", service.base, token=None)
    assert result.returncode == 0
    assert _one_line(result.stderr) == f"{plan_id[:12]} -> plan {plan_id}"
    assert output.read_bytes() == served


def test_a_prefix_naming_no_plan_or_several_exits_2_with_one_line(cli, service):
    shared = [f"feed5eed{index}" + "0" * 55 for index in range(2)]
    put_rows(service, shared)
    several = cli("fetch", "feed5eed", "--server", service.base)
    assert (several.returncode, several.stdout) == (2, "")
    assert _one_line(several.stderr) == (
        f"shardplan fetch: 2 plans on {service.base} start with feed5eed ({', '.join(shared)}); "
        "give more digits of the one you mean"
    )
    none = cli("fetch", "feed5eef", "--server", service.base)
    assert (none.returncode, none.stdout) == (2, "")
    assert _one_line(none.stderr) == (
        f"shardplan fetch: no plan id starts with feed5eef on {service.base}"
    )


def test_fetch_of_an_imported_plan_says_its_solver_report_is_unverified(cli, service, tmp_path):
    plan_id = import_made_elsewhere(service, EXAMPLES / "request.json")
    served = httpx.get(f"{service.base}/v1/plans/{plan_id}", timeout=30).content
    note = (
        f"shardplan fetch: plan {plan_id[:12]} was imported into the service (PUT /v1/plans): "
        "its solver report (status, lower bound, gap) is the importer's word, unverified"
    )
    cache = tmp_path / "cache"
    with FaultyProxy(service.base) as proxy:  # the service, at an address we can close
        fetched = cli("fetch", plan_id, "--server", proxy.base, "--cache-dir", cache)
        assert (fetched.returncode, fetched.stdout) == (0, served.decode() + "\n")
        assert _one_line(fetched.stderr) == note  # stdout stays the plan's bytes
        by_prefix = cli("fetch", plan_id[:12], "--server", proxy.base)
        assert by_prefix.stderr.splitlines() == [f"{plan_id[:12]} -> plan {plan_id}", note]
    # From the cache, with the service gone: still said.
    cached = cli("fetch", plan_id, "--server", proxy.base, "--cache-dir", cache, "--retries", "0")
    assert (cached.returncode, cached.stdout) == (0, served.decode() + "\n")
    assert _one_line(cached.stderr) == note


@pytest.mark.slow  # stops and restarts a server
def test_a_restart_while_the_service_is_down_uses_the_cache(cli, service, stored, tmp_path):
    plan_id, alias, served = stored
    cache = tmp_path / "cache"
    with FaultyProxy(service.base) as proxy:  # the service, at an address we can close
        for target in (plan_id, f"alias:{alias}"):
            assert (
                cli("fetch", target, "--server", proxy.base, "--cache-dir", cache).returncode == 0
            )
    # The proxy is closed: nothing listens at its address any more.
    again = cli("fetch", plan_id, "--server", proxy.base, "--cache-dir", cache, "--retries", "0")
    assert (again.returncode, again.stdout, again.stderr) == (0, served.decode() + "\n", "")

    refused = cli("fetch", f"alias:{alias}", "--server", proxy.base, "--cache-dir", cache)
    assert (refused.returncode, refused.stdout) == (4, "")  # an alias may have moved
    assert "no answer after 5 attempt(s)" in _one_line(refused.stderr)

    stale = cli(
        "fetch", f"alias:{alias}", "--server", proxy.base, "--cache-dir", cache,
        "--allow-stale-alias", "--retries", "0",
    )  # fmt: skip
    assert (stale.returncode, stale.stdout) == (0, served.decode() + "\n")
    assert f"alias:{alias} -> plan {plan_id} (STALE: {proxy.base} could not be reached" in (
        stale.stderr
    )


def test_a_corrupted_plan_exits_5_and_writes_nothing(cli, service, stored, tmp_path):
    plan_id, _, _ = stored
    output = tmp_path / "plan.json"

    def corrupt(body: bytes) -> bytes:
        return body.replace(b'"world_size":', b'"world_size":1', 1)

    with FaultyProxy(service.base, corrupt=corrupt) as proxy:
        result = cli(
            "fetch", plan_id, "-o", output, "--server", proxy.base, "--cache-dir", tmp_path
        )
    assert (result.returncode, result.stdout) == (5, "")
    assert "integrity check failed, the plan is not used" in _one_line(result.stderr)
    assert "hashes to" in result.stderr
    assert not output.exists() and list((tmp_path / "plans").iterdir()) == []


def test_an_unreachable_service_exits_4_with_one_line(cli):
    down = f"http://127.0.0.1:{free_port()}"
    result = cli("fetch", "a" * 64, "--server", down, "--retries", "1")
    assert (result.returncode, result.stdout) == (4, "")
    line = _one_line(result.stderr)
    assert line.startswith(f"shardplan fetch: GET {down}/v1/plans/{'a' * 64}: no answer after 2")
    assert "Connection refused" in line


# --------------------------------------------------------------------------- plan --server


def test_plan_on_the_server_prints_what_plan_prints_here(cli, service, tmp_path):
    request = EXAMPLES / "request.json"
    for format in ("json", "table"):
        remote = cli("plan", request, "--format", format, "--server", service.base)
        local = cli("plan", request, "--format", format)
        assert remote.returncode == local.returncode == 0
        assert _but_wall_time(remote.stdout) == _but_wall_time(local.stdout)
        assert f"on {service.base} (round trip)" in remote.stderr
    too_big = tmp_path / "too-big.json"
    too_big.write_text(json.dumps(TOO_BIG))
    remote = cli("plan", too_big, "--server", service.base)
    local = cli("plan", too_big)
    assert (remote.returncode, remote.stdout, remote.stderr) == (3, local.stdout, local.stderr)
    assert json.loads(remote.stdout)["status"] == "infeasible"


def _but_wall_time(text: str) -> list[str]:
    """The lines but the wall time's (the solve's here, the round trip's with --server)."""
    return [line for line in text.splitlines() if not line.startswith("wall time")]


def test_plan_on_the_server_needs_the_token(cli, service):
    request = EXAMPLES / "request.json"
    anonymous = cli("plan", request, "--server", service.base, token=None)
    assert anonymous.returncode == 2
    assert _one_line(anonymous.stderr) == (
        f"shardplan plan: {service.base} needs a token for this: pass --token or set "
        "$SHARDPLAN_TOKEN"
    )
    wrong = cli("plan", request, "--server", service.base, "--token", "not-the-token-at-all")
    assert wrong.returncode == 2 and "does not accept this token" in wrong.stderr
    on_the_line = cli("plan", request, "--server", service.base, "--token", TOKEN, token=None)
    assert on_the_line.returncode == 0


# --------------------------------------------------------------------------- check --server


@pytest.mark.parametrize("fits", [True, False])
def test_check_on_the_server_reports_what_the_local_check_reports(cli, service, tmp_path, fits):
    request = EXAMPLES / "request.json"
    if not fits:
        request = tmp_path / "too-big.json"
        request.write_text(json.dumps(TOO_BIG))
    remote = cli("check", request, "--format", "markdown", "--server", service.base)
    local = cli("check", request, "--format", "markdown")
    assert remote.returncode == local.returncode == (0 if fits else 3)
    assert remote.stdout == local.stdout
    assert ("fits" if fits else "does not fit") in remote.stdout.splitlines()[1]


@pytest.mark.parametrize("fits", [True, False])
def test_post_check_answers_the_report_the_cli_prints(cli, service, tmp_path, fits):
    """One analysis: POST /v1/check is ``shardplan check --format json``'s report, plus
    what only the service knows (whether the plan is stored, the tightest rank's HBM)."""
    request = EXAMPLES / "request.json"
    if not fits:
        request = tmp_path / "too-big.json"
        request.write_text(json.dumps(TOO_BIG))
    local = json.loads(cli("check", request, "--format", "json").stdout)
    answer = httpx.post(f"{service.base}/v1/check", content=request.read_bytes(), timeout=60)
    remote = answer.json()
    assert remote.pop("stored") in (True, False)  # other tests here may have stored the plan
    free = remote.pop("min_hbm_free_bytes")
    assert free == (min(r["hbm_free_bytes"] for r in local["ranks"]) if fits else None)
    assert remote == local
    assert local["verdict"] == ("fits" if fits else "no_plan")


def test_a_sweep_on_the_server_is_the_local_sweep(cli, service, tmp_path):
    request = tmp_path / "too-big.json"
    request.write_text(json.dumps(TOO_BIG))
    sweep = ("--world-sizes", "2,4", "--hbm", "8GiB,16GiB", "--format", "json")
    remote = cli("check", request, *sweep, "--server", service.base)
    local = cli("check", request, *sweep)
    assert remote.returncode == local.returncode == 0
    assert json.loads(remote.stdout) == json.loads(local.stdout)


def _without_ortools(shardplan_args: list[str]) -> subprocess.CompletedProcess[str]:
    """``shardplan`` in a process where OR-Tools cannot be imported, as on a core install."""
    script = textwrap.dedent(
        f"""
        import sys
        class NoOrtools:
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] == "ortools":
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        sys.meta_path.insert(0, NoOrtools())
        from clients.cli import main
        sys.exit(main({shardplan_args!r}))
        """
    )
    env = {**os.environ, "SHARDPLAN_TOKEN": TOKEN}
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=90, env=env
    )


def test_check_on_the_server_needs_no_ortools_but_the_least_world_size_search_does(
    service, tmp_path
):
    request = str(EXAMPLES / "request.json")
    checked = _without_ortools(["check", request, "--server", service.base])
    assert checked.returncode == 0, checked.stderr
    assert "fits" in checked.stdout
    here = _without_ortools(["check", request])
    assert here.returncode == 2 and "lacks the 'planner' extra" in here.stderr
    too_big = tmp_path / "too-big.json"
    too_big.write_text(json.dumps(TOO_BIG))
    # Does not fit: the service's infeasibility report names the least world size.
    above = _without_ortools(["check", str(too_big), "--min-world-size", "--server", service.base])
    assert above.returncode == 0, above.stderr
    # Fits: the search below its world size runs here, and says what it needs.
    below = _without_ortools(["check", request, "--min-world-size", "--server", service.base])
    assert (below.returncode, below.stdout) == (2, "")
    assert below.stderr == (
        "shardplan check --min-world-size: this install lacks the 'planner' extra (no module "
        "named 'ortools'): install shardplan with it, e.g. pip install './[planner]' in a "
        "checkout (docs/getting-started.md)\n"
    )
