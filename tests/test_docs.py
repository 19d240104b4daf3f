"""The documentation's examples are real: they parse, hash and validate as documented."""

from __future__ import annotations

import json
import re
from pathlib import Path

from planner_service.codec import parse_plan, parse_request, plan_id_of
from planner_service.validator import validate_plan

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
