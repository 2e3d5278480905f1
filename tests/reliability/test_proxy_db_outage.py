"""PostgreSQL unreachable for ~30 s under load: the proxy keeps serving and logs every call once.

A real proxy process (`polar-mq proxy`, started by `polar_mq.stack.devstack`) in front of the fake
vLLM process reaches the session's PostgreSQL database only through a `TcpRelay`. Many concurrent
clients, each with its own rollout token, make chat calls (streaming and not) before, during and
after the relay is cut (listener closed, connections reset). Afterwards every call the clients saw
answered must be in `llm_calls` exactly once: per rollout the sequence numbers 0..n-1 each once,
and each stored request carrying the marker its client sent. `POLAR_MQ_TEST_OUTAGE_S` shortens
the outage for a quick local run.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.config import Settings
from polar_mq.infra.db import unit_of_work
from polar_mq.infra.ports import free_port
from polar_mq.infra.tls import client_ssl_context
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.models import LlmCall
from polar_mq.stack.devstack import LocalStack
from tests.reliability.tcp_relay import TcpRelay

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

OUTAGE_S = float(os.environ.get("POLAR_MQ_TEST_OUTAGE_S", "30"))
BEFORE_S = 4.0
AFTER_S = 4.0
CLIENTS = 24
SECRET = "outage-secret-" + uuid.uuid4().hex
ADMIN = "outage-admin-" + uuid.uuid4().hex


@dataclass
class Client:
    """One agent: its rollout, the markers of the calls it saw answered, and any failure."""

    rollout_id: uuid.UUID = field(default_factory=uuid.uuid4)
    answered: list[str] = field(default_factory=list)
    answered_at: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def _agent(url: str, client: Client, n: int, stop: asyncio.Event) -> None:
    token = issue_rollout_token(SECRET, client.rollout_id, 3600)
    headers = {"authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=30, verify=client_ssl_context()
    ) as http:
        while not stop.is_set():
            marker = f"client {n} call {len(client.answered) + len(client.errors)}"
            body = {
                "model": "agent",
                "stream": len(client.answered) % 3 == 0,
                "messages": [{"role": "user", "content": f"{marker}: what is 2 + 3?"}],
            }
            try:
                async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                    text = (await response.aread()).decode()
                if response.status_code != 200 or ("[DONE]" not in text and body["stream"]):
                    client.errors.append(f"{response.status_code}: {text[:200]}")
                    continue
            except httpx.HTTPError as exc:
                client.errors.append(repr(exc))
                continue
            client.answered.append(marker)
            client.answered_at.append(time.monotonic())


async def _flush_until_stored(url: str, timeout_s: float) -> dict[str, object]:
    """POST /admin/flush until it answers 200 (503 while spilled rows await replay)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        while True:
            response = await http.post("/admin/flush", headers={"authorization": f"Bearer {ADMIN}"})
            if response.status_code == 200:
                stats: dict[str, object] = response.json()
                return stats
            assert response.status_code == 503, response.text
            assert time.monotonic() < deadline, f"calls still not stored: {response.text}"


def test_database_outage_under_load_logs_every_call_exactly_once(
    pg_url: str, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> None:
    pg = make_url(pg_url)
    relay = TcpRelay((pg.host or "127.0.0.1", pg.port or 5432)).start()
    upstream_port = free_port()
    spill_dir = tmp_path / "spill"
    settings = Settings(
        database_url=pg_url.replace(f"{pg.host}:{pg.port}", f"127.0.0.1:{relay.port}"),
        upstream_url=f"http://127.0.0.1:{upstream_port}",
        served_model="fake-model",
        proxy_port=free_port(),
        secret_key=SECRET,
        proxy_admin_token=ADMIN,
        proxy_spill_dir=spill_dir,
        proxy_flush_timeout_s=5.0,
    )
    assert str(relay.port) in settings.database_url
    with unit_of_work(db_session_factory) as session:  # the proxy serves existing rollouts only
        spec = {"tasks": [{"instruction": "x"}], "samples_per_task": CLIENTS}
        job = create_job(session, JobCreate.model_validate(spec), "p")
    clients = [Client(rollout_id) for rollout_id in job.rollout_ids]
    try:
        with LocalStack(settings, tmp_path / "logs") as stack:
            stack.fake_upstream(upstream_port, ttft_ms=20)
            proxy = stack.proxy()
            outage = asyncio.run(_drive(settings.proxy_base_url, clients, relay, spill_dir))
            stats = asyncio.run(_flush_until_stored(settings.proxy_base_url, 120))
            assert proxy.alive(), proxy.log_tail()
    finally:
        relay.cut()

    errors = [e for c in clients for e in c.errors]
    during = sum(outage[0] <= t <= outage[1] for c in clients for t in c.answered_at)
    total = sum(len(c.answered) for c in clients)
    print(f"calls answered: {total}, during the {OUTAGE_S:g} s outage: {during}; writer: {stats}")
    assert errors == [], f"{len(errors)} calls failed, e.g. {errors[:3]}"
    assert during > 100, f"only {during} calls answered during the outage"
    assert outage[2] > 0, "nothing was spilled to disk during the outage"
    assert stats["spilled_rows"] == 0 and stats["queued"] == 0
    assert stats["dropped"] == stats["dropped_overflow"] == stats["failed"] == 0, stats
    assert stats["replayed"] == stats["spilled_total"] and int(str(stats["replayed"])) > 0, stats

    with db_session_factory() as session:
        rows = session.execute(select(LlmCall.rollout_id, LlmCall.seq, LlmCall.request)).all()
    assert len(rows) == total, f"{len(rows)} rows stored for {total} answered calls"
    by_rollout: dict[uuid.UUID, list[int]] = {}
    for rollout_id, seq, _ in rows:
        by_rollout.setdefault(rollout_id, []).append(seq)
    for client in clients:
        assert sorted(by_rollout.get(client.rollout_id, [])) == list(range(len(client.answered)))
    stored = Counter(str(r.request["messages"][0]["content"]).split(":")[0] for r in rows)
    assert stored == Counter(m for c in clients for m in c.answered)


async def _drive(
    url: str, clients: list[Client], relay: TcpRelay, spill_dir: Path
) -> tuple[float, float, int]:
    """Load before, during and after the outage; returns (cut at, restored at, segments seen)."""
    stop = asyncio.Event()
    agents = [asyncio.create_task(_agent(url, c, i, stop)) for i, c in enumerate(clients)]
    try:
        await asyncio.sleep(BEFORE_S)
        relay.cut()
        cut_at = time.monotonic()
        await asyncio.sleep(OUTAGE_S)
        segments = len(list(spill_dir.glob("*.seg")))
        relay.restore()
        restored_at = time.monotonic()
        await asyncio.sleep(AFTER_S)
    finally:
        stop.set()
        await asyncio.gather(*agents)
    return cut_at, restored_at, segments
