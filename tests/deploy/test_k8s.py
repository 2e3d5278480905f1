"""The Kubernetes manifests (deploy/k8s/): schema-valid, and consistent with each other and with
the CLI. No cluster: `kubernetes-validate` ships the API schemas of each Kubernetes release."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.cli_usage import command_tree, unknown_usage

K8S = Path(__file__).parents[2] / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30.0"
"""The oldest release the manifests target (every field used exists since)."""
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}
SCRAPED = {"polar-mq-api", "polar-mq-proxy", "polar-mq-sweeper", "polar-mq-worker"}


def _kustomization() -> dict[str, Any]:
    return dict(yaml.safe_load((K8S / "kustomization.yaml").read_text()))


def _resources() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for name in _kustomization()["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _resources() if d["kind"] == kind}


def _pod_specs() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d["spec"]["template"] for d in _resources()
            if d["kind"] in WORKLOADS}  # fmt: skip


def test_kustomization_lists_every_manifest() -> None:
    listed = set(_kustomization()["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


def test_every_resource_is_valid_against_the_kubernetes_schema() -> None:
    resources = _resources()
    kinds = {d["kind"] for d in resources}
    assert kinds >= {"Deployment", "DaemonSet", "StatefulSet", "Service", "Secret", "ConfigMap"}
    for doc in resources:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_validator_refuses_a_wrong_manifest() -> None:
    """Strict validation catches a misspelt field and a wrong type (so the test above can fail)."""
    api = _by_kind("Deployment")["polar-mq-api"]
    misspelt = copy.deepcopy(api)
    misspelt["spec"]["template"]["spec"]["containers"][0]["envFom"] = []
    wrong_type = copy.deepcopy(api)
    wrong_type["spec"]["replicas"] = "two"
    for bad in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_containers_run_polar_mq_commands_that_exist() -> None:
    """The image's entrypoint is `polar-mq` (docker/Dockerfile): its args are a command line."""
    root = command_tree()
    checked = 0
    for name, template in _pod_specs().items():
        for container in template["spec"]["containers"]:
            if container["image"] != "polar-mq":
                continue
            assert "command" not in container, name  # keep the entrypoint
            assert unknown_usage([str(a) for a in container["args"]], root) == [], name
            checked += 1
    assert checked >= 6


def test_referenced_config_and_secrets_exist() -> None:
    config = _by_kind("ConfigMap")
    secrets = _by_kind("Secret")
    for name, template in _pod_specs().items():
        for container in template["spec"]["containers"]:
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in config, name
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets, name
    keys = set(secrets["polar-mq-secrets"]["stringData"])
    assert keys >= {"POLAR_MQ_SECRET_KEY", "POLAR_MQ_PROXY_ADMIN_TOKEN", "POLAR_MQ_DATABASE_URL",
                    "POLAR_MQ_BROKER_URL"}  # fmt: skip
    assert not keys & set(config["polar-mq-config"]["data"]), "a secret in the ConfigMap"


def test_prometheus_scrapes_every_polar_mq_process_on_a_port_it_serves() -> None:
    config = _by_kind("ConfigMap")["polar-mq-config"]["data"]
    metrics_ports = {
        "polar-mq-api": config["POLAR_MQ_API_PORT"],
        "polar-mq-proxy": config["POLAR_MQ_PROXY_PORT"],
        "polar-mq-sweeper": config["POLAR_MQ_SWEEPER_METRICS_PORT"],
        "polar-mq-worker": config["POLAR_MQ_WORKER_METRICS_PORT"],
    }
    specs = _pod_specs()
    assert set(specs) >= SCRAPED
    for name in SCRAPED:
        annotations = specs[name]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", name
        assert annotations["prometheus.io/port"] == metrics_ports[name], name
        ports = {str(p["containerPort"]) for c in specs[name]["spec"]["containers"]
                 for p in c.get("ports", [])}  # fmt: skip
        assert annotations["prometheus.io/port"] in ports, name


def test_services_select_a_workload() -> None:
    labels = [t["metadata"]["labels"] for t in _pod_specs().values()]
    for name, service in _by_kind("Service").items():
        selector = service["spec"]["selector"]
        assert any(selector.items() <= pod.items() for pod in labels), name


def test_the_proxy_lists_every_engine_of_the_statefulset() -> None:
    config = _by_kind("ConfigMap")["polar-mq-config"]["data"]
    engines = _by_kind("StatefulSet")["polar-mq-vllm"]
    service = engines["spec"]["serviceName"]
    port = engines["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    expected = [f"http://polar-mq-vllm-{i}.{service}:{port}"
                for i in range(engines["spec"]["replicas"])]  # fmt: skip
    assert config["POLAR_MQ_UPSTREAM_URLS"].split(",") == expected


def test_workers_drain_within_the_grace_period() -> None:
    """Kubernetes SIGKILLs a pod after its grace period: it must outlast the drain + warm stop."""
    config = _by_kind("ConfigMap")["polar-mq-config"]["data"]
    worker = _by_kind("DaemonSet")["polar-mq-worker"]["spec"]["template"]["spec"]
    assert worker["terminationGracePeriodSeconds"] > float(config["POLAR_MQ_DRAIN_TIMEOUT_S"]) + 10
    env = {e["name"]: e for e in worker["containers"][0]["env"]}
    assert env["POLAR_MQ_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
