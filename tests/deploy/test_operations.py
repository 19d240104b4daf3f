"""The operations guide and the example alert rules stay true: every setting is in the
guide's table with the default and bounds the code has, every alert expression parses as
PromQL, and every metric the rules name is one a running service exports."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import annotated_types
import httpx
import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from clients.cli import serve
from planner_service.service.settings import ENV_PREFIX, Settings
from tests.support.servers import started_service

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "operations.md"
RULES = ROOT / "deploy" / "prometheus" / "alerts.yaml"
BIN = Path(sys.executable).parent

# Defaults computed when the service starts, and how the guide names them.
COMPUTED_DEFAULTS = {
    "api_tokens": ({}, "unset (no auth)"),
    "solve_workers": (max(1, os.cpu_count() or 1), "the number of CPUs"),
}
# Metrics Prometheus makes itself for every target, not exported by the service.
PROMETHEUS_OWN = {"up"}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
SEVERITIES = {"page", "ticket"}
# Labels whose values the requests in the test below all show (a healthy service has
# no 500 or 503 to show, and solves that overran or died are counted only then).
ROUTE_LABELS = {"route", "method"}


def _table(heading: str) -> dict[str, list[str]]:
    """The first table after ``## heading``: first column (without backticks) -> cells."""
    section = GUIDE.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    cells = [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows[2:]]
    return {row[0].strip("`"): row[1:] for row in cells}


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _as_variable(value: object) -> str:
    """A default as one would write it in the environment."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return _number(value) if isinstance(value, int | float) else str(value)


def _bounds(field) -> list[str]:
    found = []
    for item in field.metadata:
        if isinstance(item, annotated_types.Ge):
            found.append(f"≥ {_number(item.ge)}")
        if isinstance(item, annotated_types.Le):
            found.append(f"≤ {_number(item.le)}")
    return found


@pytest.fixture
def bare_environment(monkeypatch):
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)


def test_every_setting_is_in_the_guide_with_its_default_and_bounds(bare_environment):
    table = _table("Environment")
    computed = Settings()
    for name, field in Settings.model_fields.items():
        variable = ENV_PREFIX + name.upper()
        assert variable in table, f"docs/operations.md: {variable} is not in the table"
        default, accepted, _ = table[variable]
        if name in COMPUTED_DEFAULTS:
            value, words = COMPUTED_DEFAULTS[name]
            assert getattr(computed, name) == value, (variable, getattr(computed, name))
            assert default == words, (variable, default)
        else:
            assert field.default_factory is None, f"{variable}: add it to COMPUTED_DEFAULTS"
            assert default == f"`{_as_variable(field.default)}`", (variable, default)
        for bound in _bounds(field):
            assert bound in accepted, (variable, bound, accepted)
    # shardplan serve's own variables, standing in for its flags, with serve's defaults.
    serve_variables = {
        serve.HOST_VARIABLE: serve.DEFAULT_HOST,
        serve.PORT_VARIABLE: serve.DEFAULT_PORT,
        serve.WORKERS_VARIABLE: serve.DEFAULT_WORKERS,
    }
    for variable, value in serve_variables.items():
        assert table[variable][0] == f"`{value}`", (variable, table[variable][0])
    documented = {v for v in table if v.startswith(ENV_PREFIX)}
    fields = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    assert documented == fields | set(serve_variables), documented ^ fields
    assert "PROMETHEUS_MULTIPROC_DIR" in table


def test_the_guide_is_in_the_index():
    assert "(operations.md)" in (ROOT / "docs" / "README.md").read_text()


# --------------------------------------------------------------------------- alert rules


def _rules() -> list[dict]:
    document = yaml.safe_load(RULES.read_text())
    assert set(document) == {"groups"}, set(document)
    rules = []
    for group in document["groups"]:
        assert set(group) <= {"name", "interval", "rules"}, set(group)
        assert isinstance(group["name"], str) and group["rules"], group
        rules += group["rules"]
    return rules


def _selectors(expr: promql_parser.Expr) -> list[promql_parser.VectorSelector]:
    found: list[promql_parser.VectorSelector] = []

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(expr, visit)
    return found


def test_the_rules_file_is_a_valid_prometheus_rules_file():
    rules = _rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), names
    for rule in rules:
        where = rule["alert"]
        assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", where), where
        expr = promql_parser.parse(rule["expr"])  # raises ValueError naming the problem
        assert _selectors(expr), f"{where}: selects no metric"
        if "for" in rule:
            assert promql_parser.parse_duration(rule["for"]).total_seconds() > 0, where
        assert rule["labels"]["severity"] in SEVERITIES, where
        assert {"summary", "description"} <= set(rule["annotations"]), where
        for text in rule["annotations"].values():
            assert text.count("{{") == text.count("}}"), (where, text)


def test_the_parser_refuses_bad_promql():
    """The check above means something: the parser refuses what Prometheus would."""
    for bad in ("rate(shardplan_solve_rejected_total[5m]", "sum by (le (x)", "up{job=}"):
        with pytest.raises(ValueError):
            promql_parser.parse(bad)
    with pytest.raises(ValueError):
        promql_parser.parse_duration("5 minutes")


def _exported(text: str) -> set[str]:
    """Every series name /metrics can show: each family's samples, and the names its type
    gives it once it has any (a histogram's _bucket, _count and _sum)."""
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {sample.name for sample in family.samples}
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ())}
    return names


@pytest.mark.timeout(120)
def test_the_rules_use_metrics_the_service_exports(tmp_path):
    service = started_service(BIN / "shardplan", tmp_path, {})
    try:
        empty = httpx.get(f"{service.base}/metrics", timeout=30).text
        # One of each request the rules select on, so that their labels have values.
        request = (ROOT / "examples" / "request.json").read_bytes()
        posted = httpx.post(f"{service.base}/v1/plans", content=request, timeout=60)
        assert posted.status_code == 201, posted.text
        plan_id = posted.json()["plan_id"]
        assert httpx.get(f"{service.base}/v1/plans/{plan_id}", timeout=30).status_code == 200
        assert httpx.get(f"{service.base}/readyz", timeout=30).status_code == 200
        text = httpx.get(f"{service.base}/metrics", timeout=30).text
    finally:
        service.stop()
    exported = _exported(empty)
    assert "shardplan_solve_duration_seconds_count" in exported  # before any solve, too
    selectors = [
        selector
        for rule in _rules()
        for selector in _selectors(promql_parser.parse(rule["expr"]))
        if selector.name not in PROMETHEUS_OWN
    ]
    used = {selector.name for selector in selectors}
    assert used <= exported, used - exported
    labels = _label_values(text)
    for selector in selectors:
        for matcher in selector.matchers.matchers:
            seen = labels.get((selector.name, matcher.name))
            assert seen, f"{selector.name} has no label {matcher.name!r}"
            if matcher.op == promql_parser.MatchOp.Equal and matcher.name in ROUTE_LABELS:
                assert matcher.value in seen, (selector.name, matcher.name, matcher.value, seen)
    assert set(_table("Metrics and alerts")) == _families(text), "the guide's metrics table"


def _label_values(text: str) -> dict[tuple[str, str], set[str]]:
    """(series name, label) -> the values /metrics shows for it."""
    values: dict[tuple[str, str], set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for label, value in sample.labels.items():
                values.setdefault((sample.name, label), set()).add(value)
    return values


def _families(text: str) -> set[str]:
    """The service's own metrics, by the names the guide uses (a counter's with _total);
    the ``_created`` timestamps prometheus_client adds are left out."""
    return {
        family.name + ("_total" if family.type == "counter" else "")
        for family in text_string_to_metric_families(text)
        if family.name.startswith("shardplan_") and not family.name.endswith("_created")
    }
