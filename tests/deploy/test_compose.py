"""docker/compose.yaml's `two-hosts` profile: two more worker nodes that could be two machines.

Compose itself checks it (`config`: the v2 plugin, or Debian's `docker-compose` 1.29 that
`scripts/docker_engine.sh` installs), and the structure is checked here too: the rules compose
itself and polar_mq's routing need."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.cli_usage import command_tree, unknown_usage

COMPOSE = Path(__file__).parents[2] / "docker" / "compose.yaml"
HOSTS = ("worker-host-a", "worker-host-b")
_VAR = re.compile(r"\$\{(\w+)(?::?[-?]([^}]*))?\}")


def _compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


def _resolved(value: object) -> str:
    """`${VAR:-default}` -> default (what compose uses with the variable unset)."""
    return _VAR.sub(lambda m: m.group(2) or "", str(value))


def _workers(services: dict[str, Any]) -> dict[str, Any]:
    return {name: s for name, s in services.items() if s.get("command", [None])[0] == "worker"}


def test_two_host_profile_adds_two_workers_of_their_own() -> None:
    services = _compose()["services"]
    for name in HOSTS:
        assert services[name]["profiles"] == ["two-hosts"]
    assert all("two-hosts" not in s.get("profiles", []) for n, s in services.items()
               if n not in HOSTS)  # fmt: skip
    workers = _workers(services)
    assert set(HOSTS) <= set(workers)
    nodes = [_resolved(w["environment"]["POLAR_MQ_NODE_NAME"]) for w in workers.values()]
    assert len(set(nodes)) == len(nodes), nodes  # run_agent/evaluate queues are per node
    ports = [_resolved(w["environment"]["POLAR_MQ_WORKER_METRICS_PORT"]) for w in workers.values()]
    assert len(set(ports)) == len(ports), ports  # one host network: one port per node


def test_workers_run_commands_that_exist_and_outlast_their_drain() -> None:
    root = command_tree()
    for name, worker in _workers(_compose()["services"]).items():
        words = [_resolved(w) for w in worker["command"]]
        assert unknown_usage(words, root) == [], name
        grace = int(_resolved(worker["stop_grace_period"]).removesuffix("s"))
        assert grace > int(_resolved(worker["environment"]["POLAR_MQ_DRAIN_TIMEOUT_S"])), name


def test_references_resolve() -> None:
    compose = _compose()
    services = compose["services"]
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, (name, dependency)
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in compose["volumes"], (name, source)


def test_database_and_broker_host_default_to_this_host() -> None:
    env = _compose()["x-polar-env"]
    assert "@127.0.0.1:" in _resolved(env["POLAR_MQ_DATABASE_URL"])
    assert _resolved(env["POLAR_MQ_BROKER_URL"]) == "redis://127.0.0.1:6379/0"


def _compose_command() -> list[str] | None:
    """The compose command here: the v2 plugin (`docker compose`), else `docker-compose`."""
    docker = shutil.which("docker")
    if docker is not None:
        done = subprocess.run([docker, "compose", "version"], capture_output=True, check=False)
        if done.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


COMPOSE_CMD = _compose_command()


@pytest.mark.skipif(COMPOSE_CMD is None, reason="needs docker compose (scripts/docker_engine.sh)")
def test_docker_compose_config_accepts_the_profile() -> None:
    env = {
        "POLAR_MQ_SECRET_KEY": "x" * 64,
        "POLAR_MQ_PROXY_ADMIN_TOKEN": "y" * 64,
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [*(COMPOSE_CMD or []), "-f", str(COMPOSE), "--profile", "two-hosts", "config", "--quiet"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
