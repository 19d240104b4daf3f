"""The docs are real: their examples parse, hash and validate as documented, and every
command in them runs as written (the convention is in ``tests/project/doc_commands.py``)."""

from __future__ import annotations

import ast
import http.server
import importlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import tomllib
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from planner_service.plan import types
from planner_service.plan.canonical import plan_id_of
from planner_service.plan.codec import parse_plan, parse_request
from planner_service.validate.validator import validate_plan
from tests.project import doc_commands
from tests.project.doc_commands import DOCUMENTED_HOST, Command
from tests.support.installs import copy_distribution
from tests.support.servers import Service

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
BIN = Path(sys.executable).parent

# Commands shown but not run, and why. Everything else in a console block runs.
NOT_RUN = {
    "shardplan calibrate --budget-s 180 -o profile.json": "measures for up to 3 minutes; "
    "tests/runtime/test_calibrate.py runs a 10 s calibration",
    "make run": "serves until stopped; pages that talk to the service get their own server",
    "make test": "runs this suite",
    "shardplan serve --db var/shardplan.db": "serves until stopped, as make run",
    "source .venv/bin/activate": "the suite already runs in the virtualenv",
}
SHELL_LANGUAGES = {"sh", "bash", "shell", "zsh"}
PAGE_TIMEOUT_S = 120


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _page_commands(path: Path) -> list[Command]:
    """The commands a page's run runs: those of its console blocks, but for the installs
    (``test_install_commands_run_as_written`` runs those, in a copy of the checkout)."""
    return [
        command
        for block in doc_commands.blocks(path)
        if block.lang == "console" and not _installs(block)
        for command in doc_commands.commands(block)
    ]


def _installs(block: doc_commands.Block) -> bool:
    """A console block that installs shardplan (a pip install; its venv and the check that
    it runs come with it)."""
    return block.lang == "console" and any(
        re.search(r"(^|/)pip install ", command.text) for command in doc_commands.commands(block)
    )


# --------------------------------------------------------------------------- commands


def _run_page(page: Path, tmp: Path) -> tuple[list[Command], list[doc_commands.Result]]:
    """Run one page's commands (with a service of its own when they use one)."""
    page_commands = [c for c in _page_commands(page) if c.bare not in NOT_RUN]
    files = {b.file: b.body for b in doc_commands.blocks(page) if b.file}
    service = None
    if any(DOCUMENTED_HOST in c.text for c in page_commands):
        service = Service(BIN / "shardplan", tmp / "service.log", db=str(tmp / "plans.db"))
        service.start()
    workdir = tmp / "work"
    workdir.mkdir()
    try:
        results = doc_commands.run_page(
            page_commands,
            files,
            workdir=workdir,
            examples=ROOT / "examples",
            bin_dir=BIN,
            host=service.base.removeprefix("http://") if service else None,
            timeout=PAGE_TIMEOUT_S,
        )
    finally:
        if service is not None:
            service.stop()
    return page_commands, results


@pytest.fixture(scope="module")
def page_runs(request, tmp_path_factory):
    """The selected pages' commands, run side by side: most of their time is process
    start-up and waiting on servers, so three at once take about half as long."""
    assert shutil.which("curl"), (
        "the docs' commands need curl 7.84 or later (make test installs it)"
    )
    selected = {
        item.callspec.params["page"]
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_page_commands_run_as_written"
    }
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {
            page: pool.submit(_run_page, page, tmp_path_factory.mktemp(page.stem))
            for page in sorted(selected)
        }
        yield futures


# A page runs all of its commands (training.md trains the example job): 18 s on 2 cores.
@pytest.mark.slow  # runs the page's commands as processes
@pytest.mark.budget(60)
@pytest.mark.timeout(PAGE_TIMEOUT_S * 3)
@pytest.mark.parametrize("page", [p for p in PAGES if _page_commands(p)], ids=_page_id)
def test_page_commands_run_as_written(page, page_runs):
    page_commands, results = page_runs[page].result()
    _assert_ran_as_shown(page, page_commands, results)


def _assert_ran_as_shown(
    page: Path, page_commands: list[Command], results: list[doc_commands.Result]
) -> None:
    """Every command ran, exited as the page says and printed what it shows."""
    for result in results:
        command = result.command
        where = f"{_page_id(page)}:{command.line}: $ {command.text}"
        if result.exit_code == doc_commands.TIMED_OUT:
            pytest.fail(
                f"{where}\nthe page stopped here (timed out after {PAGE_TIMEOUT_S} s, or the shell exited):\n{result.output}"
            )
        if result.exit_code != command.exit_code:
            pytest.fail(
                f"{where}\nexit {result.exit_code}, not {command.exit_code}:\n{result.output}"
            )
        if not doc_commands.output_matches(command.output, result.output):
            shown = "\n".join(command.output)
            pytest.fail(f"{where}\n--- shown\n{shown}\n--- printed\n{result.output}")
    assert len(results) == len(page_commands)


# --------------------------------------------------------------------------- installs

INSTALL_PAGE = ROOT / "docs" / "getting-started.md"
INSTALL_TIMEOUT_S = 240
# A requirement installed from a git URL, pinned: ``git+https://HOST/PATH@REF``.
GIT_URL = re.compile(r"git\+(?P<url>https://[^@'\s]+)@(?P<ref>[\w.\-]+)")


def _install_commands(page: Path) -> list[Command]:
    return [
        command
        for block in doc_commands.blocks(page)
        if _installs(block)
        for command in doc_commands.commands(block)
    ]


def _git_requirement(page: Path) -> str:
    """The requirement the page installs from a git URL (``'NAME[EXTRAS] @ git+URL'``)."""
    (requirement,) = {
        match.group(1)
        for command in _install_commands(page)
        for match in re.finditer(r"'([^']* @ git\+[^']+)'", command.text)
    }
    return requirement


@pytest.mark.slow  # makes virtual environments and builds the package
@pytest.mark.timeout(INSTALL_TIMEOUT_S)
def test_install_commands_run_as_written(tmp_path):
    """The installs on getting-started.md, run as written in a copy of the checkout: fresh
    virtual environments, ``pip install`` from the checkout and from the git URL, with
    the extra, then the installed ``shardplan``. Two things are stood in for rather than
    fetched. The dependencies: ``PIP_NO_DEPS=1`` (pip resolves them from the package index
    as for any package; the build's own requirements, setuptools and wheel, are still
    fetched into its isolated environment). The repository at the URL: a git repository
    of the checkout's files, tagged as the URL pins it, which git is sent to by a
    ``url.<local>.insteadOf`` rule, so pip clones and checks out the pinned tag for real."""
    commands = _install_commands(INSTALL_PAGE)
    installs = [command.text for command in commands if "pip install" in command.text]
    assert any("pip install './[planner]'" in text for text in installs), installs
    assert any(GIT_URL.search(text) for text in installs), installs
    # With PIP_NO_DEPS pip only warns about an extra the package lacks: check them here.
    named = {
        e for t in installs for group in re.findall(r"\[([\w,]+)\]", t) for e in group.split(",")
    }
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert named <= set(declared["optional-dependencies"]), named
    repository = _git_stand_in(tmp_path / "repository", commands)
    source = copy_distribution(tmp_path / "checkout")
    env = {"PIP_NO_DEPS": "1", **repository}
    results = doc_commands.run_page(
        commands, {}, workdir=source, examples=ROOT / "examples", bin_dir=BIN, host=None,
        timeout=INSTALL_TIMEOUT_S - 30, env=env,
    )  # fmt: skip
    _assert_ran_as_shown(INSTALL_PAGE, commands, results)
    assert len(results) == len(commands)


def _git_stand_in(directory: Path, commands: list[Command]) -> dict[str, str]:
    """A git repository of the distribution at ``directory``, tagged with the ref each git
    URL in ``commands`` pins, and the environment that sends git there for those URLs."""
    copy_distribution(directory)
    git = ["git", "-C", str(directory), "-c", "user.name=docs", "-c", "user.email=docs@test"]
    subprocess.run([*git, "init", "--quiet"], check=True, timeout=30)
    subprocess.run([*git, "add", "--all"], check=True, timeout=30)
    subprocess.run([*git, "commit", "--quiet", "-m", "checkout"], check=True, timeout=30)
    pins = {m["url"]: m["ref"] for c in commands for m in GIT_URL.finditer(c.text)}
    assert pins, "getting-started.md installs from no git URL"
    env = {"GIT_CONFIG_COUNT": str(len(pins))}
    for index, (url, ref) in enumerate(sorted(pins.items())):
        subprocess.run([*git, "tag", ref], check=True, timeout=30)
        env[f"GIT_CONFIG_KEY_{index}"] = f"url.{directory.as_uri()}.insteadOf"
        env[f"GIT_CONFIG_VALUE_{index}"] = url
    return env


def test_every_command_block_is_a_console_block():
    """Shell blocks would escape the test above: commands go in ``console`` blocks."""
    for page in PAGES:
        for block in doc_commands.blocks(page):
            assert block.lang not in SHELL_LANGUAGES, (
                f"{_page_id(page)}:{block.line}: use ```console with `$ ` prompts"
            )


def test_not_run_commands_are_still_in_the_docs():
    shown = {c.bare for page in PAGES for c in _page_commands(page)}
    assert set(NOT_RUN) <= shown, set(NOT_RUN) - shown


def test_output_matching():
    match = doc_commands.output_matches
    assert match([], "")
    assert not match([], "something\n")
    assert match(
        ["valid: plan <plan_id> places 3 table(s)"], "valid: plan 0a1b places 3 table(s)\n"
    )
    assert not match(["valid: plan <plan_id> places 3"], "valid: plan  places 3\n")
    assert match(["first", "...", "last"], "first\nA\nB\nlast\n")
    assert match(["first", "...", "last"], "first\nlast")
    assert not match(["first", "last"], "first\nA\nlast\n")
    assert match(["a   ", "b"], "a\nb   \n")  # trailing spaces are not shown
    # Progress lines come on a slow machine; they are compared only where shown.
    slow = "planning: 2 s, starting\nexamples/request.json fits\n"
    assert match(["examples/request.json fits"], slow)
    assert not match(["planning: 4 s, starting", "examples/request.json fits"], slow)
    assert match(["planning: <seconds> s, starting", "examples/request.json fits"], slow)


# --------------------------------------------------------------------------- code blocks


def _runtime_exports() -> set[str]:
    """``runtime.__all__``, read without importing torch."""
    tree = ast.parse((ROOT / "runtime" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__":
            return set(ast.literal_eval(node.value))
    raise AssertionError("runtime/__init__.py has no __all__")


def test_python_blocks_compile_and_import_what_exists():
    runtime_names = _runtime_exports()
    for page in PAGES:
        for block in doc_commands.blocks(page):
            if block.lang != "python":
                continue
            where = f"{_page_id(page)}:{block.line}"
            tree = compile(block.body, where, "exec", ast.PyCF_ONLY_AST)
            for node in ast.walk(tree):
                if not isinstance(node, ast.ImportFrom) or not node.module:
                    continue
                names = {alias.name for alias in node.names}
                if node.module == "runtime":
                    assert names <= runtime_names, (where, names - runtime_names)
                elif node.module.split(".")[0] in {"planner_service", "clients"}:
                    module = importlib.import_module(node.module)
                    missing = {n for n in names if not hasattr(module, n)}
                    assert not missing, (where, node.module, missing)


def test_json_blocks_parse():
    for page in PAGES:
        for block in doc_commands.blocks(page):
            if block.lang == "json":
                json.loads(block.body)


def test_request_format_documents_every_field():
    """docs/requests.md names every field a request can hold."""
    text = (ROOT / "docs" / "requests.md").read_text()
    models = (
        types.PlanRequest,
        types.Topology,
        types.RankOverride,
        types.Table,
        types.Constraints,
        types.ParameterConstraints,
        types.PlanOptions,
    )
    for model in models:
        for name in model.model_fields:
            assert f"`{name}`" in text, f"docs/requests.md does not name {model.__name__}.{name}"


def test_json_requests_are_the_example_or_files_the_commands_use():
    """A request shown in the guide is either examples/request.json or a file that the
    page's commands run (so the planner has read it)."""
    example = json.loads((ROOT / "examples" / "request.json").read_text())
    for page in PAGES:
        for block in doc_commands.blocks(page):
            if block.lang == "json" and not block.file and '"topology"' in block.body:
                assert json.loads(block.body) == example, f"{_page_id(page)}:{block.line}"


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", path.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_links_between_pages_resolve():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            file, _, anchor = target.partition("#")
            linked = (page.parent / file).resolve() if file else page
            assert linked.exists(), f"{_page_id(page)} links to {target}: no such file"
            if anchor:
                assert anchor in _anchors(linked), (
                    f"{_page_id(page)} links to {target}: no such heading"
                )


# --------------------------------------------------------------------------- examples


def _json_blocks(path: Path) -> list[str]:
    return [b.body for b in doc_commands.blocks(path) if b.lang == "json"]


def test_readme_request_is_the_example_file_and_its_plan_validates():
    (block,) = _json_blocks(ROOT / "README.md")
    example = ROOT / "examples" / "request.json"
    assert json.loads(block) == json.loads(example.read_text())
    request = parse_request(example.read_bytes())
    plan = parse_plan((ROOT / "examples" / "plan.json").read_bytes())
    assert validate_plan(request, plan) == []


def test_plan_format_example_is_a_sealed_plan():
    (block,) = _json_blocks(ROOT / "docs" / "plan-format.md")
    plan = parse_plan(block)
    assert plan.plan_id == plan_id_of(json.loads(block))
    assert plan.tables["ads"].shards[1].offsets == (3, 0)


LIMIT_CONSTANTS = (
    "MAX_WORLD_SIZE",
    "MAX_NUM_EMBEDDINGS",
    "MAX_EMBEDDING_DIM",
    "MAX_FEATURES_PER_TABLE",
    "MAX_POOLING_FACTOR",
    "MAX_BATCH_SIZE",
    "MAX_MEMORY_BYTES",
    "MIN_BANDWIDTH_BYTES_PER_S",
    "MAX_BANDWIDTH_BYTES_PER_S",
    "MAX_TIME_LIMIT_S",
    "MAX_SEED",
    "MAX_MOVE_COST_MS_PER_GIB",
    "MAX_MIN_PARTITION",
    "MAX_PLAN_BYTES",
    "MAX_JSON_DEPTH",
)


def _written(value: float) -> set[str]:
    """The ways the docs write a limit: 131,072, 2^40, 2^31 - 1, 10^6."""
    number = int(value)
    forms = {f"{number:,}"}
    for base, power in ((2, number), (2, number + 1), (10, number)):
        exponent = round(math.log(power, base))
        if base**exponent == power:
            forms.add(f"{base}^{exponent}" + (" - 1" if power != number else ""))
    return forms


def test_limits_table_states_the_constants():
    text = (ROOT / "docs" / "plan-format.md").read_text()
    section = text.split("\n## Limits\n", 1)[1].split("\n## ", 1)[0]
    for name in LIMIT_CONSTANTS:
        rows = [line for line in section.splitlines() if f"`{name}`" in line]
        assert rows, f"docs/plan-format.md Limits has no row for {name}"
        value = getattr(types, name)
        assert any(form in row for form in _written(value) for row in rows), (name, value)


# --------------------------------------------------------------------------- CI jobs

CI_PAGE = ROOT / "docs" / "ci.md"
GITHUB_WORKFLOW = ".github/workflows/capacity-check.yml"
GITLAB_CONFIG = ".gitlab-ci.yml"
CI_TIMEOUT_S = 60
# The request a pull request brings, what the job exits with, and the comment's heading.
CI_CASES = {
    "fits": (
        (ROOT / "examples" / "request.json").read_text(),
        0,
        "### ✅ `model/request.json` fits: 3 table(s) on 4 rank(s)",
    ),
    "does_not_fit": (
        doc_commands.file_block(CI_PAGE, "too-big.json"),
        3,
        "### ❌ `model/request.json` does not fit: no plan exists for 2 table(s) on 2 rank(s)",
    ),
    "bad_input": (
        '{"topology": {"world_size": 2}, "tables": [{"name": "a", "num_embeddings": 3, "embedding_dim": 0}]}',
        2,
        "### ❌ shardplan check: bad input",
    ),
}
# Stand-ins for what the CI services provide, on PATH before the real commands: GitHub's
# `gh` and PyPI's `pip`, each recording what the job asked of it. shardplan is the
# installed one; it runs for real.
STUBS = {
    "gh": """#!/bin/bash
printf '%s\\n' "$@" > "$STUB_RECORD/gh.args"
printf '%s\\n' "$GH_TOKEN" "$GH_REPO" > "$STUB_RECORD/gh.env"
while [ $# -gt 0 ]; do
  if [ "$1" = --body-file ]; then cp "$2" "$STUB_RECORD/gh.body"; fi
  shift
done
""",
    "pip": """#!/bin/bash
printf '%s\\n' "$@" > "$STUB_RECORD/pip.args"
""",
}


def _ci_workspace(tmp_path: Path, request_text: str) -> tuple[Path, Path, dict[str, str]]:
    """A checkout holding the pull request's ``model/request.json`` and the plan of today,
    the stand-ins, and the environment a job step starts from."""
    workspace = tmp_path / "workspace"
    (workspace / "model").mkdir(parents=True)
    (workspace / "model" / "request.json").write_text(request_text)
    # The plan of today: the example's (the request that fits is the example)
    shutil.copy(ROOT / "examples" / "plan.json", workspace / "model" / "plan.json")
    stubs, record = tmp_path / "stubs", tmp_path / "record"
    stubs.mkdir()
    record.mkdir()
    for name, script in STUBS.items():
        (stubs / name).write_text(script)
        (stubs / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(stubs), str(BIN), os.environ.get("PATH", "")]),
        "STUB_RECORD": str(record),
    }
    return workspace, record, env


def _pip_installed_shardplan(record: Path) -> None:
    """The job installed what getting-started.md installs from a git URL (and its test
    installs for real)."""
    expected = ["install", _git_requirement(INSTALL_PAGE)]
    assert (record / "pip.args").read_text().splitlines() == expected


@pytest.mark.slow  # runs the job's scripts as processes
@pytest.mark.timeout(CI_TIMEOUT_S * 3)
@pytest.mark.parametrize("case", list(CI_CASES))
def test_github_actions_job_runs_as_written(tmp_path, case):
    request_text, exit_code, heading = CI_CASES[case]
    workflow = yaml.safe_load(doc_commands.file_block(CI_PAGE, GITHUB_WORKFLOW))
    assert workflow[True] == "pull_request"  # YAML 1.1 reads the key `on` as true
    assert workflow["permissions"]["pull-requests"] == "write"
    context = {
        "github.token": "ghs_stand-in",
        "github.repository": "acme/model",
        "github.event.pull_request.number": "7",
    }
    steps = doc_commands.github_steps(workflow, "shardplan-check", context)
    workspace, record, env = _ci_workspace(tmp_path, request_text)
    code, printed = doc_commands.run_steps(
        steps, doc_commands.GITHUB_BASH, cwd=workspace, env=env, timeout=CI_TIMEOUT_S
    )
    assert code == exit_code, printed
    _pip_installed_shardplan(record)
    assert (record / "gh.args").read_text().splitlines() == [
        "pr",
        "comment",
        "7",
        "--body-file",
        "check.md",
    ]
    assert (record / "gh.env").read_text().splitlines() == ["ghs_stand-in", "acme/model"]
    _assert_comment((record / "gh.body").read_text(), case, heading)


@pytest.mark.slow  # runs the page's commands as processes
@pytest.mark.timeout(CI_TIMEOUT_S * 3)
@pytest.mark.parametrize("case", list(CI_CASES))
def test_gitlab_ci_job_runs_as_written(tmp_path, case):
    request_text, exit_code, heading = CI_CASES[case]
    config = yaml.safe_load(doc_commands.file_block(CI_PAGE, GITLAB_CONFIG))
    job = config["shardplan-check"]
    assert job["rules"] == [{"if": '$CI_PIPELINE_SOURCE == "merge_request_event"'}]
    step = doc_commands.gitlab_script(config, "shardplan-check")
    workspace, record, env = _ci_workspace(tmp_path, request_text)
    with _GitLabNotes() as gitlab:
        env |= {
            "CI_API_V4_URL": f"{gitlab.base}/api/v4",
            "CI_PROJECT_ID": "1234",
            "CI_MERGE_REQUEST_IID": "7",
            "CI_PIPELINE_SOURCE": "merge_request_event",
            "SHARDPLAN_NOTES_TOKEN": "glpat-stand-in",
        }
        code, printed = doc_commands.run_steps(
            [step], doc_commands.GITLAB_BASH, cwd=workspace, env=env, timeout=CI_TIMEOUT_S
        )
    assert code == exit_code, printed
    _pip_installed_shardplan(record)
    (note,) = gitlab.posted
    assert (note["path"], note["token"]) == (
        "/api/v4/projects/1234/merge_requests/7/notes",
        "glpat-stand-in",
    )
    _assert_comment(note["body"], case, heading)


def _assert_comment(body: str, case: str, heading: str) -> None:
    lines = body.splitlines()
    assert heading in lines[:2], body
    if case == "fits":
        assert lines[0] == "<!-- shardplan-check -->"
        assert "| HBM headroom | rank | free | used | usable |" in lines
        assert any(line.startswith("**Binding constraint:** perf: rank 2") for line in lines)
        assert any(line.startswith("| `--max-regression` | ✅ passed |") for line in lines)
    elif case == "does_not_fit":
        assert "- `world_size` 4 (same devices) fits" in lines
        assert any(line.startswith("| `--max-regression` | ❌ failed |") for line in lines)
        assert "- allow `fused_uvm_caching` for `users`: then the whole model fits" in lines
    else:
        assert (
            "model/request.json: tables[0].embedding_dim = 0: Input should be greater than "
            "or equal to 1"
        ) in lines


class _GitLabNotes:
    """A stand-in for GitLab's merge request notes API on loopback: it records each POST
    (path, token, the form's ``body``) and answers 201 as GitLab does."""

    def __enter__(self) -> _GitLabNotes:
        posted = self.posted = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the name http.server calls
                length = int(self.headers.get("Content-Length", "0"))
                form = urllib.parse.parse_qs(self.rfile.read(length).decode())
                posted.append(
                    {
                        "path": self.path,
                        "token": self.headers.get("PRIVATE-TOKEN"),
                        "body": form["body"][0],
                    }
                )
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"id": 1, "noteable_type": "MergeRequest"}')

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
