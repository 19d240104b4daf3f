# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
DB ?= var/shardplan.db
PYTEST_ARGS ?=

.PHONY: run test test-fast lint examples golden clean system-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# One install per role (pyproject.toml's extras): the solver for `shardplan plan`, the
# service stack for `make run` (no torch), everything for the tests. A larger install
# stands in for the smaller ones.
$(VENV)/.installed-planner: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[planner]'
	touch $@

$(VENV)/.installed-service: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[service]'
	touch $@ $(VENV)/.installed-planner

$(VENV)/.installed-all: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.installed-service $(VENV)/.installed-planner

# PostgreSQL and Chromium from Debian, for the tests that run them (no-op when present).
system-deps:
	bash scripts/install-system-deps.sh

run: $(VENV)/.installed-service
	mkdir -p $(dir $(DB))
	$(BIN)/shardplan serve --host $(HOST) --port $(PORT) --db $(DB)

# Two lanes (scripts/test-lanes.sh): the suite on TEST_WORKERS processes, then the tests
# marked `alone` (they time what a user waits for) one at a time.
test: $(VENV)/.installed-all system-deps
	bash scripts/test-lanes.sh $(BIN)/python -- $(PYTEST_ARGS)

# The developer lane: everything but multi-process runs, fresh venvs, end-to-end jobs,
# PostgreSQL and Chromium (so it needs no system packages); about two minutes.
test-fast: $(VENV)/.installed-all
	bash scripts/test-lanes.sh $(BIN)/python "not slow and not postgres and not browser" -- $(PYTEST_ARGS)

lint: $(VENV)/.installed-all
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy planner_service clients runtime

# examples/plan.json is what `shardplan plan` makes for examples/request.json, indented.
# Run this whenever the planner's output changes: tests/clients/cli/test_commands.py checks it byte for byte.
examples: $(VENV)/.installed-planner
	$(BIN)/shardplan plan examples/request.json --output examples/plan.json.tmp > /dev/null
	$(BIN)/python -m json.tool --indent 2 --no-ensure-ascii examples/plan.json.tmp examples/plan.json
	rm examples/plan.json.tmp

# tests/solve/golden_plans.json: the plan ids of public workloads under this planner version.
# After a deliberate change to plans: bump `version` in pyproject.toml, then run this.
golden: $(VENV)/.installed-planner
	$(BIN)/python -m tests.solve.golden --write

clean:
	rm -rf $(VENV) .venv-torchrec var .pytest_cache .hypothesis .mypy_cache .ruff_cache
