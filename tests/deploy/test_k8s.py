"""The Kubernetes manifests in deploy/k8s/, checked without a cluster or a network.

Every document of every YAML file there is validated by ``kubernetes-validate`` (PyPI; it
bundles the Kubernetes OpenAPI schemas as JSON files, read offline) against the schemas of
``KUBERNETES_VERSION``, strict: a field the API does not know is refused. Then what no
schema says: the probes, the shutdown grace against the solve cap, that every variable set
is one the programs read, that the Job's command line parses, and that the kustomization
lists every file but the deliberate exceptions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from planner_service.plan.errors import InputError
from planner_service.service.settings import ENV_PREFIX, Settings
from runtime.startup import SERVER_ENV, TOKEN_ENV

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
# The oldest Kubernetes the manifests claim to work on (README.md): every API they use is
# GA there (autoscaling/v2 since 1.23, policy/v1 since 1.21).
KUBERNETES_VERSION = "1.31"
# Files under deploy/k8s/ kept out of kustomization.yaml on purpose, and why.
NOT_IN_KUSTOMIZATION = {
    "kustomization.yaml": "the kustomization itself",
    "training-job.yaml": "a one-off Job, applied by itself once the service is ready",
}
# Variables that are no SHARDPLAN_* setting and that the manifests may set.
OTHER_VARIABLES = {"OMP_NUM_THREADS"}  # docs/training.md "Run the example job"


def documents() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(K8S.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                yield path.name, document


def manifests() -> list[tuple[str, dict[str, Any]]]:
    return [(name, doc) for name, doc in documents() if doc["kind"] != "Kustomization"]


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        doc
        for _, doc in manifests()
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def pod_spec(kind: str) -> dict[str, Any]:
    spec: dict[str, Any] = one(kind)["spec"]["template"]["spec"]
    return spec


def config() -> dict[str, str]:
    data: dict[str, str] = one("ConfigMap", "shardplan-config")["data"]
    return data


def secret() -> dict[str, str]:
    data: dict[str, str] = one("Secret", "shardplan-secrets")["stringData"]
    return data


def service_settings(monkeypatch: pytest.MonkeyPatch, variables: dict[str, str]) -> Settings:
    """The settings a pod given exactly ``variables`` starts with."""
    for name in [name for name in os.environ if name.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    return Settings.from_env()


@pytest.mark.parametrize(
    ("name", "manifest"),
    manifests(),
    ids=[f"{name}:{doc['kind']}" for name, doc in manifests()],
)
def test_manifest_is_valid_kubernetes(name: str, manifest: dict[str, Any]) -> None:
    assert kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True) == (
        KUBERNETES_VERSION
    )


def test_validation_refuses_an_unknown_field() -> None:
    """Strict mode is on: a misspelt field is an error, not silently dropped by the API."""
    deployment = one("Deployment")
    container = dict(deployment["spec"]["template"]["spec"]["containers"][0])
    container["readinesProbe"] = container.pop("readinessProbe")
    broken = {
        **deployment,
        "spec": {
            **deployment["spec"],
            "template": {
                **deployment["spec"]["template"],
                "spec": {**deployment["spec"]["template"]["spec"], "containers": [container]},
            },
        },
    }
    with pytest.raises(kubernetes_validate.ValidationError, match="'readinesProbe' was unexpected"):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_file_but_the_exceptions() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed)), listed
    missing = [name for name in listed if not (K8S / name).is_file()]
    assert not missing, f"kustomization.yaml lists files that do not exist: {missing}"
    files = {path.name for path in K8S.glob("*.y*ml")}
    assert set(NOT_IN_KUSTOMIZATION) <= files, "an exception names a file that is gone"
    assert not set(listed) & set(NOT_IN_KUSTOMIZATION)
    assert files - set(NOT_IN_KUSTOMIZATION) == set(listed)
    # The Deployment, its Service and everything they need are applied together.
    kinds = {doc["kind"] for name, doc in manifests() if name in listed}
    expected = {"ConfigMap", "Secret", "Deployment", "Service", "HorizontalPodAutoscaler"}
    assert kinds == expected | {"PodDisruptionBudget"}


def test_probes_reach_the_health_routes_on_the_container_port() -> None:
    container = pod_spec("Deployment")["containers"][0]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    args = container["args"]
    assert ports["http"] == int(args[args.index("--port") + 1])
    assert args[args.index("--host") + 1] == "0.0.0.0"  # reachable from the kubelet
    probes = {kind: container[kind]["httpGet"] for kind in ("readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert probes["livenessProbe"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    for probe in [*probes.values(), container["startupProbe"]["httpGet"]]:
        port = probe["port"]
        assert ports.get(port, port) == ports["http"], probe
    service = one("Service")
    assert service["spec"]["ports"][0]["targetPort"] in ("http", ports["http"])
    assert service["spec"]["selector"].items() <= pod_labels("Deployment").items()


def pod_labels(kind: str) -> dict[str, str]:
    labels: dict[str, str] = one(kind)["spec"]["template"]["metadata"]["labels"]
    return labels


def test_selectors_match_the_pods() -> None:
    labels = pod_labels("Deployment")
    assert one("Deployment")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    target = one("HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", one("Deployment")["metadata"]["name"])


def test_shutdown_outlasts_the_longest_solve(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM may come just after a solve started: the pod must outlive its hard deadline
    (max time limit + grace, past which the service kills it) after the preStop sleep."""
    settings = service_settings(monkeypatch, config())
    spec = pod_spec("Deployment")
    pre_stop = spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    solve_cap = settings.max_time_limit_s + settings.solve_grace_s
    # The server itself waits that long for solves in flight before stopping its solvers...
    assert settings.shutdown_grace_s >= solve_cap
    # ...and the pod outlives that wait.
    assert spec["terminationGracePeriodSeconds"] > float(pre_stop[1]) + settings.shutdown_grace_s


def test_every_variable_set_is_one_the_programs_read(monkeypatch: pytest.MonkeyPatch) -> None:
    settings_variables = {ENV_PREFIX + field.upper() for field in Settings.model_fields}
    service = set(config()) | set(secret())
    for container in pod_spec("Deployment")["containers"]:
        service |= {variable["name"] for variable in container.get("env", [])}
        sources = {
            source.get("configMapRef", source.get("secretRef"))["name"]
            for source in container["envFrom"]
        }
        assert sources == {"shardplan-config", "shardplan-secrets"}
    unknown = service - settings_variables - OTHER_VARIABLES
    assert not unknown, f"not settings of planner_service/service/settings.py: {unknown}"
    # The ConfigMap's values are ones the service starts with.
    settings = service_settings(monkeypatch, config())
    assert settings.solve_workers == int(config()["SHARDPLAN_SOLVE_WORKERS"])
    # The training pod sets the client's variables (runtime/startup.py), not the service's.
    training = {
        variable["name"]
        for container in pod_spec("Job")["containers"]
        for variable in container.get("env", [])
    }
    assert not training - {SERVER_ENV, TOKEN_ENV} - OTHER_VARIABLES, training


def test_placeholder_tokens_stop_the_service_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """secret.yaml applied unedited must not serve with tokens published in this repo."""
    with pytest.raises(InputError) as raised:
        service_settings(monkeypatch, {**config(), **secret()})
    assert {problem.path for problem in raised.value.problems} == {"SHARDPLAN_API_TOKENS"}
    assert secret()["SHARDPLAN_DATABASE_URL"].startswith("postgresql://")


# Parses the Job's command as torchrun does, then its script's arguments with the
# example's own parser, in a fresh interpreter (train.py imports its folder's modules).
PARSE_JOB = """
import json, sys
from torch.distributed.run import get_args_parser
launch = get_args_parser().parse_args(sys.argv[1:])
sys.path.insert(0, "examples/dlrm")
import train
args = train.parser().parse_args(launch.training_script_args)
print(json.dumps({"script": launch.training_script, "standalone": launch.standalone,
                  "nproc_per_node": launch.nproc_per_node,
                  "train": {k: str(v) for k, v in vars(args).items()}}))
"""


def parse_job(arguments: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PARSE_JOB, *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_training_job_command_parses() -> None:
    container = pod_spec("Job")["containers"][0]
    command = container["command"]
    assert command[0] == "torchrun"
    # The training image holds the repository's examples/ at /app (the Dockerfile).
    assert container["workingDir"] == "/app"
    result = parse_job(command[1:])
    assert result.returncode == 0, result.stderr
    parsed = json.loads(result.stdout)
    assert (ROOT / parsed["script"]).is_file()
    assert parsed["standalone"] and parsed["nproc_per_node"] == "2"
    train = parsed["train"]
    assert train["plan"].startswith("alias:")
    assert float(train["deadline_s"]) > 0
    service = one("Service")
    assert (
        train["server"]
        == f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    )


def test_training_job_command_check_catches_a_bad_option() -> None:
    """The check above can fail: an option train.py does not take is exit 2."""
    command = [*pod_spec("Job")["containers"][0]["command"][1:], "--no-such-option"]
    result = parse_job(command)
    assert result.returncode == 2
    assert "--no-such-option" in result.stderr
