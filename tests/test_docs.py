"""The documentation's examples are real: they parse, hash and validate as documented."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from planner_service.plan import types
from planner_service.plan.codec import parse_plan, parse_request, plan_id_of
from planner_service.validate.validator import validate_plan

ROOT = Path(__file__).resolve().parent.parent


def _json_blocks(path: Path) -> list[str]:
    return re.findall(r"```json\n(.*?)```", path.read_text(), flags=re.DOTALL)


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
