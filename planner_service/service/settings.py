"""Service settings, read from ``SHARDPLAN_*`` environment variables once per process.

Every ``shardplan serve`` worker process reads the same variables (the CLI sets them from
its flags before starting uvicorn), so replicas and workers agree. ``Settings.from_env``
turns every malformed value into one ``InputError`` naming the variable, the value and
what is accepted.
"""

from __future__ import annotations

import hashlib
import os
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails, PydanticCustomError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from planner_service.plan.errors import FieldProblem, InputError
from planner_service.plan.text import identifier_problem

DEFAULT_DATABASE = "var/shardplan.db"
MAX_SOLVE_GRACE_S = 3600.0
# The range SHARDPLAN_MAX_HEADER_BYTES and SHARDPLAN_MAX_REQUEST_HEAD_BYTES accept: a bearer
# token and a few ordinary headers fit in the least; the most is what one connection may hold.
MIN_HEADER_BYTES = 1024
MAX_HEAD_BYTES = 1024 * 1024
ENV_PREFIX = "SHARDPLAN_"
# Not a setting: `shardplan serve --workers N` names its own pid here, so that each uvicorn
# worker process it supervises dies with it (state.py).
SUPERVISOR_PID_VARIABLE = "SHARDPLAN_SUPERVISOR_PID"
MIN_TOKEN_CHARS = 16
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
_FLAG_WORDS = "/".join(TRUE_WORDS) + " or " + "/".join(FALSE_WORDS)
_SHORT_TOKENS = (
    f"each token must be at least {MIN_TOKEN_CHARS} characters (use e.g. `openssl rand -hex 32`)"
)


def _flag(value: Any) -> Any:
    """Only the words people write in an environment; pydantic alone also takes t, y, f, n."""
    if not isinstance(value, str):
        return value
    lowered = value.strip().lower()
    if lowered in TRUE_WORDS or lowered in FALSE_WORDS:
        return lowered in TRUE_WORDS
    raise PydanticCustomError("flag", "must be {words}", {"words": _FLAG_WORDS})


def _tokens(value: Any) -> Any:
    """``tok1,tok2`` or ``ci:tok1,trainer:tok2``; names show up in alias history, and a bare
    token is named by its hash prefix."""
    if not isinstance(value, str):
        return value
    tokens: dict[str, str] = {}
    short: list[str] = []
    for entry in (part.strip() for part in value.split(",")):
        if not entry:
            continue
        name, _, token = entry.rpartition(":")
        if len(token) < MIN_TOKEN_CHARS:
            short.append(f"{token[:2]}…")  # never the token itself
            continue
        problem = identifier_problem(name) if name else None
        if problem is not None:  # the name is stored as the actor of alias changes
            raise PydanticCustomError(
                "token_name", "token name {name!r} {problem}", {"name": name, "problem": problem}
            )
        tokens[name or "token-" + hashlib.sha256(token.encode()).hexdigest()[:8]] = token
    if short:
        raise PydanticCustomError("short_tokens", _SHORT_TOKENS, {"shown": short})
    return tokens


Flag = Annotated[bool, BeforeValidator(_flag)]
Tokens = Annotated[dict[str, str], NoDecode, BeforeValidator(_tokens)]


class Settings(BaseSettings):
    """One service process's settings; each field is read from ``SHARDPLAN_<FIELD>``, and an
    empty variable means the default."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True, frozen=True)

    database_url: str = DEFAULT_DATABASE
    # name -> token; kept out of repr, so that logging the settings shows no token
    api_tokens: Tokens = Field(default_factory=dict, repr=False)
    protect_reads: Flag = False
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    # One header field (name and value), and the request line with every header: past
    # either, `shardplan serve` answers 431 before the request reaches the app (http/heads.py).
    max_header_bytes: int = Field(8 * 1024, ge=MIN_HEADER_BYTES, le=MAX_HEAD_BYTES)
    max_request_head_bytes: int = Field(32 * 1024, ge=MIN_HEADER_BYTES, le=MAX_HEAD_BYTES)
    max_tables: int = Field(100_000, ge=1)
    max_world_size: int = Field(65_536, ge=1)
    max_time_limit_s: float = Field(60.0, ge=0.0, allow_inf_nan=False)
    solve_workers: int = Field(default_factory=lambda: max(1, os.cpu_count() or 1), ge=1)
    solve_queue: int = Field(8, ge=0)
    # A solve still running this long past its options.time_limit_s is killed (solver/pool.py).
    solve_grace_s: float = Field(10.0, ge=0.0, le=MAX_SOLVE_GRACE_S, allow_inf_nan=False)
    cache_bytes: int = Field(256 * 1024 * 1024, ge=0)
    # How long a stopping server waits for requests in flight (uvicorn's graceful shutdown)
    # before it stops its solver processes; at least max_time_limit_s + solve_grace_s lets
    # every admitted solve finish.
    shutdown_grace_s: float = Field(10.0, ge=0.0, le=MAX_SOLVE_GRACE_S, allow_inf_nan=False)
    # An async solve's job whose process has not renewed its lease for this long is taken
    # over by another service process (solver/jobs.py); renewed every third of it.
    job_lease_s: float = Field(15.0, ge=0.5, le=MAX_SOLVE_GRACE_S, allow_inf_nan=False)
    # Async jobs accepted while no solver process had room: they wait in the store (every
    # replica sharing it together) until one has; beyond this many, 503 (solver/jobs.py).
    job_queue: int = Field(100, ge=0)
    # Server-sent event streams (GET /v1/solves/{id}/events) open at once per HTTP worker.
    max_event_streams: int = Field(100, ge=1)
    # One line per request on stdout (uvicorn's access log); `shardplan serve --access-log`.
    access_log: Flag = False

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_tokens)

    @model_validator(mode="after")
    def _reads_need_tokens(self) -> Settings:
        """Reads protected by no token are open to all: refuse to start rather than serve them."""
        if self.protect_reads and not self.auth_enabled:
            raise PydanticCustomError(
                "unprotected_reads",
                "protects reads with the tokens in {tokens}, which is empty: set {tokens}, "
                "or unset {flag}",
                {"tokens": _variable("api_tokens"), "flag": _variable("protect_reads")},
            )
        return self

    @model_validator(mode="after")
    def _header_fits_head(self) -> Settings:
        """A header the per-header limit lets through must fit in the whole head."""
        if self.max_header_bytes > self.max_request_head_bytes:
            raise PydanticCustomError(
                "header_over_head",
                "is {header} bytes, more than {head} ({head_variable}): one header must fit "
                "in the request head",
                {
                    "header": self.max_header_bytes,
                    "head": self.max_request_head_bytes,
                    "head_variable": _variable("max_request_head_bytes"),
                },
            )
        return self

    @classmethod
    def from_env(cls) -> Settings:
        try:
            return cls()
        except ValidationError as error:
            raise InputError("environment", _problems(error)) from None


def _variable(field: str) -> str:
    return ENV_PREFIX + field.upper()


_MESSAGES = {
    "int_parsing": "must be an integer",
    "float_parsing": "must be a float",
    "finite_number": "must be a finite number",
    "greater_than_equal": "must be at least {ge}",
    "less_than_equal": "must be at most {le}",
}


def _problems(error: ValidationError) -> list[FieldProblem]:
    """One problem per bad variable, in field order, in our words rather than pydantic's."""
    problems: list[FieldProblem] = []
    for details in error.errors():
        if details["type"] == "unprotected_reads":
            value = details["input"]["protect_reads"]  # the variable's text
            problems.append(FieldProblem(_variable("protect_reads"), details["msg"], value))
        elif details["type"] == "header_over_head":
            value = details["ctx"]["header"]
            problems.append(FieldProblem(_variable("max_header_bytes"), details["msg"], value))
        else:
            problems += _field_problems(details)
    return problems


def _field_problems(details: ErrorDetails) -> list[FieldProblem]:
    variable = _variable(str(details["loc"][0]))
    ctx = details.get("ctx", {})
    if details["type"] == "short_tokens":
        return [FieldProblem(variable, details["msg"], shown) for shown in ctx["shown"]]
    template = _MESSAGES.get(details["type"])
    message = details["msg"] if template is None else template.format(**ctx)
    return [FieldProblem(variable, message, details["input"])]
