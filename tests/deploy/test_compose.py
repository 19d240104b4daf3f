"""deploy/compose.yaml, checked without a container engine: validated against the
compose-spec JSON schema (check-jsonschema's vendored copy, run by its own CLI), its wiring
read back, and its two replicas run as two ``shardplan serve`` processes on one real
PostgreSQL with the environment compose gives them: the image's ``ENV``, the example env
file, and the service's ``environment`` interpolated from that file. Only the database's
host and port are changed, to the test's PostgreSQL (which trusts loopback, so the
example password goes unchecked), and each replica's listening address, which compose
gives each container its own of."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from tests.deploy.dockerfile import stages
from tests.support.servers import Service, free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
ENV_EXAMPLE = DEPLOY / "shardplan.env.example"
CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


def env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines; blank lines and ``#`` comments skipped (compose's format, no
    quoting used in ours)."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"{path}: not KEY=VALUE: {line!r}"
            values[key.strip()] = value
    return values


def interpolate(text: str, variables: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}``."""

    def one(match: re.Match[str]) -> str:
        name, operator, argument = match[1], match[2], match[3]
        value = variables.get(name, "")
        if value:
            return value
        assert operator != ":?", f"compose would refuse: {argument}"
        return argument if operator == ":-" else ""

    return re.sub(r"\$\{(\w+)(?:(:[-?])([^}]*))?\}", one, text)


def check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


# --------------------------------------------------------------------------- schema and wiring


def test_compose_file_is_valid_against_the_compose_spec_schema():
    result = check_jsonschema(COMPOSE)
    assert (result.returncode, result.stdout.strip()) == (0, "ok -- validation done"), (
        result.stdout + result.stderr
    )


def test_the_schema_check_refuses_a_broken_compose_file(tmp_path):
    """The validator reads what we wrote: a misspelt condition fails it, naming the field."""
    broken = tmp_path / "compose.yaml"
    text = COMPOSE.read_text()
    assert "condition: service_healthy" in text
    broken.write_text(text.replace("condition: service_healthy", "condition: when_ready"))
    result = check_jsonschema(broken)
    assert result.returncode == 1
    assert "$.services.planner.depends_on.db.condition: 'when_ready' is not one of" in (
        result.stdout
    )


def test_compose_wires_two_replicas_to_postgres_with_tokens_from_an_env_file():
    spec = compose()
    planner, db = spec["services"]["planner"], spec["services"]["db"]
    assert planner["deploy"]["replicas"] == 2
    assert planner["build"]["target"] == "service"
    assert planner["depends_on"] == {"db": {"condition": "service_healthy"}}
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])
    volume, _, mount = db["volumes"][0].partition(":")
    assert (volume, mount) == ("pgdata", "/var/lib/postgresql/data")
    assert volume in spec["volumes"]  # a named volume, not a host folder
    assert planner["env_file"] == ["shardplan.env"]
    assert "SHARDPLAN_API_TOKENS" in env_file(ENV_EXAMPLE)
    # The URL's user and database are the ones the db service creates, with its password.
    example = env_file(ENV_EXAMPLE)
    url = urlsplit(interpolate(planner["environment"]["SHARDPLAN_DATABASE_URL"], example))
    db_env = {k: interpolate(v, example) for k, v in db["environment"].items()}
    assert (url.scheme, url.hostname, url.port) == ("postgresql", "db", 5432)
    assert (url.username, url.password) == (db_env["POSTGRES_USER"], db_env["POSTGRES_PASSWORD"])
    assert url.path == "/" + db_env["POSTGRES_DB"]
    # The real env file (secrets) is ignored by git; its template is not.
    ignored = subprocess.run(
        ["git", "check-ignore", "deploy/shardplan.env", "deploy/shardplan.env.example"],
        cwd=ROOT, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert ignored.stdout.split() == ["deploy/shardplan.env"]


def test_compose_refuses_to_start_without_the_database_password():
    """``${POSTGRES_PASSWORD:?...}``: compose stops with this message when it is unset."""
    url = compose()["services"]["planner"]["environment"]["SHARDPLAN_DATABASE_URL"]
    with pytest.raises(AssertionError, match="set POSTGRES_PASSWORD in shardplan.env"):
        interpolate(url, {})


# --------------------------------------------------------------------------- two replicas


def replica_environment(postgres_port: int) -> dict[str, str]:
    """What a planner container's process sees: the image's ENV, then env_file, then
    environment (compose's precedence), the database host and port moved to the test's."""
    service = compose()["services"]["planner"]
    image = {k: v for k, v in stages(ROOT / "Dockerfile")["service"].env.items() if k != "PATH"}
    example = env_file(ENV_EXAMPLE)
    environment = {k: interpolate(str(v), example) for k, v in service["environment"].items()}
    env = {**image, **example, **environment}
    assert "@db:5432/" in env["SHARDPLAN_DATABASE_URL"]
    env["SHARDPLAN_DATABASE_URL"] = env["SHARDPLAN_DATABASE_URL"].replace(
        "@db:5432/", f"@127.0.0.1:{postgres_port}/"
    )
    return env


def create_database(postgres, url: str) -> None:
    """What the db service's POSTGRES_DB does on its first start."""
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(postgres.url(), autocommit=True) as connection:
        if not connection.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [name]
        ).fetchone():
            connection.execute(f'CREATE DATABASE "{name}"')


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_replicas_as_compose_wires_them_share_plans_and_aliases(
    postgres, shardplan_exe, tmp_path
):
    env = replica_environment(postgres.port)
    create_database(postgres, env["SHARDPLAN_DATABASE_URL"])
    tokens = dict(entry.split(":", 1) for entry in env["SHARDPLAN_API_TOKENS"].split(","))
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDPLAN_")}
    replicas: list[Service] = []
    try:
        for index in range(compose()["services"]["planner"]["deploy"]["replicas"]):
            port = free_port()
            # Per container: its own address (loopback here), one solver per HTTP worker.
            own = {"SHARDPLAN_HOST": "127.0.0.1", "SHARDPLAN_PORT": str(port)}
            own["SHARDPLAN_SOLVE_WORKERS"] = "1"
            log = tmp_path / f"replica-{index}.log"
            with log.open("wb") as out:
                process = subprocess.Popen(
                    [str(shardplan_exe), "serve"], env={**base_env, **env, **own},
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
            service = Service(shardplan_exe, log, db="", port=port)
            service.process = process
            replicas.append(service)
            service.wait_healthy(timeout=90)
        one, other = replicas
        for service in replicas:
            assert httpx.get(f"{service.base}/readyz", timeout=10).status_code == 200
            assert "store postgresql://shardplan:***@127.0.0.1:" in service.log()

        ci = {"authorization": f"Bearer {tokens['ci']}"}
        trainer = {"authorization": f"Bearer {tokens['trainer']}"}
        body = (ROOT / "examples" / "request.json").read_bytes()
        with httpx.Client(timeout=120) as client:
            posted = client.post(f"{one.base}/v1/plans", content=body, headers=ci)
            assert posted.status_code == 201, posted.text
            plan_id = posted.headers["x-shardplan-plan-id"]
            fetched = client.get(f"{other.base}/v1/plans/{plan_id}")
            assert (fetched.status_code, fetched.content) == (200, posted.content)
            again = client.post(f"{other.base}/v1/plans", content=body, headers=ci)
            assert (again.status_code, again.headers["x-shardplan-plan-id"]) == (200, plan_id)

            alias = {"plan_id": plan_id, "comment": "compose replicas"}
            moved = client.put(f"{one.base}/v1/aliases/dlrm", json=alias, headers=trainer)
            assert moved.status_code == 201, moved.text
            through = client.get(f"{other.base}/v1/aliases/dlrm")
            assert (through.status_code, through.content) == (200, posted.content)
            assert through.headers["x-shardplan-plan-id"] == plan_id
            history = client.get(f"{other.base}/v1/aliases/dlrm/history").json()
            assert [change["actor"] for change in history["changes"]] == ["trainer"]
            # Both replicas hold the env file's tokens: no token, no write, on either.
            refused = client.put(f"{other.base}/v1/aliases/dlrm", json=alias)
            assert refused.status_code == 401
    finally:
        for service in replicas:
            service.stop()
