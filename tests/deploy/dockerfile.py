"""Just enough of the Dockerfile format to run an image's install steps without a container
engine: stages (``FROM base AS name``, a stage inheriting its base stage's ``ENV`` and
``WORKDIR``), line continuations and comments, and the instructions our Dockerfile uses.
Anything else is refused, so that a Dockerfile this cannot read fails its test instead of
being half-run."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

KNOWN = {
    "ARG", "FROM", "ENV", "WORKDIR", "COPY", "RUN", "USER", "VOLUME", "EXPOSE", "HEALTHCHECK",
    "ENTRYPOINT", "CMD",
}  # fmt: skip


@dataclass
class Stage:
    name: str
    base: str
    env: dict[str, str] = field(default_factory=dict)  # inherited from a base stage too
    workdir: str = "/"
    runs: list[str] = field(default_factory=list)  # this stage's own RUN lines, shell form
    copies: list[list[str]] = field(default_factory=list)  # COPY arguments, flags included
    user: str = "root"
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)  # the CMD after HEALTHCHECK's options


def instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` per instruction, continuations joined, comments gone."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, arguments = (pending + line).partition(" ")
        pending = ""
        assert keyword.upper() in KNOWN, f"Dockerfile instruction not understood: {keyword}"
        result.append((keyword.upper(), arguments.strip()))
    assert not pending, "Dockerfile ends inside a continuation"
    return result


def stages(path: Path) -> dict[str, Stage]:
    found: dict[str, Stage] = {}
    stage: Stage | None = None
    for keyword, arguments in instructions(path.read_text()):
        if keyword == "ARG":
            continue
        if keyword == "FROM":
            base, as_, name = arguments.split()
            assert as_.upper() == "AS", arguments
            stage = Stage(name, base)
            if base in found:  # a stage built on another inherits what it set
                parent = found[base]
                stage.env, stage.workdir, stage.user = dict(parent.env), parent.workdir, parent.user
            found[name] = stage
            continue
        assert stage is not None, f"{keyword} before FROM"
        if keyword == "ENV":
            for pair in shlex.split(arguments):
                key, _, value = pair.partition("=")
                # $NAME set by an earlier ENV is expanded; others ($PATH) are the caller's.
                stage.env[key] = re.sub(r"\$(\w+)", partial(_expand, stage.env), value)
        elif keyword == "WORKDIR":
            stage.workdir = arguments
        elif keyword == "RUN":
            stage.runs.append(arguments)
        elif keyword == "COPY":
            stage.copies.append(shlex.split(arguments))
        elif keyword == "USER":
            stage.user = arguments
        elif keyword == "ENTRYPOINT":
            stage.entrypoint = json.loads(arguments)
        elif keyword == "CMD":
            stage.cmd = json.loads(arguments)
        elif keyword == "HEALTHCHECK":
            _, _, command = arguments.partition("CMD ")
            stage.healthcheck = json.loads(command)
    return found


def _expand(env: dict[str, str], match: re.Match[str]) -> str:
    return env.get(match[1], match[0])


def lineage(found: dict[str, Stage], name: str) -> list[Stage]:
    """The stage and the stages it is built on, base first."""
    chain = [found[name]]
    while chain[0].base in found:
        chain.insert(0, found[chain[0].base])
    return chain
