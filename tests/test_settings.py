"""Service settings from the environment: what is refused, and the message that says why."""

from __future__ import annotations

import pytest

from planner_service.plan.errors import InputError
from planner_service.service.settings import Settings

TOKEN = "0123456789abcdef0123"


def test_protect_reads_needs_tokens():
    with pytest.raises(InputError) as refused:
        Settings.from_env({"SHARDPLAN_PROTECT_READS": "1"})
    assert refused.value.render() == (
        "environment: SHARDPLAN_PROTECT_READS = '1': protects reads with the tokens in "
        "SHARDPLAN_API_TOKENS, which is empty: set SHARDPLAN_API_TOKENS, or unset "
        "SHARDPLAN_PROTECT_READS"
    )


def test_protect_reads_with_tokens():
    settings = Settings.from_env(
        {"SHARDPLAN_PROTECT_READS": "yes", "SHARDPLAN_API_TOKENS": f"ci:{TOKEN}"}
    )
    assert settings.protect_reads and settings.api_tokens == {"ci": TOKEN}


def test_protect_reads_with_a_bad_token_names_the_token_only():
    with pytest.raises(InputError) as refused:
        Settings.from_env({"SHARDPLAN_PROTECT_READS": "1", "SHARDPLAN_API_TOKENS": "short"})
    assert [problem.path for problem in refused.value.problems] == ["SHARDPLAN_API_TOKENS"]
