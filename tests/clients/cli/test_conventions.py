"""The habits every ``shardplan`` command shares (clients/cli/output.py, helptext.py,
remote.py): ``-o FILE`` writes the document to FILE instead of standard output, whole or
not at all; ``$SHARDPLAN_SERVER`` stands in for ``--server``; ``--help`` is plain text with
the exit codes, its commands in the order of the workflow; sizes read in the unit that
shows them."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from tests.clients.cli.conftest import TOKEN

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
REQUEST = EXAMPLES / "request.json"
PLAN = EXAMPLES / "plan.json"
WORKFLOW = (
    "request",
    "options",
    "plan",
    "validate",
    "check",
    "diff",
    "migrate",
    "fetch",
    "serve",
    "measure",
    "calibrate",
    "profile",
    "schema",
)


@pytest.fixture
def template_and_csv(tmp_path):
    template, tables = tmp_path / "template.json", tmp_path / "tables.csv"
    template.write_text(json.dumps({"topology": {"world_size": 2}}))
    tables.write_text("name,num_embeddings,embedding_dim,pooling_factor\na,1000,16,1\n")
    return template, tables


# ------------------------------------------------------------------------------ -o FILE

DOCUMENT_COMMANDS = {  # argv, and the exit code with or without -o
    "request": (["request", "{template}", "--tables", "{csv}"], 0),
    "options": (["options", REQUEST], 0),
    "options --format table": (["options", REQUEST, "--format", "table"], 0),
    "plan": (["plan", REQUEST], 0),
    "plan --format table": (["plan", REQUEST, "--format", "table"], 0),
    "validate": (["validate", REQUEST, PLAN], 0),
    "check": (["check", REQUEST, "--format", "markdown"], 0),
    "diff": (["diff", PLAN, PLAN], 0),
    "migrate": (["migrate", PLAN, PLAN, "--format", "json"], 0),
    "schema": (["schema", "--model", "plan"], 0),
}


def _argv(argv: list[object], template_and_csv: tuple[Path, Path]) -> list[object]:
    template, csv = template_and_csv
    names = {"{template}": template, "{csv}": csv}
    return [names.get(arg, arg) if isinstance(arg, str) else arg for arg in argv]


@pytest.mark.parametrize("name", list(DOCUMENT_COMMANDS))
def test_output_takes_the_place_of_stdout(run_cli, tmp_path, template_and_csv, name):
    """The file holds exactly what stdout would; stdout stays empty; the exit code holds."""
    argv, code = DOCUMENT_COMMANDS[name]
    argv = _argv(argv, template_and_csv)
    printed = run_cli(*argv)
    assert printed.returncode == code, printed.stderr
    out = tmp_path / "out" / "document"
    out.parent.mkdir()
    written = run_cli(*argv, "-o", out)
    assert written.returncode == code, written.stderr
    assert written.stdout == ""
    assert _steady(out.read_text()) == _steady(printed.stdout) and printed.stdout.strip()
    assert [p.name for p in out.parent.iterdir()] == ["document"]  # no temporary left


def _steady(document: str) -> str:
    """The document without its measured wall time: two runs of one solve differ there
    (0.06 s against 0.07 s under load) and nowhere else."""
    return re.sub(r"(?m)^wall time .*$", "wall time <measured>", document)


def test_no_plan_puts_the_explanation_in_the_output_file(run_cli, tmp_path):
    request = tmp_path / "request.json"
    request.write_text(_with_hbm("1MiB"))
    out = tmp_path / "plan.json"
    result = run_cli("plan", request, "-o", out)
    assert result.returncode == 3 and result.stdout == ""
    assert json.loads(out.read_text())["status"] == "infeasible"
    assert "no plan exists:" in result.stderr


def test_output_has_the_permissions_of_a_plain_write(run_cli, tmp_path):
    """A new file gets what the umask allows (a temporary file alone would be 0600); an
    existing one keeps its own."""
    umask = os.umask(0o022)
    try:
        new = tmp_path / "new.json"
        assert run_cli("schema", "-o", new).returncode == 0
        assert stat.S_IMODE(new.stat().st_mode) == 0o644
        kept = tmp_path / "kept.json"
        kept.write_text("old")
        kept.chmod(0o640)
        assert run_cli("schema", "-o", kept).returncode == 0
        assert stat.S_IMODE(kept.stat().st_mode) == 0o640 and kept.read_text() != "old"
    finally:
        os.umask(umask)


def test_a_failing_command_leaves_the_output_file_as_it_was(run_cli, tmp_path):
    out = tmp_path / "verdict.txt"
    out.write_text("before")
    result = run_cli("validate", tmp_path / "missing.json", PLAN, "-o", out)
    assert result.returncode == 2 and "cannot read file" in result.stderr
    assert out.read_text() == "before"


def test_an_unwritable_output_is_refused_before_the_command_runs(run_cli, tmp_path):
    out = tmp_path / "no" / "such" / "report.md"
    result = run_cli("check", REQUEST, "-o", out)
    assert result.returncode == 2
    assert result.stderr.startswith(f"{out}: --output: cannot write: "), result.stderr
    assert "objective" not in result.stderr and result.stdout == ""


# ------------------------------------------------------------------------------ $SHARDPLAN_SERVER


def test_server_from_the_environment_plans_there_and_fetches_from_there(
    run_cli, service, tmp_path, monkeypatch
):
    """``plan`` and ``fetch`` without ``--server``: the variable names the service."""
    monkeypatch.delenv("SHARDPLAN_SERVER", raising=False)
    env = {"SHARDPLAN_SERVER": service.base, "SHARDPLAN_TOKEN": TOKEN}
    planned = tmp_path / "plan.json"
    made = run_cli("plan", REQUEST, "-o", planned, env=env)
    assert made.returncode == 0, made.stderr
    assert f" on {service.base} (round trip)" in made.stderr  # solved there, not here
    plan_id = json.loads(planned.read_text())["plan_id"]
    fetched = tmp_path / "fetched.json"
    got = run_cli("fetch", plan_id, "-o", fetched, env=env)
    assert got.returncode == 0, got.stderr
    assert got.stdout == "" and fetched.read_bytes() == planned.read_bytes().rstrip(b"\n")
    given = run_cli("fetch", plan_id, "--server", "http://127.0.0.1:1", "--retries", "0", env=env)
    assert given.returncode == 4  # --server wins over the variable


def test_no_server_names_the_flag_and_the_variable(run_cli, monkeypatch):
    monkeypatch.delenv("SHARDPLAN_SERVER", raising=False)
    result = run_cli("fetch", "a" * 64)
    assert result.returncode == 2
    assert result.stderr == (
        "arguments: --server: is required: pass --server URL or set $SHARDPLAN_SERVER to the "
        "planner service's http:// or https:// URL, e.g. http://planner:8000\n"
    )


# ------------------------------------------------------------------------------ --help


def _helps(run_cli) -> dict[str, str]:
    """Every command's --help (profile's actions too), after ``shardplan --help``'s."""
    commands = [*WORKFLOW, "profile put", "profile get"]
    helps = {"": run_cli("--help").stdout}
    for command in commands:
        result = run_cli(*command.split(), "--help")
        assert result.returncode == 0, result.stderr
        helps[command] = result.stdout
    return helps


def test_help_is_plain_text_and_states_the_exit_codes(run_cli):
    for command, text in _helps(run_cli).items():
        assert "``" not in text, command
        assert re.search(r"^Exit( codes:)? 0", text, re.MULTILINE), command


def test_help_lists_the_commands_in_the_order_of_the_workflow(run_cli):
    text = run_cli("--help").stdout
    listed = re.findall(r"^    (\w+)", text, re.MULTILINE)
    assert tuple(listed) == WORKFLOW
    assert "SHARDPLAN_SERVER" in text and "SHARDPLAN_TOKEN" in text


def test_every_server_option_names_its_variable(run_cli):
    for command in ("plan", "check", "fetch", "profile get", "profile put"):
        text = run_cli(*command.split(), "--help").stdout
        assert "(default: $SHARDPLAN_SERVER)" in " ".join(text.split()), command


# ------------------------------------------------------------------------------ sizes


def _with_hbm(hbm: str) -> str:
    document = json.loads(REQUEST.read_text())
    document["topology"]["hbm_bytes"] = hbm
    return json.dumps(document)


def test_a_one_mib_rank_is_said_in_mib(run_cli, tmp_path):
    """The issue's case: a 1 MiB request read "needs 0.001 GiB HBM ... but the largest
    rank offers 0.001 GiB HBM"."""
    request = tmp_path / "request.json"
    request.write_text(_with_hbm("1MiB"))
    result = run_cli("plan", request, "--format", "table")
    assert result.returncode == 3
    assert "(row_wise/fused_uvm) needs 1.00 MiB HBM and 122.07 MiB DDR" in result.stderr
    assert "the largest rank offers 870.40 KiB HBM and 128.00 GiB DDR" in result.stderr
    assert "0.00" not in result.stderr


def test_small_plans_tables_show_their_sizes(run_cli, tmp_path):
    """Rows of a few KiB: every byte cell shows a number above zero, in its unit."""
    request = tmp_path / "request.json"
    document = {
        "topology": {"world_size": 2},
        "tables": [{"name": "small", "num_embeddings": 100, "embedding_dim": 16}],
    }
    request.write_text(json.dumps(document))
    table = run_cli("plan", request, "--format", "table")
    options = run_cli("options", request, "--format", "table")
    for result in (table, options):
        assert result.returncode == 0, result.stderr
        assert not re.search(r"(^|\| )0\.00( \(|\s*(\||$))", result.stdout, re.MULTILINE)
    assert re.search(r"^0 +\| \d+\.\d\d KiB \(", table.stdout, re.MULTILINE)  # rank 0's HBM
