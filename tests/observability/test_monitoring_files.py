"""The `monitoring` compose profile: the files it mounts exist, Prometheus scrapes the ports the
stack's services use, and the dashboard is valid Grafana JSON on the provisioned data source.

(That the dashboard names only metrics that exist is checked against real scrapes in
`test_metrics_e2e.py`.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

DOCKER = Path(__file__).parents[2] / "docker"


def _compose() -> dict[str, Any]:
    return dict(yaml.safe_load((DOCKER / "compose.yaml").read_text()))


def _default(value: str) -> str:
    """`${VAR:-9101}` -> `9101`."""
    match = re.fullmatch(r"\$\{\w+:-([^}]*)\}", value)
    assert match, value
    return match.group(1)


def test_the_monitoring_profile_mounts_files_that_exist() -> None:
    services = _compose()["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"]
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DOCKER / source).exists(), source
    for name in ("api", "proxy", "worker-cpu", "sweeper"):
        assert "monitoring" not in services[name].get("profiles", [])  # the stack runs without it


def test_prometheus_scrapes_every_process_on_its_default_port() -> None:
    compose = _compose()
    services = compose["services"]
    env = compose["x-polar-env"]
    ports = {
        _default(env["POLAR_MQ_API_PORT"]),
        _default(env["POLAR_MQ_PROXY_PORT"]),
        _default(services["worker-cpu"]["environment"]["POLAR_MQ_WORKER_METRICS_PORT"]),
        _default(services["worker-gpu"]["environment"]["POLAR_MQ_WORKER_METRICS_PORT"]),
        _default(services["sweeper"]["environment"]["POLAR_MQ_SWEEPER_METRICS_PORT"]),
    }
    config = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    targets = {
        target.rpartition(":")[2]
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    assert targets == ports


def test_the_dashboard_is_grafana_json_on_the_provisioned_data_source() -> None:
    dashboard = json.loads((DOCKER / "grafana" / "polar_mq.json").read_text())
    datasource = yaml.safe_load(
        (DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"][0]
    panels = dashboard["panels"]
    assert dashboard["uid"] and dashboard["title"]
    assert len({p["id"] for p in panels}) == len(panels)
    graphs = [p for p in panels if p["type"] != "row"]
    assert graphs and all(p["datasource"]["uid"] == datasource["uid"] for p in graphs)
    for panel in graphs:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
