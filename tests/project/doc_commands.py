"""Commands in the docs, read and run as written.

The convention (every page under ``docs/`` and ``README.md``):

- A fenced block marked ``console`` holds commands and what they print. A line starting
  with ``$ `` is a command (a line ending in ``\\`` continues it on the next line); the
  lines after it, up to the next command, are its output, stdout and stderr together as a
  terminal shows them.
- In shown output, ``<name>`` (lowercase, digits, ``_``) stands for any text on that line:
  ``<plan_id>``, ``<seconds>``. A line ``...`` stands for any number of lines. A command
  shown without output must print nothing.
- A command exits 0, unless it ends with the comment ``# exit N``.
- The CLI's progress lines (``planning: 2 s, ...``, printed every 2 s while a solve runs)
  depend on the machine's speed: where the shown output has none, those printed are left
  out before comparing.
- A fenced block right after the line ``<!-- file: NAME -->`` is a file the page's
  commands use: it is written to ``NAME`` before they run.

A page's commands run in order, in one bash session (variables carry over), in a fresh
directory holding a copy of ``examples/``. Commands that talk to ``localhost:8000`` get a
real ``shardplan serve`` of their own on a free port instead.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

DOCUMENTED_HOST = "localhost:8000"
PLACEHOLDER = re.compile(r"<[a-z][a-z0-9_]*>")
ANY_LINES = "..."
PROGRESS_LINE = re.compile(r"planning: \d+ s, ")
_BLOCK = re.compile(
    r"^(?:<!-- file: (?P<file>\S+) -->\n)?```(?P<lang>[\w-]*)\n(?P<body>.*?)^```$",
    flags=re.DOTALL | re.MULTILINE,
)
_EXIT = re.compile(r"\s#\s*exit\s+(\d+)\s*$")
_SENTINEL = "@@shardplan-doc-command@@"
TIMED_OUT = -1


@dataclass(frozen=True)
class Block:
    lang: str
    body: str
    line: int
    file: str | None


@dataclass
class Command:
    text: str
    line: int
    output: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        found = _EXIT.search(self.text)
        return int(found.group(1)) if found else 0

    @property
    def bare(self) -> str:
        """The command without a trailing ``# ...`` comment, as NOT_RUN lists it."""
        return re.sub(r"\s+#[^'\"]*$", "", self.text).strip()


@dataclass
class Result:
    command: Command
    exit_code: int
    output: str


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [
        Block(m["lang"], m["body"], text.count("\n", 0, m.start()) + 1, m["file"])
        for m in _BLOCK.finditer(text)
    ]


def commands(block: Block) -> list[Command]:
    """The commands of a ``console`` block, each with the output shown under it."""
    found: list[Command] = []
    lines = block.body.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            text, start = line[2:], i
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text += "\n" + lines[i]
            found.append(Command(text, block.line + 1 + start))
        elif found:
            found[-1].output.append(line.rstrip())
        else:
            raise ValueError(f"line {block.line + 1 + i}: output before any command: {line!r}")
        i += 1
    return found


def output_matches(expected: list[str], actual: str) -> bool:
    pattern = ""
    for line in (line.rstrip() for line in expected):
        if line == ANY_LINES:
            pattern += r"(?:[^\n]*\n)*?"
        else:
            parts = PLACEHOLDER.split(line)
            holes = [r"[^\n]+?"] * (len(parts) - 1) + [""]
            pattern += "".join(re.escape(p) + h for p, h in zip(parts, holes, strict=True))
            pattern += r"\n"
    lines = [line.rstrip() for line in actual.rstrip("\n").splitlines()]
    if not any(line.startswith("planning: ") for line in expected):
        lines = [line for line in lines if not PROGRESS_LINE.match(line)]
    text = "".join(line + "\n" for line in lines)
    return re.fullmatch(pattern, text) is not None


def run_page(
    page_commands: list[Command],
    files: dict[str, str],
    *,
    workdir: Path,
    examples: Path,
    bin_dir: Path,
    host: str | None,
    timeout: float,
    env: dict[str, str] | None = None,
) -> list[Result]:
    """Run the commands in one bash session in ``workdir``; ``host`` replaces
    ``localhost:8000``; ``env`` adds to the environment. Returns one result per command
    that ran (all, unless it timed out)."""

    def local(text: str) -> str:
        return text.replace(DOCUMENTED_HOST, host) if host else text

    shutil.copytree(examples, workdir / "examples")
    for name, content in files.items():
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text(local(content))
    script = ["exec 2>&1", "set -o pipefail"]
    for command in page_commands:
        script += [local(command.text), f"printf '\\n{_SENTINEL} %d\\n' \"$?\""]
    environment = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",  # stdout and stderr interleave as in a terminal
        **(env or {}),
    }
    _, stdout = run_bash(
        ["bash", "--noprofile", "--norc", "-c", "\n".join(script)],
        cwd=workdir,
        env=environment,
        timeout=timeout,
    )
    return _results(page_commands, stdout)


def run_bash(args: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run ``args`` to the end or the timeout: its exit code (``TIMED_OUT`` when killed)
    and its stdout and stderr together."""
    with subprocess.Popen(
        args,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a timeout kills whatever the commands started, too
    ) as process:
        try:
            stdout, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, _ = process.communicate()
    code = TIMED_OUT if process.returncode < 0 else process.returncode
    return code, stdout.decode(errors="replace")


def _results(page_commands: list[Command], stdout: str) -> list[Result]:
    """One result per command that finished; a command cut short by the timeout gets
    exit code -1 and what it printed so far."""
    chunks = re.split(rf"\n{_SENTINEL} (\d+)\n", stdout)
    finished = list(zip(chunks[0:-1:2], chunks[1::2], strict=True))
    results = [
        Result(command, int(code), output)
        for command, (output, code) in zip(page_commands, finished, strict=False)
    ]
    if len(results) < len(page_commands):
        results.append(Result(page_commands[len(results)], TIMED_OUT, chunks[-1]))
    return results


# --------------------------------------------------------------------------- CI jobs

# How the CI services run a job's script: GitHub's runner runs each step's `run:` script
# from a file with `bash --noprofile --norc -eo pipefail {0}` (the workflow's `shell:
# bash`); GitLab's runner runs all of a job's `script:` lines in one bash with `set -eo
# pipefail`.
GITHUB_BASH = ("bash", "--noprofile", "--norc", "-eo", "pipefail")
GITLAB_BASH = ("bash", "--noprofile", "--norc", "-eo", "pipefail")
_EXPRESSION = re.compile(r"\$\{\{\s*(.+?)\s*\}\}")


@dataclass(frozen=True)
class Step:
    """A script a CI job runs, with the variables its definition sets for it."""

    name: str
    script: str
    env: dict[str, str]


def file_block(path: Path, name: str) -> str:
    """The body of the block marked ``<!-- file: NAME -->`` on a page."""
    (body,) = [block.body for block in blocks(path) if block.file == name]
    return body


def github_steps(workflow: dict, job: str, context: dict[str, str]) -> list[Step]:
    """The ``run:`` steps of a GitHub Actions job, in order, each with its ``env:`` merged
    from the workflow's, the job's and its own, and ``${{ ... }}`` replaced from
    ``context`` (an expression not in it is an error: the test must say what GitHub would
    put there). ``uses:`` steps are left out: the test stands in for them. Steps that run
    only sometimes (``if:``) or elsewhere are refused rather than run wrongly."""
    shell = workflow.get("defaults", {}).get("run", {}).get("shell")
    if shell != "bash":
        raise ValueError(f"the workflow's defaults.run.shell is {shell!r}, not bash")
    spec = workflow["jobs"][job]
    steps = []
    for step in spec["steps"]:
        if "uses" in step:
            continue
        unsupported = {"if", "shell", "working-directory", "continue-on-error"} & set(step)
        if unsupported:
            raise ValueError(f"step {step.get('name')!r}: {sorted(unsupported)} not supported")
        env = {**workflow.get("env", {}), **spec.get("env", {}), **step.get("env", {})}
        steps.append(
            Step(
                step.get("name", step["run"]),
                github_expressions(step["run"], context),
                {name: github_expressions(str(value), context) for name, value in env.items()},
            )
        )
    return steps


def github_expressions(text: str, context: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        expression = match.group(1)
        if expression not in context:
            raise KeyError(f"${{{{ {expression} }}}} is not in the test's GitHub context")
        return context[expression]

    return _EXPRESSION.sub(value, text)


def gitlab_script(config: dict, job: str) -> Step:
    """A GitLab CI job's ``script:`` lines, as the one script the runner makes of them,
    with the job's ``variables:``."""
    spec = config[job]
    unsupported = {"before_script", "after_script", "default"} & (set(spec) | set(config))
    if unsupported:
        raise ValueError(f"job {job!r}: {sorted(unsupported)} not supported")
    variables = {name: str(value) for name, value in spec.get("variables", {}).items()}
    return Step(job, "\n".join(spec["script"]), variables)


def run_steps(
    steps: list[Step], shell: tuple[str, ...], *, cwd: Path, env: dict[str, str], timeout: float
) -> tuple[int, str]:
    """Run the steps in order, as the job would, stopping at the first that fails: the
    last exit code and everything the steps printed (stdout and stderr together)."""
    printed, code = "", 0
    for index, step in enumerate(steps):
        script = cwd.parent / f"step-{index}.sh"
        script.write_text(step.script)
        code, output = run_bash(
            [*shell, str(script)], cwd=cwd, env={**env, **step.env}, timeout=timeout
        )
        printed += output
        if code != 0:
            break
    return code, printed
