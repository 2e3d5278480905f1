"""A hostile agent under each runtime, through the real stack: what it can and cannot reach.

Real processes throughout: the workers (root on this machine, with the secret key, the database
URL and the proxy's address in their environment), the proxy, the API and the agent, a `command`
harness running a probe script. The probe tries what the issue lists: who it runs as, the workers'
`/proc/<pid>/environ`, another rollout's workspace (and whether it can list the other runtimes'
ids), the checkout, and TCP connections to
PostgreSQL, Redis, the proxy's own port (on loopback and on the node's own address) and an outside
address; then it calls the proxy the way an agent does (`$OPENAI_BASE_URL`, with curl, or with the
image's Python where there is no curl). Each result is one `NAME=outcome` line of the agent's log.

What each runtime guarantees (docs/hardening.md): every runtime runs the agent as an
unprivileged user that cannot read a root worker's environment; `local` hides the checkout (a
planted secret in it too) in a private mount view where the node allows it; `bwrap` also hides the
node's processes, the other workspaces and the checkout, and `docker` likewise (its container);
with `network: proxy_only` both reach the proxy and nothing else. `local` has the node's network.
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import psutil
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.processes import group_members
from polar_mq.models import LlmCall, Rollout
from polar_mq.models.artifact import RolloutArtifact
from polar_mq.runtimes import LocalRuntime, private_view
from polar_mq.runtimes.bwrap import bwrap_available
from polar_mq.runtimes.docker import docker_available
from polar_mq.stack.devstack import LocalStack
from tests.e2e.stack import client_of, fake_upstream_stack
from tests.security.reach_probe import REACH_PROBE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

CHECKOUT = Path(__file__).resolve().parents[2]
SECRET_FILE = "secret.txt"
OUTSIDE = "1.1.1.1/80"
PROBE = (
    """\
echo "UID=$(id -u)"
for pid in {pids}; do
  if cat /proc/$pid/environ >/dev/null 2>&1; then echo "ENVIRON_$pid=read"
  else echo "ENVIRON_$pid=refused"; fi
done
if cat {victim}/{secret} 2>/dev/null; then echo "VICTIM=read"; else echo "VICTIM=refused"; fi
if ls {root} 2>/dev/null | grep -q {victim_id}; then echo "LIST_ROOT=read"
else echo "LIST_ROOT=refused"; fi
if cat {checkout}/pyproject.toml >/dev/null 2>&1; then echo "CHECKOUT=read"
else echo "CHECKOUT=refused"; fi
if cat {checkout}/{planted} >/dev/null 2>&1; then echo "CHECKOUT_SECRET=read"
else echo "CHECKOUT_SECRET=refused"; fi
"""
    + REACH_PROBE.replace(
        "{targets}", "127.0.0.1/5432 127.0.0.1/6379 127.0.0.1/{proxy_port} {node_targets} {outside}"
    )
    + 'echo "BASE=$OPENAI_BASE_URL"\n'
)


def node_address() -> str | None:
    """The node's first non-loopback IPv4 address (PostgreSQL or Redis may listen there)."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return str(address.address)
    return None


def node_targets(stack: LocalStack) -> list[str]:
    """PostgreSQL, Redis and the proxy on the node's own address (`host/port`), if it has one."""
    address = node_address()
    ports = (5432, 6379, stack.settings.proxy_port)
    return [f"{address}/{port}" for port in ports] if address else []


@pytest.fixture(scope="module")
def runtime_root() -> Iterator[Path]:
    """A runtime root every user may enter (pytest's own temporary root is private, 0700)."""
    base = Path("/tmp") / f"pmq-isolation-{uuid.uuid4().hex[:8]}"
    base.mkdir(mode=0o755)
    base.chmod(0o755)
    yield base / "runtimes"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(
    pg_url: str, tmp_path_factory: pytest.TempPathFactory, runtime_root: Path
) -> Iterator[LocalStack]:
    tmp = tmp_path_factory.mktemp("agent-isolation")
    with fake_upstream_stack(pg_url, tmp, runtime_root=runtime_root) as running:
        yield running


@pytest.fixture(scope="module")
def victim(runtime_root: Path) -> Iterator[Path]:
    """Another rollout's workspace on the same node, holding a secret."""
    other = LocalRuntime(f"victim-{uuid.uuid4().hex[:8]}", runtime_root)
    other.start()
    other.upload(b"the other rollout's secret", SECRET_FILE)
    yield other.workdir
    other.stop()


@pytest.fixture(scope="module")
def planted() -> Iterator[str]:
    """A world-readable secret in the checkout the workers run from (say, an operator's .env)."""
    name = f".pmq-planted-{uuid.uuid4().hex[:8]}.env"
    path = CHECKOUT / name
    path.write_text("POLAR_MQ_SECRET_KEY=planted\n")
    path.chmod(0o644)
    yield name
    path.unlink(missing_ok=True)


def worker_pids(stack: LocalStack) -> list[int]:
    """Every process of the stack: supervisors, Celery workers, proxy, API, fake engine."""
    pids: set[int] = set()
    for proc in stack.processes:
        pids.update(group_members(proc.pid))
    return sorted(pids)


def run_probe(
    stack: LocalStack,
    db: sessionmaker[Session],
    victim: Path,
    runtime: Mapping[str, object],
    planted: str = "pyproject.toml",
) -> tuple[dict[str, str], str, int]:
    """Run the probe as one rollout; return its `NAME=outcome` lines, its log and its calls."""
    probe = PROBE.format(
        pids=" ".join(map(str, worker_pids(stack))),
        victim=victim,
        victim_id=victim.parent.name,
        secret=SECRET_FILE,
        root=stack.settings.runtime_root,
        checkout=CHECKOUT,
        planted=planted,
        proxy_port=stack.settings.proxy_port,
        node_targets=" ".join(node_targets(stack)),
        outside=OUTSIDE,
    )
    client = client_of(stack)
    job = client.submit(
        [{"instruction": "probe the sandbox"}],
        harness={"type": "command", "command": "sh probe.sh"},
        runtime={**runtime, "prepare": {"files": {"probe.sh": probe}}},
        timeouts={"agent_s": 120},
    )
    status = client.wait(str(job.job_id), progress=False, timeout=240)
    with db() as session:
        rollout = session.scalars(select(Rollout).where(Rollout.job_id == job.job_id)).one()
        log = session.scalars(
            select(RolloutArtifact.content).where(
                RolloutArtifact.rollout_id == rollout.id, RolloutArtifact.name == "agent.log"
            )
        ).first()
        calls = session.scalar(
            select(func.count()).select_from(LlmCall).where(LlmCall.rollout_id == rollout.id)
        )
    assert status["by_status"] == {"completed": 1}, (status, rollout.error, log)
    text = (log or b"").decode(errors="replace")
    lines = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return lines, text, int(calls or 0)


def assert_never_root_nor_worker_environ(lines: dict[str, str], log: str, secret: str) -> None:
    assert lines["UID"] != "0", log
    environ = {k: v for k, v in lines.items() if k.startswith("ENVIRON_")}
    assert len(environ) > 5 and set(environ.values()) == {"refused"}, log
    assert secret not in log


def test_local_agent_is_unprivileged_and_cannot_read_the_workers(
    stack: LocalStack, db_session_factory: sessionmaker[Session], victim: Path, planted: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the workers are not root here: agents keep the worker's user by design")
    lines, log, calls = run_probe(stack, db_session_factory, victim, {"kind": "local"}, planted)
    assert_never_root_nor_worker_environ(lines, log, stack.settings.secret_key)
    assert lines["LIST_ROOT"] == "refused", log  # other runtimes' ids are not listed
    # another rollout's workspace: a different pool user, 0700 (runtimes/agent_pool.py)
    assert lines["VICTIM"] == "refused", log
    # the checkout the workers run from, its planted secret included: covered in the agent's
    # private mount view (runtimes/private_view.py), where the node allows one
    if private_view.unavailable_reason() is None:
        assert lines["CHECKOUT"] == "refused" and lines["CHECKOUT_SECRET"] == "refused", log
    else:
        assert lines["CHECKOUT_SECRET"] == "read", log  # what the startup warning says
    assert lines["PROXY"] == "answered" and calls == 1, log


def test_local_reference_agent_runs_in_its_private_view(
    stack: LocalStack, db_session_factory: sessionmaker[Session]
) -> None:
    """The agent's own work still runs: the reference agent, started with the worker's interpreter
    (below root's 0700 home on some nodes, kept in the view), completes as a pool user."""
    if os.geteuid() != 0 or private_view.unavailable_reason() is not None:
        pytest.skip("no private view here (the worker is not root, or no mount namespaces)")
    client = client_of(stack)
    job = client.submit(
        [{"instruction": "What is 6*7?", "answer": "42"}],
        harness={"type": "reference"},
        evaluator="exact_match",
        runtime={"kind": "local"},
        timeouts={"agent_s": 120},
    )
    status = client.wait(str(job.job_id), progress=False, timeout=240)
    with db_session_factory() as session:
        rollout = session.scalars(select(Rollout).where(Rollout.job_id == job.job_id)).one()
        calls = session.scalar(
            select(func.count()).select_from(LlmCall).where(LlmCall.rollout_id == rollout.id)
        )
    assert status["by_status"] == {"completed": 1}, (status, rollout.error)
    assert rollout.reward is not None and (calls or 0) >= 1, (rollout.error, calls)


def test_bwrap_proxy_only_agent_reaches_the_proxy_and_nothing_else(
    stack: LocalStack, db_session_factory: sessionmaker[Session], victim: Path
) -> None:
    reason = bwrap_available()
    if reason is not None:
        pytest.skip(reason)
    runtime = {"kind": "bwrap", "network": "proxy_only"}
    lines, log, calls = run_probe(stack, db_session_factory, victim, runtime)
    assert_never_root_nor_worker_environ(lines, log, stack.settings.secret_key)
    for name in ("VICTIM", "LIST_ROOT", "CHECKOUT"):
        assert lines[name] == "refused", (name, log)
    ports = ("127.0.0.1/5432", "127.0.0.1/6379", f"127.0.0.1/{stack.settings.proxy_port}")
    for target in (*ports, OUTSIDE):
        assert lines[f"TCP_{target}"] == "refused", (target, log)
    # ... while the proxy answers through the in-sandbox forwarder, and the call is logged
    assert lines["BASE"].startswith("http://127.0.0.1:8010/"), log
    assert lines["PROXY"] == "answered" and calls == 1, log


def test_bwrap_host_network_still_reaches_the_node(
    stack: LocalStack, db_session_factory: sessionmaker[Session], victim: Path
) -> None:
    """The control: the same probe finds PostgreSQL open without the policy (the test can fail)."""
    reason = bwrap_available()
    if reason is not None:
        pytest.skip(reason)
    lines, log, _ = run_probe(stack, db_session_factory, victim, {"kind": "bwrap"})
    assert lines["TCP_127.0.0.1/5432"] == "open", log
    assert lines["UID"] != "0" and lines["VICTIM"] == "refused", log


def test_docker_agent_is_unprivileged(
    stack: LocalStack, db_session_factory: sessionmaker[Session], victim: Path
) -> None:
    reason = docker_available()
    if reason is not None:
        pytest.skip(reason)
    runtime = {"kind": "docker", "image": "polar-mq-runtime:test"}
    lines, log, _ = run_probe(stack, db_session_factory, victim, runtime)
    assert_never_root_nor_worker_environ(lines, log, stack.settings.secret_key)
    assert lines["VICTIM"] == "refused" and lines["CHECKOUT"] == "refused", log
    # the control for the docker case below: the node's network reaches PostgreSQL
    assert lines["TCP_127.0.0.1/5432"] == "open", log


def test_docker_proxy_only_agent_reaches_the_proxy_and_nothing_else(
    stack: LocalStack, db_session_factory: sessionmaker[Session], victim: Path
) -> None:
    reason = docker_available()
    if reason is not None:
        pytest.skip(reason)
    runtime = {"kind": "docker", "image": "polar-mq-runtime:test", "network": "proxy_only"}
    lines, log, calls = run_probe(stack, db_session_factory, victim, runtime)
    assert_never_root_nor_worker_environ(lines, log, stack.settings.secret_key)
    for name in ("VICTIM", "LIST_ROOT", "CHECKOUT"):
        assert lines[name] == "refused", (name, log)
    ports = ("127.0.0.1/5432", "127.0.0.1/6379", f"127.0.0.1/{stack.settings.proxy_port}")
    targets = (*ports, *node_targets(stack), OUTSIDE)
    for target in targets:
        assert lines[f"TCP_{target}"] == "refused", (target, log)
    assert len([k for k in lines if k.startswith("TCP_")]) == len(targets), log
    # ... while the proxy answers through the in-container forwarder, and the call is logged
    assert lines["BASE"].startswith("http://127.0.0.1:8010/"), log
    assert lines["PROXY"] == "answered" and calls == 1, log


def test_proxy_only_is_refused_where_it_cannot_be_enforced(stack: LocalStack) -> None:
    body = {
        "tasks": [{"instruction": "x"}],
        "harness": {"type": "command", "command": "true"},
        "runtime": {"kind": "local", "network": "proxy_only"},
    }
    base = f"http://{stack.settings.api_host}:{stack.settings.api_port}"
    response = httpx.post(f"{base}/v1/jobs", json=body, timeout=30)
    assert response.status_code == 422, response.text
    assert "network='proxy_only' needs kind bwrap or docker" in response.text
