"""Schemathesis against the service's own /openapi.json: generated requests for every
operation, bounded in number; no 5xx, and every response matches the documented status
codes, content types and schemas."""

from __future__ import annotations

from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support.servers import Service

# Slow lane: its subject is processes (started, killed, signalled) or multi-process runs.
pytestmark = pytest.mark.slow

EXAMPLES_PER_OPERATION = 50
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture(scope="module")
def fuzz_service(shardplan_exe, tmp_path_factory):
    directory = tmp_path_factory.mktemp("fuzz")
    env = {
        # Small limits keep generated "valid" requests cheap to solve.
        "SHARDPLAN_MAX_TIME_LIMIT_S": "10",
        "SHARDPLAN_MAX_TABLES": "8",
        "SHARDPLAN_MAX_WORLD_SIZE": "16",
        "SHARDPLAN_SOLVE_WORKERS": "2",
    }
    server = Service(shardplan_exe, directory / "log", db=str(directory / "p.db"), env=env)
    yield server.start()
    server.stop()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_api_conforms_to_its_schema(fuzz_service, mode):
    schema = schemathesis.openapi.from_url(f"{fuzz_service.base}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 11
    statuses: Counter[tuple[str, int]] = Counter()
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and not (operation.body or operation.path_parameters):
            continue  # nothing to get wrong in GET /healthz

        strategy = operation.as_strategy(generation_mode=mode)
        if mode is GenerationMode.POSITIVE:  # the documented examples too
            strategy = st.one_of(strategy, *operation.get_strategies_from_examples())

        @given(case=strategy)
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def run(case):
            response = case.call_and_validate(checks=CHECKS)
            statuses[(case.operation.label, response.status_code)] += 1

        run()
    print(sorted(statuses.items()))
    # The fuzzer reached the solver and the store, not only the validation layer.
    if mode is GenerationMode.POSITIVE:
        assert statuses[("POST /v1/plans", 201)] + statuses[("POST /v1/plans", 200)] > 0
    assert sum(statuses.values()) >= EXAMPLES_PER_OPERATION
