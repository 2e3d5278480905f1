"""Isolation floors: a `jobs:write` tenant cannot pick weaker isolation or unbounded resources.

The escalation of issue 32: a tenant chose `local` (or a sandbox on the node's network), its agent
reached PostgreSQL and Redis, and wrote itself an admin key. Under the production default
(`tenants/floors.py`) such a job is a 422 naming the setting to change; a job that leaves its
network and limits unset gets `proxy_only` and the default limits in its stored spec; an admin
key (the operator) is not bound. Then, through the real stack, a tenant's job under an allowed
policy (bwrap and docker, network left unset) runs an agent that cannot open PostgreSQL, Redis,
the API, the engine or the proxy's own port, and still gets its answer through the proxy.
"""

from __future__ import annotations

import secrets
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from security_support import make_key
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.client import Client
from polar_mq.config import Settings
from polar_mq.dispatch.submit import Enqueuer
from polar_mq.infra.db import create_db_engine, make_session_factory
from polar_mq.models import Job, Rollout
from polar_mq.models.artifact import RolloutArtifact
from polar_mq.runtimes import runtime_from_spec
from polar_mq.runtimes.bwrap import bwrap_available
from polar_mq.runtimes.docker import docker_available
from polar_mq.spec.model import RuntimeSpec
from polar_mq.stack.devstack import LocalStack
from polar_mq.tenants.floors import FloorViolation, floor_of
from polar_mq.ui.app import create_app
from tests.conftest import REDIS_URL, scratch_database
from tests.e2e.stack import fake_upstream_stack
from tests.security.reach_probe import REACH_PROBE
from tests.security.test_agent_isolation import OUTSIDE, node_address

COMMAND = {"type": "command", "command": "true"}
PRODUCTION = {
    "environment": "production",
    "secret_key": secrets.token_hex(32),
    "proxy_admin_token": secrets.token_hex(32),
    "pool": "floors",
    "unsafe_root_agents": False,  # the test environment's own setting: development only
}


def production_settings(database_url: str, **extra: Any) -> Settings:
    values: dict[str, Any] = {
        **PRODUCTION,
        "database_url": database_url,
        "broker_url": f"{REDIS_URL}/0",
        "queue_prefix": f"floors{uuid.uuid4().hex[:8]}",
        **extra,
    }
    return Settings.model_validate(values)


def job(runtime: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"tasks": [{"instruction": "x"}], "harness": COMMAND, "runtime": runtime, **extra}


@pytest.fixture(scope="module")
def api(security_db_url: str, factory: sessionmaker[Session]) -> Iterator[TestClient]:
    """The API in production mode with its default floor, on the security tests' database."""
    settings = production_settings(security_db_url)
    app = create_app(settings, session_factory=factory, publisher=lambda messages: None)
    with TestClient(app) as client:
        yield client


@pytest.fixture(scope="module")
def tenant(factory: sessionmaker[Session]) -> dict[str, str]:
    """A tenant's key that may submit jobs (`jobs:write`), nothing more."""
    key = make_key(factory, f"floor-{uuid.uuid4().hex[:6]}", "floor-team", "jobs:read,jobs:write")
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def operator(factory: sessionmaker[Session]) -> dict[str, str]:
    key = make_key(factory, f"floor-ops-{uuid.uuid4().hex[:6]}", "floor-ops", "admin")
    return {"Authorization": f"Bearer {key}"}


def jobs_of(factory: sessionmaker[Session], tenant: str) -> int:
    with factory() as session:
        return session.scalar(select(func.count()).where(Job.tenant == tenant)) or 0


def stored_runtime(factory: sessionmaker[Session], job_id: str) -> dict[str, Any]:
    with factory() as session:
        spec = session.scalar(select(Job.spec).where(Job.id == uuid.UUID(job_id)))
    assert spec is not None
    runtime: dict[str, Any] = spec["runtime"]
    return runtime


REFUSED = [
    ({"kind": "local"}, "POLAR_MQ_TENANT_RUNTIMES=bwrap,docker", "runtime.kind 'local'"),
    ({"kind": "bwrap", "network": "host"}, "POLAR_MQ_TENANT_NETWORKS=proxy_only", "'host'"),
    ({"kind": "bwrap", "network": "none"}, "POLAR_MQ_TENANT_NETWORKS=proxy_only", "'none'"),
    (
        {"kind": "docker", "image": "polar-mq-runtime:test", "network": "host"},
        "POLAR_MQ_TENANT_NETWORKS=proxy_only",
        "'host'",
    ),
    ({"kind": "bwrap", "pids": 1_000_000}, "POLAR_MQ_TENANT_MAX_PIDS=4096", "runtime.pids"),
    ({"kind": "bwrap", "memory_mb": 65_536}, "POLAR_MQ_TENANT_MAX_MEMORY_MB=32768", "memory_mb"),
    ({"kind": "bwrap", "cpu_seconds": 10**6}, "POLAR_MQ_TENANT_MAX_CPU_SECONDS", "cpu_seconds"),
    ({"kind": "bwrap", "max_open_files": 10**6}, "POLAR_MQ_TENANT_MAX_OPEN_FILES", "open_files"),
    ({"kind": "bwrap", "file_size_mb": 10**6}, "POLAR_MQ_TENANT_MAX_FILE_SIZE_MB", "file_size"),
]


@pytest.mark.parametrize(("runtime", "setting", "names"), REFUSED)
def test_a_tenant_below_the_production_floor_gets_a_422_naming_the_setting(
    api: TestClient,
    tenant: dict[str, str],
    factory: sessionmaker[Session],
    runtime: dict[str, Any],
    setting: str,
    names: str,
) -> None:
    before = jobs_of(factory, "floor-team")
    response = api.post("/v1/jobs", json=job(runtime), headers=tenant)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "isolation_floor", error
    assert setting in error["message"] and names in error["message"], error
    assert jobs_of(factory, "floor-team") == before  # nothing written


def test_absurd_limits_are_refused_for_everyone(
    api: TestClient, tenant: dict[str, str], operator: dict[str, str]
) -> None:
    """`memory_mb: 2**62` overflows any rlimit: a validation error even for the operator."""
    for headers in (tenant, operator):
        response = api.post(
            "/v1/jobs", json=job({"kind": "bwrap", "memory_mb": 2**62}), headers=headers
        )
        assert response.status_code == 422, response.text
        assert "runtime.memory_mb" in response.json()["error"]["message"]


def test_a_tenant_over_the_wall_clock_cap_is_refused(
    api: TestClient, tenant: dict[str, str]
) -> None:
    body = job({"kind": "bwrap"}, timeouts={"agent_s": 7200.0})
    response = api.post("/v1/jobs", json=body, headers=tenant)
    assert response.status_code == 422, response.text
    assert "POLAR_MQ_TENANT_MAX_AGENT_S=3600" in response.json()["error"]["message"]


@pytest.mark.parametrize("runtime", [{"kind": "bwrap"}, {"kind": "docker", "image": "img:1"}])
def test_a_tenant_job_without_network_or_limits_gets_proxy_only_and_the_defaults(
    api: TestClient, tenant: dict[str, str], factory: sessionmaker[Session], runtime: dict[str, Any]
) -> None:
    """The `command` harness used to default to the node's network (`host`) under bwrap."""
    response = api.post("/v1/jobs", json=job(runtime), headers=tenant)
    assert response.status_code == 201, response.text
    stored = stored_runtime(factory, response.json()["job_id"])
    assert stored["network"] == "proxy_only", stored
    limits = {k: stored.get(k) for k in ("memory_mb", "pids", "cpu_seconds", "max_open_files")}
    assert limits == {"memory_mb": 4096, "pids": 512, "cpu_seconds": 3600, "max_open_files": 4096}
    assert stored["file_size_mb"] == 2048
    # the tenant's own limits within the caps are kept
    body = job({**runtime, "pids": 64, "memory_mb": 1024, "network": "proxy_only"})
    response = api.post("/v1/jobs", json=body, headers=tenant)
    assert response.status_code == 201, response.text
    stored = stored_runtime(factory, response.json()["job_id"])
    assert (stored["pids"], stored["memory_mb"], stored["cpu_seconds"]) == (64, 1024, 3600)


def test_the_operator_is_not_bound_but_gets_the_defaults(
    api: TestClient, operator: dict[str, str], factory: sessionmaker[Session]
) -> None:
    response = api.post("/v1/jobs", json=job({"kind": "local"}), headers=operator)
    assert response.status_code == 201, response.text
    stored = stored_runtime(factory, response.json()["job_id"])
    assert stored["kind"] == "local" and stored["memory_mb"] == 4096, stored
    body = job({"kind": "bwrap", "pids": 100_000, "network": "host"})
    assert api.post("/v1/jobs", json=body, headers=operator).status_code == 201


def test_in_cluster_submissions_for_a_tenant_are_bound_too(security_db_url: str) -> None:
    settings = production_settings(security_db_url)
    bound = Enqueuer(settings, publisher=lambda messages: None, tenant="floor-enq")
    with bound, pytest.raises(FloorViolation, match="POLAR_MQ_TENANT_RUNTIMES"):
        bound.enqueue(job({"kind": "local"}))
    with Enqueuer(settings, publisher=lambda messages: None) as enqueuer:  # the admin tenant
        assert enqueuer.enqueue(job({"kind": "local"})).created


def test_development_stays_permissive_and_the_floor_is_configurable() -> None:
    development = floor_of(Settings(), bound=True)
    assert development.runtimes is None and development.networks is None
    assert development.caps.pids is None and development.defaults.memory_mb is None
    loose = floor_of(
        production_settings(
            "postgresql://u:p@127.0.0.1/x",
            tenant_runtimes="local,bwrap",
            tenant_networks="proxy_only,host",
            tenant_max_pids=0,
            runtime_default_memory_mb=0,
        ),
        bound=True,
    )
    assert loose.runtimes == ("local", "bwrap") and loose.networks == ("proxy_only", "host")
    assert loose.caps.pids is None and loose.defaults.memory_mb is None
    assert loose.caps.memory_mb == 32768  # the others keep the production values


# --------------------------------------------------------------------------------------------
# Through the real stack: the allowed policy holds

PROBE = REACH_PROBE


@pytest.fixture(scope="module")
def floors_db() -> Iterator[str]:
    """A database of its own: the tenant key turns authentication on for whoever shares it."""
    with scratch_database("polar_mq_floors") as url:
        yield url


@pytest.fixture(scope="module")
def floor_stack(floors_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """The real stack with the production floor's kinds and networks (the rest of production,
    e.g. passwords, is not what this checks)."""
    base = Path("/tmp") / f"pmq-floors-{uuid.uuid4().hex[:8]}"
    base.mkdir(mode=0o755)
    base.chmod(0o755)  # agents run as other users: they must enter the runtime root
    tmp = tmp_path_factory.mktemp("floors")
    try:
        with fake_upstream_stack(
            floors_db, tmp, runtime_root=base / "runtimes", tenant_runtimes=["bwrap", "docker"],
            tenant_networks=["proxy_only"],
        ) as stack:  # fmt: skip
            yield stack
    finally:
        shutil.rmtree(base, ignore_errors=True)


def service_targets(stack: LocalStack) -> list[str]:
    """PostgreSQL, Redis and the node's other services, on loopback and the node's address."""
    upstream = stack.settings.upstream_url.rsplit(":", 1)[1]
    ports = [5432, 6379, stack.settings.api_port, stack.settings.proxy_port, int(upstream)]
    hosts = ["127.0.0.1", *filter(None, [node_address()])]
    return [f"{host}/{port}" for host in hosts for port in ports]


@pytest.mark.e2e
@pytest.mark.timeout(420)
@pytest.mark.parametrize("kind", ["bwrap", "docker"])
def test_a_tenant_agent_under_the_floor_reaches_the_proxy_and_no_service(
    floor_stack: LocalStack, floors_db: str, kind: str
) -> None:
    reason = bwrap_available() if kind == "bwrap" else docker_available()
    if reason is not None:
        pytest.skip(reason)
    engine = create_db_engine(floors_db)
    factory = make_session_factory(engine)
    try:
        key = make_key(
            factory, f"probe-{uuid.uuid4().hex[:6]}", "probe-team", "jobs:read,jobs:write"
        )
        targets = [*service_targets(floor_stack), OUTSIDE]
        client = Client(f"http://127.0.0.1:{floor_stack.settings.api_port}", api_key=key)
        runtime: dict[str, Any] = {"kind": kind}  # no network: the floor picks proxy_only
        if kind == "docker":
            runtime["image"] = "polar-mq-runtime:test"
        probe = PROBE.format(targets=" ".join(targets))
        submitted = client.submit(
            [{"instruction": "probe the services"}],
            harness={"type": "command", "command": "sh probe.sh"},
            runtime={**runtime, "prepare": {"files": {"probe.sh": probe}}},
            timeouts={"agent_s": 120},
        )
        status = client.wait(str(submitted.job_id), progress=False, timeout=240)
        with factory() as session:
            rollout = session.scalars(
                select(Rollout).where(Rollout.job_id == submitted.job_id)
            ).one()
            log = session.scalar(
                select(RolloutArtifact.content).where(
                    RolloutArtifact.rollout_id == rollout.id, RolloutArtifact.name == "agent.log"
                )
            )
            stored = session.scalar(select(Job.spec).where(Job.id == submitted.job_id))
    finally:
        engine.dispose()
    text = (log or b"").decode(errors="replace")
    assert status["by_status"] == {"completed": 1}, (status, rollout.error, text)
    lines = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    for target in targets:
        assert lines[f"TCP_{target}"] == "refused", (target, text)
    assert lines["PROXY"] == "answered", text
    assert stored is not None and stored["runtime"]["network"] == "proxy_only", stored


# --------------------------------------------------------------------------------------------
# The disk cap: a per-file size limit every runtime enforces

WRITE = (
    "head -c 524288 /dev/zero > small; echo small=$?; "
    "head -c 3145728 /dev/zero > big; echo big=$?; echo size=$(wc -c < big)"
)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["local", "bwrap", "docker"])
def test_the_file_size_cap_is_enforced_by_the_runtime(kind: str) -> None:
    """`runtime.file_size_mb` (the floor's disk cap and default) reaches the runtime: a file
    past it is cut short and its writer fails, a smaller one is written whole."""
    reason = {"bwrap": bwrap_available, "docker": docker_available}.get(kind, lambda: None)()
    if reason is not None:
        pytest.skip(reason)
    options: dict[str, Any] = {"kind": kind, "file_size_mb": 1}
    if kind == "docker":
        options["image"] = "polar-mq-runtime:test"
    base = Path("/tmp") / f"pmq-fsize-{uuid.uuid4().hex[:8]}"
    base.mkdir(mode=0o755)
    base.chmod(0o755)
    runtime = runtime_from_spec(RuntimeSpec(**options), f"fsize-{kind}", base / "runtimes")
    try:
        runtime.start()
        result = runtime.exec(["bash", "-c", WRITE], timeout=60)
    finally:
        runtime.stop()
        shutil.rmtree(base, ignore_errors=True)
    out = dict(line.split("=", 1) for line in result.stdout_tail.splitlines() if "=" in line)
    assert out["small"] == "0", result
    assert out["big"] != "0" and int(out["size"]) <= 1024 * 1024, result


def test_a_resubmission_of_a_floored_job_is_the_same_job(
    api: TestClient, tenant: dict[str, str]
) -> None:
    """The floor's rewrite is deterministic: the same body and key name the stored job again."""
    body = job({"kind": "bwrap"}, idempotency_key=f"floor-{uuid.uuid4().hex}")
    first = api.post("/v1/jobs", json=body, headers=tenant)
    again = api.post("/v1/jobs", json=body, headers=tenant)
    assert (first.status_code, again.status_code) == (201, 200), again.text
    assert again.json()["job_id"] == first.json()["job_id"]
