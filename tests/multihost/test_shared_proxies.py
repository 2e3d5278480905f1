"""Two proxies on two hosts in front of the same two backends (issue 37: "proxies on several
hosts share stickiness and policy versions, and call order stays exact").

The head runs two fake engines (b1, b2) on the bridge address; hosts h1 and h2 each run a proxy
in front of both, configured as a two-proxy deployment is (`POLAR_MQ_PROXY_ADMIN_URLS` lists
both: the API pauses each around a weight update). One rollout, whose rendezvous first choice is
b1, makes its calls through either proxy:

1. b1 is down: two calls through proxy 1, which moves the rollout to b2 (its breaker opens).
2. b1 comes back, proxy 2 starts, and the calls alternate between proxy 2 and proxy 1.

Every call must be served by b2 (the rollout's prefix cache), stamped with the recorded policy
version, and numbered 0..n-1 in the order the agent made them. Before the fix, proxy 2 sent the
rollout to b1 (its own rendezvous choice: the binding lived in proxy 1's memory), and both
proxies numbered calls with their own counters (shared numbering was on only for `--workers`),
so two calls got the same seq.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.config import Settings
from polar_mq.infra.db import unit_of_work
from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess
from polar_mq.infra.tls import client_ssl_context
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.models import DEFAULT_POLICY, LlmCall, PolicyState
from polar_mq.proxy.backends.backend import upstream_base_url
from polar_mq.proxy.backends.rendezvous import order_of
from polar_mq.stack.devstack import LocalStack
from polar_mq.testing.netns_bed import HostStack, NetnsBed
from tests.conftest import module_database

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
pg_url, pg_engine = module_database("polar_mq_shared_proxies")

SECRET = "shared-proxies-" + uuid.uuid4().hex
REDIS = "redis://127.0.0.1:6379/3"
VERSION = 4
ALTERNATING = 4
"""Calls after the first two, alternating proxy 2 / proxy 1."""


def _engine(head: LocalStack, address: str, port: int) -> ManagedProcess:
    """A fake engine on the bridge address, where the hosts' proxies reach it."""
    argv = [sys.executable, "-m", "polar_mq.testing.fake_vllm", "--port", str(port),
            "--host", address]  # fmt: skip
    proc = head._spawn(f"engine-{port}", argv)
    return head._ready(proc, f"http://{address}:{port}/health", True)


def _rollout_preferring(factory: sessionmaker[Session], first: str, other: str) -> uuid.UUID:
    """A rollout of a new job whose rendezvous first choice is the backend `first`."""
    with unit_of_work(factory) as session:
        spec = {"tasks": [{"instruction": f"t{i}"} for i in range(16)], "samples_per_task": 1}
        job = create_job(session, JobCreate.model_validate(spec), "p")
        session.merge(PolicyState(name=DEFAULT_POLICY, version=VERSION))
    for rid in job.rollout_ids:
        rollout_id = uuid.UUID(str(rid))
        if order_of(rollout_id, {first: 1.0, other: 1.0})[0] == first:
            return rollout_id
    raise AssertionError("no rollout prefers b1")  # 1 in 65,536


def _proxy_settings(bed: NetnsBed, index: int, port: int, admin: list[str]) -> Settings:
    net = bed.network.hosts[index - 1]
    return bed.host_settings(index).model_copy(
        update={"proxy_host": net.address, "proxy_port": port, "proxy_admin_urls": admin}
    )


def test_two_proxies_share_the_backend_the_policy_version_and_the_call_order(
    pg_url: str, pg_engine: Engine, tmp_path: Path
) -> None:
    factory = sessionmaker(pg_engine)
    with NetnsBed(tmp_path, 2) as bed:
        head_address = bed.head_address
        b1_port, b2_port = free_port(), free_port()
        b1 = f"http://{head_address}:{b1_port}"
        b2 = f"http://{head_address}:{b2_port}"
        rollout_id = _rollout_preferring(factory, upstream_base_url(b1), upstream_base_url(b2))
        base = Settings(
            database_url=pg_url, broker_url=REDIS, proxy_redis_url=REDIS, secret_key=SECRET,
            served_model="fake-model", upstream_urls=[b1, b2], breaker_failures=1,
            breaker_cooldown_s=1.0, health_interval_s=0.5, policy_sync_s=0.5,
        )  # fmt: skip
        head_settings = bed.head_settings(base)
        ports = [free_port(), free_port()]
        admin = [f"http://{bed.network.hosts[i].address}:{ports[i]}" for i in range(2)]
        proxies = [_proxy_settings(bed, i + 1, ports[i], admin) for i in range(2)]
        token = issue_rollout_token(SECRET, rollout_id, 600, attempt=1)
        made = 0

        def call(settings: Settings) -> None:
            nonlocal made
            body = {"model": "m", "messages": [{"role": "user", "content": f"call {made}"}]}
            with httpx.Client(
                base_url=settings.proxy_base_url,
                headers={"authorization": f"Bearer {token}"},
                timeout=30,
                verify=client_ssl_context(),
            ) as agent:
                response = agent.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            made += 1

        logs = tmp_path / "logs"
        with LocalStack(head_settings, logs / "head") as head:
            _engine(head, head_address, b2_port)  # b1 (the rollout's first choice) is down
            nets = bed.network.hosts
            with HostStack(nets[0], proxies[0], logs / "h1", bed.env) as host1:
                host1.proxy()
                call(proxies[0])
                call(proxies[0])  # b1's breaker is open in proxy 1: the rollout moved to b2
                _engine(head, head_address, b1_port)
                with HostStack(nets[1], proxies[1], logs / "h2", bed.env) as host2:
                    host2.proxy()
                    for i in range(ALTERNATING):
                        call(proxies[(i + 1) % 2])

    with factory() as session:
        calls = session.scalars(
            select(LlmCall).where(LlmCall.rollout_id == rollout_id).order_by(LlmCall.created_at)
        ).all()
    made_order = [str(c.request["messages"][0]["content"]) for c in calls]
    assert made_order == [f"call {i}" for i in range(2 + ALTERNATING)]
    assert [c.seq for c in calls] == list(range(2 + ALTERNATING)), "call order not exact"
    assert {c.policy_version for c in calls} == {VERSION}
    assert [c.backend for c in calls] == [upstream_base_url(b2)] * len(calls), "stickiness lost"
