"""Service settings from the environment: the variables read, their defaults, what is
refused, and the message that says why."""

from __future__ import annotations

import hashlib
import os

import pytest

from planner_service.plan.errors import InputError
from planner_service.service.settings import DEFAULT_DATABASE, Settings

TOKEN = "0123456789abcdef0123"
MIB = 2**20


@pytest.fixture
def environ(monkeypatch):
    """Sets SHARDPLAN_* variables for one test, starting from none at all."""
    for name in list(os.environ):
        if name.startswith("SHARDPLAN_"):
            monkeypatch.delenv(name)

    def settings(**variables: str) -> Settings:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        return Settings.from_env()

    return settings


def refusal(environ, **variables: str) -> str:
    with pytest.raises(InputError) as refused:
        environ(**variables)
    return refused.value.render()


def test_defaults(environ):
    settings = environ()
    assert settings.database_url == DEFAULT_DATABASE == "var/shardplan.db"
    assert settings.api_tokens == {} and not settings.auth_enabled
    assert settings.protect_reads is False
    assert settings.max_body_bytes == 32 * MIB
    assert settings.max_tables == 100_000
    assert settings.max_world_size == 65_536
    assert settings.max_time_limit_s == 60.0
    assert settings.solve_workers == max(1, os.cpu_count() or 1)
    assert settings.solve_queue == 8
    assert settings.solve_grace_s == 10.0
    assert settings.cache_bytes == 256 * MIB


def test_every_variable_is_read(environ):
    settings = environ(
        SHARDPLAN_DATABASE_URL="postgresql://planner@db/plans",
        SHARDPLAN_API_TOKENS=f"ci:{TOKEN}",
        SHARDPLAN_PROTECT_READS="on",
        SHARDPLAN_MAX_BODY_BYTES="1024",
        SHARDPLAN_MAX_TABLES="7",
        SHARDPLAN_MAX_WORLD_SIZE="9",
        SHARDPLAN_MAX_TIME_LIMIT_S="0.5",
        SHARDPLAN_SOLVE_WORKERS="3",
        SHARDPLAN_SOLVE_QUEUE="0",
        SHARDPLAN_SOLVE_GRACE_S="3600",
        SHARDPLAN_CACHE_BYTES="0",
    )
    assert settings.database_url == "postgresql://planner@db/plans"
    assert settings.api_tokens == {"ci": TOKEN} and settings.protect_reads
    assert (settings.max_body_bytes, settings.max_tables, settings.max_world_size) == (1024, 7, 9)
    assert (settings.solve_workers, settings.solve_queue, settings.cache_bytes) == (3, 0, 0)
    assert (settings.max_time_limit_s, settings.solve_grace_s) == (0.5, 3600.0)
    assert isinstance(settings.max_tables, int) and isinstance(settings.solve_grace_s, float)


def test_empty_variables_mean_the_default(environ):
    settings = environ(
        SHARDPLAN_DATABASE_URL="", SHARDPLAN_MAX_TABLES="", SHARDPLAN_PROTECT_READS=""
    )
    assert (settings.database_url, settings.max_tables) == (DEFAULT_DATABASE, 100_000)
    assert settings.protect_reads is False


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("SHARDPLAN_MAX_TABLES", "many", "must be an integer"),
        ("SHARDPLAN_MAX_TABLES", "0", "must be at least 1"),
        ("SHARDPLAN_MAX_WORLD_SIZE", "0", "must be at least 1"),
        ("SHARDPLAN_MAX_BODY_BYTES", "1023", "must be at least 1024"),
        ("SHARDPLAN_SOLVE_WORKERS", "0", "must be at least 1"),
        ("SHARDPLAN_SOLVE_QUEUE", "-1", "must be at least 0"),
        ("SHARDPLAN_CACHE_BYTES", "-1", "must be at least 0"),
        ("SHARDPLAN_MAX_TIME_LIMIT_S", "soon", "must be a float"),
        ("SHARDPLAN_MAX_TIME_LIMIT_S", "-0.5", "must be at least 0.0"),
        ("SHARDPLAN_MAX_TIME_LIMIT_S", "inf", "must be a finite number"),
        ("SHARDPLAN_SOLVE_GRACE_S", "nan", "must be a finite number"),
        ("SHARDPLAN_SOLVE_GRACE_S", "3600.5", "must be at most 3600.0"),
        ("SHARDPLAN_PROTECT_READS", "maybe", "must be 1/true/yes/on or 0/false/no/off"),
    ],
)
def test_a_bad_value_names_the_variable_the_value_and_what_is_accepted(
    environ, name, value, message
):
    assert refusal(environ, **{name: value}) == f"environment: {name} = {value!r}: {message}"


@pytest.mark.parametrize("text", ["1", "true", " Yes ", "ON"])
def test_protect_reads_spellings(environ, text):
    assert environ(SHARDPLAN_PROTECT_READS=text, SHARDPLAN_API_TOKENS=TOKEN).protect_reads


@pytest.mark.parametrize("text", ["0", "false", "No", " off "])
def test_protect_reads_off_spellings(environ, text):
    assert environ(SHARDPLAN_PROTECT_READS=text).protect_reads is False


def test_every_problem_is_reported_at_once(environ):
    assert refusal(
        environ,
        SHARDPLAN_MAX_TABLES="x",
        SHARDPLAN_SOLVE_QUEUE="-2",
        SHARDPLAN_SOLVE_GRACE_S="1e9",
    ) == (
        "environment: SHARDPLAN_MAX_TABLES = 'x': must be an integer\n"
        "environment: SHARDPLAN_SOLVE_QUEUE = '-2': must be at least 0\n"
        "environment: SHARDPLAN_SOLVE_GRACE_S = '1e9': must be at most 3600.0"
    )


def test_tokens_named_and_bare(environ):
    bare = "f" * 16
    settings = environ(SHARDPLAN_API_TOKENS=f" ci:{TOKEN} ,, {bare} ,trainer:a:{TOKEN}")
    bare_name = "token-" + hashlib.sha256(bare.encode()).hexdigest()[:8]
    assert settings.api_tokens == {"ci": TOKEN, bare_name: bare, "trainer:a": TOKEN}
    assert settings.auth_enabled


def test_a_short_token_is_refused_without_showing_it(environ):
    message = refusal(environ, SHARDPLAN_API_TOKENS=f"ci:{TOKEN},trainer:secret")
    assert message == (
        "environment: SHARDPLAN_API_TOKENS = 'se…': each token must be at least 16 characters "
        "(use e.g. `openssl rand -hex 32`)"
    )
    assert "secret" not in message


def test_protect_reads_needs_tokens(environ):
    assert refusal(environ, SHARDPLAN_PROTECT_READS="1") == (
        "environment: SHARDPLAN_PROTECT_READS = '1': protects reads with the tokens in "
        "SHARDPLAN_API_TOKENS, which is empty: set SHARDPLAN_API_TOKENS, or unset "
        "SHARDPLAN_PROTECT_READS"
    )


def test_protect_reads_with_tokens(environ):
    settings = environ(SHARDPLAN_PROTECT_READS="yes", SHARDPLAN_API_TOKENS=f"ci:{TOKEN}")
    assert settings.protect_reads and settings.api_tokens == {"ci": TOKEN}


def test_protect_reads_with_a_bad_token_names_the_token_only(environ):
    with pytest.raises(InputError) as refused:
        environ(SHARDPLAN_PROTECT_READS="1", SHARDPLAN_API_TOKENS="short")
    assert [problem.path for problem in refused.value.problems] == ["SHARDPLAN_API_TOKENS"]


def test_settings_are_values(environ):
    settings = environ()
    with pytest.raises((AttributeError, TypeError, ValueError)):
        settings.max_tables = 1  # type: ignore[misc]
