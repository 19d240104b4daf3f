"""Packaging promises: the planner and clients import without torch; the runtime's pinned
torch/FBGEMM pair loads and runs a table-batched embedding lookup; a fresh install of
``shardplan[runtime]`` (a training worker's) has the runtime and the clients but neither
the solver nor the service stack, and its CLI says which extra a command needs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.installs import copy_distribution

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
INSTALL_TIMEOUT_S = 600


def test_planner_and_clients_import_without_torch():
    script = textwrap.dedent(
        """
        import importlib, pkgutil, sys
        sys.modules["torch"] = None  # any `import torch` now raises ImportError
        sys.modules["fbgemm_gpu"] = None
        import planner_service, clients
        names = []
        for package in (planner_service, clients):
            for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                importlib.import_module(info.name)
                names.append(info.name)
        print(len(names))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 8  # every module was imported, not just the packages


def test_fbgemm_tbe_lookup_matches_torch_embedding_bag():
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    assert torch.__version__.startswith("2.13.0")
    rows, dim = 10, 8
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
        optimizer=EmbOptimType.EXACT_SGD,
        pooling_mode=PoolingMode.SUM,
    )
    indices = torch.tensor([1, 2, 9, 0], dtype=torch.int64)
    offsets = torch.tensor([0, 3, 3, 4], dtype=torch.int64)  # bags [1,2,9], [], [0]
    pooled = tbe(indices, offsets)
    weights = tbe.split_embedding_weights()[0]
    expected = torch.nn.functional.embedding_bag(indices, weights, offsets[:-1], mode="sum")
    assert pooled.shape == (3, dim)
    torch.testing.assert_close(pooled, expected)
    assert torch.count_nonzero(pooled[1]) == 0


# --------------------------------------------------------------------------- installs per role


@dataclass(frozen=True)
class Venv:
    path: Path

    def run(self, *command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Runs a command of the venv from outside the source tree, which it must not see."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        return subprocess.run(
            [str(self.path / "bin" / command[0]), *command[1:]],
            cwd=self.path,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


@pytest.fixture(scope="module")
def runtime_venv(tmp_path_factory) -> Iterator[Venv]:
    """A fresh venv with ``pip install '.[runtime]'``, as a training image installs it, from
    a copy of the distribution's files (pip builds in the source folder, which must not get
    a build/ of its own). pip resolves as everywhere on this machine (its configuration finds
    torch's CPU wheel in a local folder); --no-compile skips byte-compiling torch's 2,300
    modules, of which a test imports a few. About 25 s with a warm pip cache, 30 s cold."""
    directory = tmp_path_factory.mktemp("runtime-install")
    source = copy_distribution(directory / "source")
    venv = directory / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile",
         f"{source}[runtime]"],
        capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout[-4000:] + install.stderr[-4000:]
    yield Venv(venv)
    shutil.rmtree(directory, ignore_errors=True)  # about 1 GiB of torch


@pytest.mark.timeout(INSTALL_TIMEOUT_S + 300)
def test_runtime_install_has_the_runtime_and_clients_but_no_solver_or_service(runtime_venv):
    script = textwrap.dedent(
        """
        import importlib.util, json
        import runtime, planner_service.plan, planner_service.costs, planner_service.validate
        import clients.cli
        from clients import PlannerClient, PlannerUnavailable  # the HTTP client works here
        try:
            PlannerClient("http://127.0.0.1:1", retries=0).get_plan("0" * 64)
        except PlannerUnavailable:
            pass
        extras = ("fastapi", "uvicorn", "ortools", "psycopg", "psycopg_pool", "pydantic_settings")
        print(json.dumps({
            "runtime": runtime.__file__,
            "installed": [name for name in extras if importlib.util.find_spec(name)],
        }))
        """
    )
    result = runtime_venv.run("python", "-c", script)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["installed"] == []
    assert Path(found["runtime"]).is_relative_to(runtime_venv.path)  # not this source tree


@pytest.mark.timeout(INSTALL_TIMEOUT_S + 300)
def test_runtime_install_cli_names_the_extra_a_command_needs(runtime_venv):
    request, plan = EXAMPLES / "request.json", EXAMPLES / "plan.json"
    planned = runtime_venv.run("shardplan", "plan", str(request))
    assert (planned.returncode, planned.stdout, planned.stderr) == (
        2,
        "",
        "shardplan plan: this install lacks the 'planner' extra (no module named 'ortools'): "
        "install shardplan with it, e.g. pip install './[planner]' in a "
        "checkout (docs/getting-started.md)\n",
    )
    served = runtime_venv.run("shardplan", "serve", "--port", "1")
    assert (served.returncode, served.stdout, served.stderr) == (
        2,
        "",
        "shardplan serve: this install lacks the 'service' extra (no module named 'uvicorn'): "
        "install shardplan with it, e.g. pip install './[service]' in a "
        "checkout (docs/getting-started.md)\n",
    )
    # The commands that need no extra work as usual.
    validated = runtime_venv.run("shardplan", "validate", str(request), str(plan))
    assert validated.returncode == 0, validated.stderr
    assert validated.stdout.startswith("valid: plan ")
    assert runtime_venv.run("shardplan", "options", str(request)).returncode == 0


@pytest.mark.timeout(INSTALL_TIMEOUT_S + 300)
def test_runtime_install_runs_the_example_job(runtime_venv, run_cli, tmp_path):
    """A worker's install is all the example training job needs: torchrun, the runtime and
    the client; its progress bar and results need no library beyond them."""
    example = str(EXAMPLES / "dlrm" / "train.py")
    options = ["--scale", "0.001", "--batch-size", "16"]
    printed = runtime_venv.run("python", example, "--print-request", *options)
    assert printed.returncode == 0, printed.stderr
    request, plan = tmp_path / "request.json", tmp_path / "plan.json"
    request.write_text(printed.stdout)
    assert run_cli("plan", request, "--output", plan).returncode == 0
    trained = runtime_venv.run(
        "torchrun", "--standalone", "--nproc-per-node", "2", example, "--plan", str(plan),
        "--steps", "3", *options, timeout=180,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert "trained 3 steps: loss " in trained.stdout
