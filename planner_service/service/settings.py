"""Service settings, read from the environment once per process.

Every ``shardplan serve`` worker process reads the same variables (the CLI sets them from
its flags before starting uvicorn), so replicas and workers agree. A malformed value is an
``InputError`` naming the variable, the value and what is accepted.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from planner_service.plan.errors import FieldProblem, InputError

DEFAULT_DATABASE = "var/shardplan.db"
MAX_SOLVE_GRACE_S = 3600.0
# Not a setting: `shardplan serve --workers N` names its own pid here, so that each uvicorn
# worker process it supervises dies with it (main.py).
SUPERVISOR_PID_VARIABLE = "SHARDPLAN_SUPERVISOR_PID"


@dataclass(frozen=True)
class Settings:
    database_url: str = DEFAULT_DATABASE
    # name -> token; a bare token in SHARDPLAN_API_TOKENS is named by its hash prefix.
    api_tokens: Mapping[str, str] = field(default_factory=dict)
    protect_reads: bool = False
    max_body_bytes: int = 32 * 1024 * 1024
    max_tables: int = 100_000
    max_world_size: int = 65_536
    max_time_limit_s: float = 60.0
    solve_workers: int = max(1, (os.cpu_count() or 1))
    solve_queue: int = 8
    # A solve still running this long past its options.time_limit_s is killed (solving.py).
    solve_grace_s: float = 10.0
    cache_bytes: int = 256 * 1024 * 1024

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_tokens)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        problems: list[FieldProblem] = []

        def number(
            name: str, default: float, kind: type, minimum: float, maximum: float = math.inf
        ) -> float:
            text = env.get(name)
            if text is None or text == "":
                return default
            try:
                value = kind(text)
            except ValueError:
                problems.append(FieldProblem(name, f"must be a {kind.__name__}", text))
                return default
            if not math.isfinite(value):
                problems.append(FieldProblem(name, "must be a finite number", text))
                return default
            if value < minimum:
                problems.append(FieldProblem(name, f"must be at least {minimum}", text))
                return default
            if value > maximum:
                problems.append(FieldProblem(name, f"must be at most {maximum}", text))
                return default
            return value

        defaults = cls()
        settings = cls(
            database_url=env.get("SHARDPLAN_DATABASE_URL") or DEFAULT_DATABASE,
            api_tokens=_parse_tokens(env.get("SHARDPLAN_API_TOKENS", ""), problems),
            protect_reads=_parse_bool(env.get("SHARDPLAN_PROTECT_READS", ""), problems),
            max_body_bytes=int(
                number("SHARDPLAN_MAX_BODY_BYTES", defaults.max_body_bytes, int, 1024)
            ),
            max_tables=int(number("SHARDPLAN_MAX_TABLES", defaults.max_tables, int, 1)),
            max_world_size=int(number("SHARDPLAN_MAX_WORLD_SIZE", defaults.max_world_size, int, 1)),
            max_time_limit_s=number(
                "SHARDPLAN_MAX_TIME_LIMIT_S", defaults.max_time_limit_s, float, 0.0
            ),
            solve_workers=int(number("SHARDPLAN_SOLVE_WORKERS", defaults.solve_workers, int, 1)),
            solve_queue=int(number("SHARDPLAN_SOLVE_QUEUE", defaults.solve_queue, int, 0)),
            solve_grace_s=number(
                "SHARDPLAN_SOLVE_GRACE_S", defaults.solve_grace_s, float, 0.0, MAX_SOLVE_GRACE_S
            ),
            cache_bytes=int(number("SHARDPLAN_CACHE_BYTES", defaults.cache_bytes, int, 0)),
        )
        _check_reads_protected(settings, env, problems)
        if problems:
            raise InputError("environment", problems)
        return settings


def _check_reads_protected(
    settings: Settings, env: Mapping[str, str], problems: list[FieldProblem]
) -> None:
    """Reads protected by no token are open to all: refuse to start rather than serve them."""
    token_problem = any(problem.path == "SHARDPLAN_API_TOKENS" for problem in problems)
    if settings.protect_reads and not settings.auth_enabled and not token_problem:
        problems.append(
            FieldProblem(
                "SHARDPLAN_PROTECT_READS",
                "protects reads with the tokens in SHARDPLAN_API_TOKENS, which is empty: "
                "set SHARDPLAN_API_TOKENS, or unset SHARDPLAN_PROTECT_READS",
                env["SHARDPLAN_PROTECT_READS"],
            )
        )


def _parse_bool(text: str, problems: list[FieldProblem]) -> bool:
    lowered = text.strip().lower()
    if lowered in ("", "0", "false", "no", "off"):
        return False
    if lowered in ("1", "true", "yes", "on"):
        return True
    problems.append(
        FieldProblem("SHARDPLAN_PROTECT_READS", "must be 1/true/yes/on or 0/false/no/off", text)
    )
    return False


def _parse_tokens(text: str, problems: list[FieldProblem]) -> dict[str, str]:
    """``tok1,tok2`` or ``ci:tok1,trainer:tok2``; names show up in alias history."""
    tokens: dict[str, str] = {}
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        name, sep, token = entry.rpartition(":")
        if not sep:
            name, token = "", entry
        if len(token) < 16:
            problems.append(
                FieldProblem(
                    "SHARDPLAN_API_TOKENS",
                    "each token must be at least 16 characters (use e.g. `openssl rand -hex 32`)",
                    f"{token[:2]}…",
                )
            )
            continue
        name = name or "token-" + hashlib.sha256(token.encode()).hexdigest()[:8]
        tokens[name] = token
    return tokens
