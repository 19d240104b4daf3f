"""The container images, checked without a container engine: the Dockerfile's builder
stages are run as written (their ``COPY`` lines assemble the build folder, their ``RUN``
lines run under ``sh -c`` with the stage's ``ENV``), into a fresh venv, and the result is
started the way the image starts it (its ``ENV``, ``WORKDIR``, ``ENTRYPOINT``/``CMD`` and
``HEALTHCHECK``). The image's own folders are mapped to scratch folders: ``/opt/venv`` (the
venv, at one path in builder and image alike), ``/src`` and ``/app``. What is not checked
here: the base image, ``useradd`` and ownership, and the copy of the venv between stages
(deploy/README.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy.dockerfile import Stage, lineage, stages
from tests.support.servers import Service, free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
INSTALL_TIMEOUT_S = 900
STAGES = stages(DOCKERFILE)


@dataclass(frozen=True)
class Built:
    """A builder stage run here: its scratch root stands in for the image's ``/``."""

    root: Path

    def path(self, image_path: str) -> Path:
        return self.root / image_path.lstrip("/")

    def environment(self, stage: Stage) -> dict[str, str]:
        """The stage's ``ENV`` over this process's, image paths mapped to scratch ones."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        # `python` on PATH is this test's interpreter, as the base image's is its own.
        env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
        for key, value in stage.env.items():
            value = value.replace("$PATH", env["PATH"])
            for image_path in ("/opt/venv", "/src", "/app"):
                value = value.replace(image_path, str(self.path(image_path)))
            env[key] = value
        return env


def build(stage_name: str, root: Path) -> Built:
    """Runs ``stage_name`` and the stages it is built on: COPY from this checkout, then
    every RUN line as written."""
    built = Built(root)
    for stage in lineage(STAGES, stage_name):
        workdir = built.path(stage.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        for arguments in stage.copies:
            *sources, destination = arguments
            target = workdir / destination
            for source in sources:
                into = target / source if destination.endswith("/") else target
                if (ROOT / source).is_dir():
                    shutil.copytree(
                        ROOT / source, into, ignore=shutil.ignore_patterns("__pycache__")
                    )
                else:
                    into.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(ROOT / source, into)
        for line in stage.runs:
            ran = subprocess.run(
                ["sh", "-c", line], cwd=workdir, env=built.environment(stage),
                capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False,
            )  # fmt: skip
            assert ran.returncode == 0, f"RUN {line}\n{ran.stdout[-4000:]}{ran.stderr[-4000:]}"
    return built


def copied_venv(image: str, builder: str) -> str:
    """The image's ``COPY --from=builder`` source, which must be the builder's venv."""
    froms = [c for c in STAGES[image].copies if c[0] == f"--from={builder}"]
    assert len(froms) == 1, STAGES[image].copies
    _, source, destination = froms[0]
    assert source == destination == STAGES[builder].env["VIRTUAL_ENV"]
    return source


def run_in(built: Built, stage: Stage, *command: str, timeout: float = 120, **extra: str):
    return subprocess.run(
        list(command), cwd=built.path(stage.workdir), env={**built.environment(stage), **extra},
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


FIND_MODULES = (
    "import importlib.util, json, sys; "
    "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m)]))"
)


def installed(built: Built, stage: Stage, *modules: str) -> list[str]:
    found = run_in(built, stage, "python", "-c", FIND_MODULES, *modules)
    assert found.returncode == 0, found.stderr
    return list(json.loads(found.stdout))


def test_the_images_run_as_non_root_and_the_service_image_is_the_default():
    assert list(STAGES)[-1] == "service"  # `docker build .` with no --target
    for image in ("service", "training"):
        assert STAGES[image].user not in ("root", "0"), image
        assert STAGES[image].base == "${PYTHON_IMAGE}"
    assert "/healthz" in " ".join(STAGES["service"].healthcheck)
    assert STAGES["service"].entrypoint == ["shardplan", "serve"]
    assert STAGES["training"].entrypoint == ["torchrun"]
    # Configuration only through the environment: the entrypoint passes no flags.
    assert not STAGES["service"].cmd


# --------------------------------------------------------------------------- service image


@pytest.fixture(scope="module")
def service_image(tmp_path_factory) -> Iterator[Built]:
    built = build("service-build", tmp_path_factory.mktemp("service-image"))
    copied_venv("service", "service-build")
    built.path(STAGES["service"].workdir).mkdir(parents=True, exist_ok=True)
    built.path("/app/var").mkdir(parents=True, exist_ok=True)  # the image's volume
    yield built
    shutil.rmtree(built.root, ignore_errors=True)


@pytest.mark.timeout(INSTALL_TIMEOUT_S + 300)
def test_service_image_serves_and_passes_its_healthcheck(service_image):
    stage = STAGES["service"]
    port = free_port()
    # Loopback rather than the image's 0.0.0.0, one solver process on a shared machine.
    overrides = {"SHARDPLAN_HOST": "127.0.0.1", "SHARDPLAN_PORT": str(port)}
    overrides["SHARDPLAN_SOLVE_WORKERS"] = "1"
    env = {**service_image.environment(stage), **overrides}
    log = service_image.root / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*stage.entrypoint, *stage.cmd], cwd=service_image.path(stage.workdir), env=env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    service = Service(Path(stage.entrypoint[0]), log, db="", port=port)
    service.process = process
    try:
        service.wait_healthy(timeout=60)
        healthy = run_in(service_image, stage, *stage.healthcheck, **overrides)
        assert healthy.returncode == 0, healthy.stderr
        answer = run_in(
            service_image, stage, "python", "-c",
            f"import urllib.request; print(urllib.request.urlopen('{service.base}/readyz').status)",
        )  # fmt: skip
        assert answer.stdout == "200\n", answer.stderr
    finally:
        service.stop()
    text = log.read_text()
    assert "with 2 HTTP worker(s) x 1 solver process(es)" in text, text  # the image's ENV
    assert (service_image.path("/app/var") / "shardplan.db").is_file()  # under the volume
    # Down, the healthcheck fails: it checks something.
    unhealthy = run_in(service_image, stage, *stage.healthcheck, **overrides)
    assert unhealthy.returncode != 0


@pytest.mark.timeout(INSTALL_TIMEOUT_S + 300)
def test_service_image_has_the_service_stack_and_no_torch(service_image):
    stage = STAGES["service"]
    wanted = ("fastapi", "uvicorn", "ortools", "psycopg", "prometheus_client", "clients")
    unwanted = ("torch", "fbgemm_gpu", "pytest")
    assert installed(service_image, stage, *wanted, *unwanted) == list(wanted)
    # And the code is the venv's own copy, not this checkout's.
    where = run_in(service_image, stage, "python", "-c", "import clients; print(clients.__file__)")
    assert Path(where.stdout.strip()).is_relative_to(service_image.path("/opt/venv"))


# --------------------------------------------------------------------------- training image


@pytest.fixture(scope="module")
def training_image(tmp_path_factory) -> Iterator[Built]:
    built = build("training-build", tmp_path_factory.mktemp("training-image"))
    copied_venv("training", "training-build")
    stage = STAGES["training"]
    # The image's own COPY lines from this checkout (the venv's is checked above).
    for arguments in stage.copies:
        if not arguments[0].startswith("--from="):
            source, destination = arguments
            shutil.copytree(ROOT / source, built.path(destination))
    yield built
    shutil.rmtree(built.root, ignore_errors=True)  # about 1 GiB of torch


@pytest.mark.timeout(INSTALL_TIMEOUT_S + 300)
def test_training_image_has_the_runtime_and_no_service_stack(training_image):
    stage = STAGES["training"]
    wanted = ("torch", "fbgemm_gpu", "runtime", "clients")
    unwanted = ("fastapi", "uvicorn", "ortools", "psycopg")
    assert installed(training_image, stage, *wanted, *unwanted) == list(wanted)
    imported = run_in(training_image, stage, "python", "-c", "import runtime, fbgemm_gpu")
    assert imported.returncode == 0, imported.stderr


@pytest.mark.timeout(INSTALL_TIMEOUT_S + 300)
def test_training_image_default_command_runs_the_example_under_torchrun(training_image):
    stage = STAGES["training"]
    ran = run_in(training_image, stage, *stage.entrypoint, *stage.cmd, timeout=180)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "--plan" in ran.stdout and "--server" in ran.stdout  # train.py's own help
