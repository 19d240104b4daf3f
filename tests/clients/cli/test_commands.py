"""The ``shardplan`` command line, run as the installed console script."""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from planner_service.plan.codec import plan_bytes
from planner_service.plan.types import PERF_COMPONENTS, ShardingPlan
from planner_service.plan.units import size
from planner_service.reports.options import OPTION_COLUMNS
from tests.support import builders
from tests.support.builders import request, table
from tests.support.servers import Service, free_port

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.fixture
def files(tmp_path):
    req = request([table("a", dim=256), table("b")], world_size=2)
    plan = builders.plan(
        req,
        {"a": builders.column_wise(req, "a", [128, 128], [1, 0]), "b": builders.row_wise(req, "b")},
    )
    request_path = tmp_path / "request.json"
    plan_path = tmp_path / "plan.json"
    request_path.write_text(req.model_dump_json())
    plan_path.write_bytes(plan_bytes(plan))
    return request_path, plan_path, plan


def test_validate_valid_plan(run_cli, files):
    request_path, plan_path, plan = files
    result = run_cli("validate", request_path, plan_path)
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.strip() == f"valid: plan {plan.plan_id[:12]} places 2 table(s) on 2 rank(s)"
    )


def test_validate_invalid_plan_one_line_per_violation(run_cli, files, tmp_path):
    request_path, plan_path, _ = files
    document = json.loads(plan_path.read_text())
    builders.move_shard(document["tables"]["a"], 1, 5)
    document["rank_stats"]["hbm_bytes"][0] = 10**15
    plan_path.write_text(json.dumps(document))
    result = run_cli("validate", request_path, plan_path)
    assert result.returncode == 1
    lines = result.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "plan_id_mismatch",
        "rank_out_of_range",
        "rank_stats",
    ]
    assert "table 'a': ranks name rank 5, but ranks are 0..1" in lines[1]
    assert "rank 0 reports hbm_bytes 1,000,000,000,000,000 (the shards use" in lines[2]
    assert "invalid: 3 violation(s)" in result.stderr


def test_validate_refuses_a_plan_made_for_another_batch_size(run_cli, files, tmp_path):
    """A plan solved for batch_size 512 was "valid" for a request with batch_size 4096."""
    request_path, plan_path, plan = files
    document = json.loads(request_path.read_text())
    document["batch_size"] = 4096
    bigger = tmp_path / "bigger.json"
    bigger.write_text(json.dumps(document))
    result = run_cli("validate", bigger, plan_path)
    assert result.returncode == 1
    first = result.stdout.splitlines()[0]
    assert first.startswith("request_hash_mismatch: ") and plan.request_hash in first


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "request.json: (document): not valid JSON: Expecting property name"),
        (
            '{"topology": {"world_size": 2}, "tables": [{"name": "a", "num_embeddings": -3, "embedding_dim": 4}]}',
            "tables[0].num_embeddings = -3: Input should be greater than or equal to 1",
        ),
        (
            '{"topology": {"world_size": 2}, "tables": [{"name": "a", "num_embeddings": 3, "embedding_dim": 0}]}',
            "tables[0].embedding_dim = 0",
        ),
        (
            '{"topology": {"world_size": 0}, "tables": [{"name": "a", "num_embeddings": 3, "embedding_dim": 4}]}',
            "topology.world_size = 0",
        ),
        (
            '{"topology": {"world_size": 4, "local_world_size": 3}, "tables": [{"name": "a", "num_embeddings": 3, "embedding_dim": 4}]}',
            "local_world_size 3 does not divide world_size 4",
        ),
        (
            '{"topology": {"world_size": 2}, "tables": [{"name": "a", "num_embeddings": 3, "embedding_dim": 4, "size": 1}]}',
            "tables[0].size = 1: unknown field",
        ),
        (
            '{"topology": {"world_size": 2}, "tables": [{"name": "a", "num_embeddings": 3, "embedding_dim": 4}, {"name": "a", "num_embeddings": 3, "embedding_dim": 4}]}',
            "tables[1].name 'a' duplicates tables[0].name",
        ),
        (
            '{"topology": {"world_size": 2}, "tables": [{"name": "a", "num_embeddings": 3, "embedding_dim": 4, "feature_names": ["f"]}, {"name": "b", "num_embeddings": 3, "embedding_dim": 4, "feature_names": ["f"]}]}',
            "uses feature 'f', already used by tables[0]",
        ),
    ],
)
def test_bad_request_exits_2_with_clear_message(run_cli, files, content, expected):
    request_path, plan_path, _ = files
    request_path.write_text(content)
    result = run_cli("validate", request_path, plan_path)
    assert result.returncode == 2
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"{request_path}: ")


def test_missing_file_and_bad_plan_version(run_cli, files, tmp_path):
    request_path, plan_path, _ = files
    missing = run_cli("validate", request_path, tmp_path / "nope.json")
    assert missing.returncode == 2
    assert "nope.json: (document): cannot read file: No such file or directory" in missing.stderr
    document = json.loads(plan_path.read_text())
    document["schema_version"] = "9.0"
    plan_path.write_text(json.dumps(document))
    future = run_cli("validate", request_path, plan_path)
    assert future.returncode == 2
    assert (
        "schema_version = '9.0': this shardplan reads plan schemas 1.0 to 1.2 and 2.0"
        in future.stderr
    )
    assert "Traceback" not in missing.stderr + future.stderr


def test_usage_errors_exit_2(run_cli):
    result = run_cli("validate", "only-one.json")
    assert result.returncode == 2
    assert "the following arguments are required: plan" in result.stderr


def test_schema_prints_both_json_schemas(run_cli):
    result = run_cli("schema")
    assert result.returncode == 0
    schemas = json.loads(result.stdout)
    assert set(schemas) == {"PlanRequest", "ShardingPlan"}
    assert schemas["ShardingPlan"] == ShardingPlan.model_json_schema()
    assert "world_size" in schemas["PlanRequest"]["$defs"]["Topology"]["properties"]
    only = json.loads(run_cli("schema", "--model", "plan").stdout)
    assert list(only) == ["ShardingPlan"]


# --------------------------------------------------------------------------- plan


def _write_request(tmp_path, document) -> str:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(document))
    return str(path)


def test_plan_writes_a_valid_plan(run_cli, tmp_path):
    path = _write_request(
        tmp_path,
        {
            "topology": {"world_size": 4, "local_world_size": 2},
            "tables": [
                {"name": f"t{i}", "num_embeddings": 10**5 * (i + 1), "embedding_dim": 64}
                for i in range(6)
            ],
            "options": {"time_limit_s": 1},
        },
    )
    out = tmp_path / "plan.json"
    result = run_cli("plan", path, "--output", out)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""  # the plan is in the file instead
    plan = json.loads(out.read_text())
    assert plan["solver"]["objective"] >= plan["solver"]["lower_bound"]
    assert "gap" in result.stderr and result.stderr.startswith(plan["solver"]["status"])
    validated = run_cli("validate", path, out)
    assert validated.returncode == 0, validated.stdout


def test_plan_table_format(run_cli, tmp_path):
    path = _write_request(
        tmp_path,
        {
            "topology": {"world_size": 2},
            "tables": [
                {"name": "users", "num_embeddings": 1000, "embedding_dim": 128},
                {"name": "ads", "num_embeddings": 50, "embedding_dim": 16},
            ],
        },
    )
    result = run_cli("plan", path, "--format", "table")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = [cell.strip() for cell in lines[0].split(" | ")]
    assert header[:4] == ["rank", "HBM (% of usable)", "DDR (% of usable)", "perf ms"]
    components = header[4 : header.index("input")]
    assert components == list(PERF_COMPONENTS)  # input_dist included
    for line in lines[2:4]:  # the ranks: the components add up to perf ms
        cells = [cell.strip() for cell in line.split(" | ")]
        assert sum(map(float, cells[4 : 4 + len(components)])) == pytest.approx(
            float(cells[3]), abs=1e-3
        )
    assert "% of usable: of what the rank offers to tables after the reservation" in lines[4]
    assert lines[5] == "perf ms = " + " + ".join(PERF_COMPONENTS)
    assert any(line.startswith("users ") for line in lines)
    assert any(line.startswith("status ") for line in lines)
    assert any(line.startswith("gap ") for line in lines)


def test_plan_exits_3_with_an_explanation(run_cli, tmp_path):
    path = _write_request(
        tmp_path,
        {
            "topology": {"world_size": 2, "hbm_bytes": 2**30, "ddr_bytes": 2**30},
            "tables": [{"name": "huge", "num_embeddings": 10**9, "embedding_dim": 128}],
        },
    )
    result = run_cli("plan", path)
    assert result.returncode == 3
    explanation = json.loads(result.stdout)
    assert explanation["status"] == "infeasible"
    assert explanation["reasons"][0]["tables"] == ["huge"]
    assert "no plan exists:" in result.stderr
    assert "table 'huge' fits no rank" in result.stderr


def test_progress_line_for_long_solves(monkeypatch, capsys):
    from clients.cli.progress import ProgressLine

    monkeypatch.setattr(ProgressLine, "INTERVAL_S", 0.05)
    import time

    with ProgressLine() as progress:
        progress.update("cp-sat", 1.25, 1.0)
        time.sleep(0.2)
    err = capsys.readouterr().err
    assert "planning: 0 s, cp-sat, best 1.25 ms, bound 1 ms" in err


# --------------------------------------------------------------------------- output paths


@pytest.mark.parametrize("where", ["missing directory", "a directory", "under a file"])
def test_plan_refuses_an_unwritable_output_before_solving(run_cli, tmp_path, where):
    path = _write_request(tmp_path, json.loads((EXAMPLES / "request.json").read_text()))
    out = {
        "missing directory": tmp_path / "no" / "such" / "plan.json",
        "a directory": tmp_path,
        "under a file": tmp_path / "request.json" / "plan.json",
    }[where]
    result = run_cli("plan", path, "-o", out)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"{out}: --output: cannot write: "), result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""  # refused before solving: no plan, no solver status line
    assert "objective" not in result.stderr
    assert not out.is_file()


def test_serve_refuses_a_sqlite_store_it_cannot_create(run_cli_process, tmp_path):
    (tmp_path / "file").write_text("")
    db = tmp_path / "file" / "plans.db"
    result = run_cli_process("serve", "--port", free_port(), "--db", db)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"{db}: --db: cannot write: {db.parent} is not a directory (create it, or choose "
        "another path)\n"
    )


def test_plan_output_overwrites_an_existing_file(run_cli, tmp_path):
    path = _write_request(tmp_path, json.loads((EXAMPLES / "request.json").read_text()))
    out = tmp_path / "plan.json"
    out.write_text("old")
    result = run_cli("plan", path, "-o", out)
    assert result.returncode == 0, result.stderr
    assert out.read_text() == run_cli("plan", path).stdout


# --------------------------------------------------------------------------- stdin


def test_dash_reads_the_request_or_the_plan_from_stdin(run_cli, files):
    request_path, plan_path, plan = files
    request_text, plan_text = request_path.read_text(), plan_path.read_text()
    from_file = run_cli("plan", request_path)
    from_stdin = run_cli("plan", "-", stdin=request_text)
    assert from_stdin.returncode == 0, from_stdin.stderr
    assert from_stdin.stdout == from_file.stdout
    options = run_cli("options", "-", stdin=request_text)
    assert options.returncode == 0, options.stderr
    assert options.stdout == run_cli("options", request_path).stdout
    valid = f"valid: plan {plan.plan_id[:12]} places 2 table(s) on 2 rank(s)\n"
    for args, text in [(("-", plan_path), request_text), ((request_path, "-"), plan_text)]:
        result = run_cli("validate", *args, stdin=text)
        assert (result.returncode, result.stdout) == (0, valid), result.stderr


def test_dash_stdin_errors_name_stdin(run_cli, files):
    request_path, _, _ = files
    both = run_cli("validate", "-", "-", stdin=request_path.read_text())
    assert both.returncode == 2
    assert "only one of request and plan can be - (stdin)" in both.stderr
    bad = run_cli("plan", "-", stdin="{not json")
    assert bad.returncode == 2
    assert bad.stderr.startswith("<stdin>: (document): not valid JSON"), bad.stderr
    assert "Traceback" not in both.stderr + bad.stderr


# --------------------------------------------------------------------------- examples


def test_examples_plan_is_what_plan_makes_for_examples_request(run_cli):
    """examples/plan.json is `shardplan plan examples/request.json`, indented: regenerate
    it with `make examples` when the planner's output changes."""
    result = run_cli("plan", EXAMPLES / "request.json")
    assert result.returncode == 0, result.stderr
    made = json.loads(result.stdout)
    committed = (EXAMPLES / "plan.json").read_text()
    assert made["plan_id"] == json.loads(committed)["plan_id"], "run `make examples`"
    assert json.dumps(made, indent=2, ensure_ascii=False) + "\n" == committed, "make examples"


# --------------------------------------------------------------------------- Ctrl-C


def _slow_request(tmp_path) -> str:
    """300 tables on 64 ranks with gap_limit 0: CP-SAT cannot close the gap (0.03% left
    when measured), so the solve runs to its 30 s limit."""
    tables = [
        {
            "name": f"t{i:03d}",
            "num_embeddings": 10_000 * (1 + (i * 7919) % 997),
            "embedding_dim": (32, 64, 128, 256)[i % 4],
            "pooling_factors": [1.0 + (i * 31) % 17],
        }
        for i in range(300)
    ]
    return _write_request(
        tmp_path,
        {
            "topology": {"world_size": 64, "local_world_size": 8},
            "tables": tables,
            "options": {"time_limit_s": 30, "gap_limit": 0},
        },
    )


@pytest.mark.parametrize(
    "marker",
    ["planning:", "best "],  # the first progress line; the search (CP-SAT's C++) has begun
)
@pytest.mark.slow  # its subject is the process
def test_ctrl_c_stops_a_solve_with_exit_130(shardplan_exe, tmp_path, marker):
    out = tmp_path / "stdout"
    with (
        out.open("w") as stdout,
        subprocess.Popen(
            [str(shardplan_exe), "plan", _slow_request(tmp_path)],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
        ) as process,
    ):
        assert process.stderr is not None
        try:
            lines = []
            for line in process.stderr:  # a progress line every 2 s
                lines.append(line)
                if line.startswith("planning:") and marker in line:
                    break
            assert process.poll() is None, f"finished before {marker!r}: {lines}"
            process.send_signal(signal.SIGINT)
            returncode = process.wait(timeout=20)  # generous: fails only on a hang
            lines += process.stderr.readlines()
        finally:
            process.kill()
    messages = [line for line in lines if not line.startswith("planning:")]
    assert (returncode, messages) == (130, ["shardplan: interrupted\n"])
    assert out.read_text() == ""


# --------------------------------------------------------------------------- serve


def test_serve_refuses_protected_reads_without_tokens(shardplan_exe, tmp_path):
    command = [str(shardplan_exe), "serve", "--port", str(free_port())]
    env = {**os.environ, "SHARDPLAN_PROTECT_READS": "1", "SHARDPLAN_API_TOKENS": ""}
    env["SHARDPLAN_DATABASE_URL"] = str(tmp_path / "plans.db")
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    ) as process:  # fmt: skip
        try:
            _, err = process.communicate(timeout=60)  # generous: a server that starts never ends
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 2, err
    assert "SHARDPLAN_PROTECT_READS" in err and "set SHARDPLAN_API_TOKENS" in err
    assert "Traceback" not in err and "serving on" not in err


@pytest.mark.slow  # its subject is the process
def test_serve_takes_host_port_and_workers_from_the_environment(shardplan_exe, tmp_path):
    """A container is configured by its environment alone (the image passes no flags)."""
    port = free_port()
    env = {**os.environ, "SHARDPLAN_HOST": "127.0.0.1", "SHARDPLAN_PORT": str(port)}
    env |= {"SHARDPLAN_HTTP_WORKERS": "2", "SHARDPLAN_SOLVE_WORKERS": "1"}
    env["SHARDPLAN_DATABASE_URL"] = str(tmp_path / "plans.db")
    log = tmp_path / "log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(shardplan_exe), "serve"], stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
    service = Service(shardplan_exe, log, db="", port=port)
    service.process = process
    try:
        service.wait_healthy(timeout=60)
    finally:
        service.stop()
    assert f"serving on http://127.0.0.1:{port} with 2 HTTP worker(s) x 1 solver" in log.read_text()


@pytest.mark.slow  # its subject is the process
def test_serve_raises_its_open_files_limit_so_a_storm_of_connections_is_accepted(
    shardplan_exe, tmp_path
):
    """Started with a soft limit of 256 open files (as a default-configured host may), the
    service raises it to the hard limit, and 600 connections open at once all get an
    answer; at 256 its worker could not accept them (each is a file)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.fail(f"this test needs a hard open-files limit of at least 1024, not {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:  # the service inherits the lowered soft limit
        service = Service(shardplan_exe, tmp_path / "log", db=str(tmp_path / "plans.db")).start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        assert "open files per process" in service.log()
        limits = Path(f"/proc/{service.process.pid}/limits").read_text()
        [line] = [row for row in limits.splitlines() if row.startswith("Max open files")]
        assert line.split()[3] == line.split()[4] != "256", line  # soft == hard

        async def storm() -> list[int]:
            limits = httpx.Limits(max_connections=600, max_keepalive_connections=600)
            async with httpx.AsyncClient(limits=limits, timeout=30) as client:
                answers = await asyncio.gather(
                    *(client.get(f"{service.base}/healthz") for _ in range(600))
                )
            return [answer.status_code for answer in answers]

        assert asyncio.run(storm()) == [200] * 600
    finally:
        service.stop()


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("SHARDPLAN_PORT", "eighty", "environment: SHARDPLAN_PORT = 'eighty': must be an integer"),
        (
            "SHARDPLAN_PORT",
            "70000",
            "environment: SHARDPLAN_PORT = 70000: must be between 0 and 65535",
        ),
        (
            "SHARDPLAN_HTTP_WORKERS",
            "0",
            "environment: SHARDPLAN_HTTP_WORKERS = 0: must be at least 1",
        ),
    ],
)
def test_serve_refuses_a_bad_port_or_workers_variable(run_cli_process, variable, value, message):
    result = run_cli_process("serve", env={variable: value})
    assert (result.returncode, result.stdout, result.stderr) == (2, "", message + "\n")


def test_serve_flags_win_over_their_variables(run_cli_process):
    """A bad variable is not read when its flag is given; the flag's value is checked."""
    env = {"SHARDPLAN_PORT": "eighty", "SHARDPLAN_HTTP_WORKERS": "eighty"}
    result = run_cli_process("serve", "--port", "1", "--workers", "0", env=env)
    assert (result.returncode, result.stderr) == (
        2,
        "--workers: (document) = 0: must be at least 1\n",
    )


def test_serve_help_names_the_services_default_store(run_cli):
    from planner_service.service.settings import DEFAULT_DATABASE

    result = run_cli("serve", "--help")
    assert result.returncode == 0, result.stderr
    assert f"else {DEFAULT_DATABASE})" in " ".join(result.stdout.split())
    for variable in ("SHARDPLAN_HOST", "SHARDPLAN_PORT", "SHARDPLAN_HTTP_WORKERS"):
        assert f"${variable}, else" in " ".join(result.stdout.split())


# --------------------------------------------------------------------------- extras


def test_a_missing_extra_is_one_line_naming_it():
    """tests/project/test_packaging.py runs the real thing in an install without the extras."""
    from clients.cli.extras import MissingExtraError, needs_extra

    with pytest.raises(MissingExtraError) as missing, needs_extra("plan", "planner"):
        import shardplan_no_such_library  # noqa: F401
    assert str(missing.value) == (
        "shardplan plan: this install lacks the 'planner' extra (no module named "
        "'shardplan_no_such_library'): install shardplan with it, e.g. pip install './[planner]' in a "
        "checkout (docs/getting-started.md)"
    )


def test_a_missing_module_of_our_own_is_a_bug_not_an_extra():
    from clients.cli.extras import needs_extra

    with pytest.raises(ModuleNotFoundError), needs_extra("plan", "planner"):
        import planner_service.no_such_module  # noqa: F401


# --------------------------------------------------------------------------- natural order


def test_tables_are_shown_in_natural_order(run_cli, tmp_path):
    names = ["t10", "t2", "t1"]
    path = _write_request(
        tmp_path,
        {
            "topology": {"world_size": 2},
            "tables": [{"name": n, "num_embeddings": 100, "embedding_dim": 8} for n in names],
        },
    )
    plan = run_cli("plan", path, "--format", "table")
    assert plan.returncode == 0, plan.stderr
    shown = re.findall(r"^(t[0-9]+) ", plan.stdout, flags=re.MULTILINE)
    assert shown == ["t1", "t2", "t10"]
    options = run_cli("options", path, "--format", "table")
    titles = re.findall(r"^(t[0-9]+): ", options.stdout, flags=re.MULTILINE)
    assert titles == ["t1", "t2", "t10"]


# --------------------------------------------------------------------------- options table


def test_options_table_shows_what_the_json_says(run_cli):
    as_json = run_cli("options", EXAMPLES / "request.json")
    as_table = run_cli("options", EXAMPLES / "request.json", "--format", "table")
    assert as_table.returncode == as_json.returncode == 0, as_table.stderr
    document = json.loads(as_json.stdout)
    sections = as_table.stdout.split("\n\n")
    assert sections[0].splitlines()[1].split(" | ")[0] == "ranks"
    for section in sections[1:-1]:
        title, header, _, *rows = section.splitlines()
        name = title.split(":")[0]
        options = document["tables"][name]
        assert title.endswith(f"{len(options)} option(s)") and len(rows) == len(options)
        columns = [cell.strip() for cell in header.split(" | ")]
        assert tuple(columns) == OPTION_COLUMNS
        for row, option in zip(rows, options, strict=True):
            cells = dict(zip(columns, (cell.strip() for cell in row.split(" | ")), strict=True))
            assert cells["sharding type"] == option["sharding_type"]
            assert cells["shards"] == str(len(option["shards"]))
            worst = max(shard["perf"]["total"] for shard in option["shards"])
            assert cells["perf ms"] == f"{worst:.4f}"
            hbm = max(shard["storage"]["hbm_bytes"] for shard in option["shards"])
            assert cells["HBM"] == size(hbm)
    assert len(as_table.stdout) < len(as_json.stdout)


# --------------------------------------------------------------------------- tables from CSV

TEMPLATE = {"topology": {"world_size": 4, "hbm_bytes": "16GiB"}, "options": {"time_limit_s": 2}}
CSV = (
    "\ufeffname,num_embeddings,embedding_dim,pooling_factor,feature_names,data_type,optimizer\n"
    "users,1000000,128,1,,,\n"
    "\n"
    'items,500000,256,20;45,"clicked;viewed",fp16,rowwise_adagrad\n'
    "country,250,16,2.5,,,\n"
)
EQUIVALENT_TABLES = [
    {"name": "users", "num_embeddings": 1000000, "embedding_dim": 128},
    {
        "name": "items",
        "num_embeddings": 500000,
        "embedding_dim": 256,
        "feature_names": ["clicked", "viewed"],
        "pooling_factors": [20.0, 45.0],
        "data_type": "fp16",
        "optimizer": "rowwise_adagrad",
    },
    {"name": "country", "num_embeddings": 250, "embedding_dim": 16, "pooling_factors": [2.5]},
]


@pytest.fixture
def csv_files(tmp_path):
    template, tables = tmp_path / "template.json", tmp_path / "tables.csv"
    template.write_text(json.dumps(TEMPLATE))
    tables.write_text(CSV)
    return template, tables


def test_request_from_a_csv_is_the_request_written_by_hand(run_cli, csv_files, tmp_path):
    from planner_service.plan.codec import parse_request, request_hash

    template, tables = csv_files
    result = run_cli("request", template, "--tables", tables)
    assert result.returncode == 0, result.stderr
    made = json.loads(result.stdout)
    assert made["topology"]["hbm_bytes"] == "16GiB"  # the template's spelling is kept
    by_hand = parse_request(json.dumps({**TEMPLATE, "tables": EQUIVALENT_TABLES}))
    assert request_hash(parse_request(result.stdout)) == request_hash(by_hand)
    out = tmp_path / "request.json"
    assert run_cli("request", template, "--tables", tables, "-o", out).stdout == ""
    assert json.loads(out.read_text()) == made


def test_plan_and_options_read_tables_from_csv(run_cli, csv_files, tmp_path):
    template, tables = csv_files
    planned = run_cli("plan", template, "--tables", tables, "-o", tmp_path / "plan.json")
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout == ""
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert set(plan["tables"]) == {"users", "items", "country"}
    request = tmp_path / "request.json"
    request.write_text(run_cli("request", template, "--tables", tables).stdout)
    assert run_cli("validate", request, tmp_path / "plan.json").returncode == 0
    options = run_cli("options", template, "--tables", tables)
    assert options.returncode == 0 and set(json.loads(options.stdout)["tables"]) == {
        "users",
        "items",
        "country",
    }


@pytest.mark.parametrize(
    ("csv", "expected"),
    [
        ("", ["(document): is empty; the header is name,num_embeddings,embedding_dim,"]),
        (
            "name,num_embeddings,embedding_dim,pooling_factor,colour\na,1,4,1,red\n",
            ["line 1, column 5 = 'colour': unknown column; columns: name, num_embeddings,"],
        ),
        (
            "name,num_embeddings,embedding_dim\na,1,4\n",
            ["line 1: the header lacks pooling_factor; it needs name, num_embeddings,"],
        ),
        (
            "name,num_embeddings,embedding_dim,pooling_factor\n",
            ["(document): has a header but no tables"],
        ),
        (
            'name,num_embeddings,embedding_dim,pooling_factor\n"a,1,4,1\n',
            ["line 2: not valid CSV: unexpected end of data"],
        ),
        (
            "name,num_embeddings,embedding_dim,pooling_factor,feature_names,data_type\n"
            "a,10x,4,1,,\n"
            "b,10,0,1,f;g,fp64\n"
            "c,10,4,1;2;3,f1;f2,\n"
            "d,10,4,x,,\n"
            "e,10,4\n",
            [
                "line 2, column num_embeddings = '10x': must be a whole number (digits only)",
                "line 3, column embedding_dim = '0': Input should be greater than or equal to 1",
                "line 3, column data_type = 'fp64': Input should be 'fp32', 'fp16', 'bf16' or",
                "line 4, column pooling_factor = '1;2;3': pooling_factors of table 'c' has 3 "
                "entries but the table has 2 feature_names; give one per feature",
                "line 5, column pooling_factor = 'x': must be a number, or one per feature",
                "line 6: has 3 cells, but the header names 6 columns",
            ],
        ),
        (
            "name,num_embeddings,embedding_dim,pooling_factor,feature_names\n"
            "a,10,4,1,f\n"
            "a,10,4,1,g\n"
            "b,10,4,1,f\n",
            [
                "line 3, column name = 'a': is the name of the table on line 2 too",
                "line 4, column feature_names = 'f': feature 'f' already looks up the table "
                "on line 2",
            ],
        ),
    ],
)
def test_a_bad_csv_names_the_line_and_column(run_cli, csv_files, csv, expected):
    template, tables = csv_files
    tables.write_text(csv)
    result = run_cli("plan", template, "--tables", tables)
    assert result.returncode == 2, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == len(expected), result.stderr
    for line, start in zip(lines, expected, strict=True):
        assert line.startswith(f"{tables}: {start}"), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_a_template_with_its_own_tables_is_refused(run_cli, csv_files):
    template, tables = csv_files
    template.write_text(json.dumps({**TEMPLATE, "tables": EQUIVALENT_TABLES}))
    result = run_cli("request", template, "--tables", tables)
    assert result.returncode == 2
    assert result.stderr == f"{template}: tables: given here and by --tables {tables}; remove one\n"
    both = run_cli("plan", "-", "--tables", "-")
    assert both.returncode == 2
    assert "only one of REQUEST and --tables can be - (stdin)" in both.stderr
