"""Plans for public workloads change only with the planner version (see tests/solve/golden.py)."""

from __future__ import annotations

import json

import pytest

from planner_service import PLANNER_VERSION
from tests.solve.golden import GOLDEN, WORKLOADS, plan_id

RECORDED = json.loads(GOLDEN.read_text())
FIX = "if the change is deliberate, bump `version` in pyproject.toml and run `make golden`"


def test_golden_plans_are_recorded_for_this_planner_version():
    assert RECORDED["planner_version"] == PLANNER_VERSION, (
        f"tests/solve/golden_plans.json was recorded by {RECORDED['planner_version']}; "
        f"this is {PLANNER_VERSION}: run `make golden`"
    )
    assert set(RECORDED["plans"]) == set(WORKLOADS)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_the_plan_of_a_public_workload_is_the_golden_one(name):
    assert plan_id(WORKLOADS[name]()) == RECORDED["plans"][name], (
        f"the plan for {name} changed under planner version {PLANNER_VERSION}: stored plans "
        f"are looked up by request and planner version, so {FIX}"
    )
