"""The docs are real: their examples parse, hash and validate as documented, and every
command in them runs as written (the convention is in ``tests/doc_commands.py``)."""

from __future__ import annotations

import ast
import importlib
import json
import math
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from planner_service.plan import types
from planner_service.plan.codec import parse_plan, parse_request, plan_id_of
from planner_service.validate.validator import validate_plan
from tests import doc_commands
from tests.doc_commands import DOCUMENTED_HOST, Command
from tests.servers import Service

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
BIN = Path(sys.executable).parent

# Commands shown but not run, and why. Everything else in a console block runs.
NOT_RUN = {
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
    return [
        command
        for block in doc_commands.blocks(path)
        if block.lang == "console"
        for command in doc_commands.commands(block)
    ]


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


@pytest.mark.timeout(PAGE_TIMEOUT_S * 3)
@pytest.mark.parametrize("page", [p for p in PAGES if _page_commands(p)], ids=_page_id)
def test_page_commands_run_as_written(page, page_runs):
    page_commands, results = page_runs[page].result()
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
