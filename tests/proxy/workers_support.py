"""A `--workers N` proxy as a real process tree, fake engines as processes, rows in PostgreSQL.

`Pinned` clients hold one keep-alive connection each, so every call of a pinned client is served
by the one worker process that accepted that connection (asked once, through `/healthz`): a test
decides which process serves which call.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from backends_support import ADMIN, ADMIN_TOKEN, CHAT, FakeProcess, wait_until
from proxy_support import FRESH_HTTP, SECRET
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.config import Settings
from polar_mq.infra.ports import free_port
from polar_mq.infra.tls import client_ssl_context
from polar_mq.models import Job, JobTask, LlmCall, Rollout, RolloutStatus
from polar_mq.stack.devstack import settings_env
from tests.conftest import REDIS_URL


def live_rollouts(engine: Engine, n: int) -> list[uuid.UUID]:
    """`n` running rollouts of a new job (the proxy refuses calls of rollouts it cannot find)."""
    with Session(engine) as session, session.begin():
        job = Job(samples_per_task=n, n_tasks=1, spec={})
        session.add(job)
        session.flush()
        task = JobTask(job_id=job.id, task_index=0, instance={})
        session.add(task)
        session.flush()
        rollouts = [
            Rollout(
                job_id=job.id,
                task_id=task.id,
                task_index=0,
                sample_index=i,
                status=RolloutStatus.RUNNING,
            )
            for i in range(n)
        ]
        session.add_all(rollouts)
        session.flush()
        return [r.id for r in rollouts]


def stored_calls(engine: Engine, rollout: uuid.UUID) -> list[LlmCall]:
    """The rollout's rows as the readers see them (ordered by seq)."""
    with Session(engine) as session:
        query = select(LlmCall).where(LlmCall.rollout_id == rollout).order_by(LlmCall.seq)
        return list(session.scalars(query))


def chat_body(text: str = "What is 123 + 456?") -> dict[str, Any]:
    return {"model": "policy", "messages": [{"role": "user", "content": text}]}


@dataclass
class Pinned:
    """An HTTP client whose one connection is served by worker `worker`."""

    client: httpx.Client
    worker: int
    pid: int

    def chat(self, rollout: uuid.UUID, text: str = "What is 123 + 456?") -> httpx.Response:
        token = issue_rollout_token(SECRET, rollout, 600)
        headers = {"authorization": f"Bearer {token}"}
        return self.client.post(CHAT, json=chat_body(text), headers=headers)

    def admin(self, path: str, body: Any = None) -> httpx.Response:
        return self.client.post(path, json=body, headers=ADMIN)

    def check_worker(self) -> None:
        """Still on the same process (the connection was kept)."""
        assert self.client.get("/healthz").json()["pid"] == self.pid


@dataclass
class WorkerProxy:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    workers: int
    clients: list[httpx.Client] = field(default_factory=list)

    def pinned(self, worker: int, attempts: int = 200) -> Pinned:
        """A client connected to worker `worker` (new connections until the kernel picks it)."""
        for _ in range(attempts):
            client = httpx.Client(
                base_url=self.url,
                timeout=30,
                limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
                verify=client_ssl_context(),
            )
            answer = client.get("/healthz").json()
            if answer["worker"] == worker:
                self.clients.append(client)
                return Pinned(client, worker, answer["pid"])
            client.close()
        raise AssertionError(f"no connection reached worker {worker}")

    def pids(self) -> set[int]:
        seen: set[int] = set()
        for _ in range(100):
            seen.add(FRESH_HTTP.get(f"{self.url}/healthz").json()["pid"])
            if len(seen) == self.workers:
                break
        return seen

    def backends(self) -> dict[str, dict[str, Any]]:
        """`GET /admin/backends`: each backend as the whole proxy sees it (every worker asked)."""
        answer = httpx.get(f"{self.url}/admin/backends", headers=ADMIN)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["processes"] == self.workers
        return {b["name"]: b for b in body["backends"]}

    def flush(self) -> dict[str, Any]:
        answer = FRESH_HTTP.post(f"{self.url}/admin/flush", headers=ADMIN)
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body

    def stop(self) -> int:
        """SIGTERM to the supervisor: every worker drains; its exit code."""
        for client in self.clients:
            client.close()
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


@contextmanager
def fake_engines(n: int) -> Iterator[list[FakeProcess]]:
    with ExitStack() as stack:
        yield [stack.enter_context(FakeProcess()) for _ in range(n)]


def _lost_its_port(proc: subprocess.Popen[bytes], port: int, log: Path) -> bool:
    """Whether the proxy exited at once because its port was taken (then try another port);
    False as soon as it answers, or when it ended for another reason (the caller reports it)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            FRESH_HTTP.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return False
        except httpx.TransportError:
            time.sleep(0.05)
    return proc.poll() is not None and b"address already in use" in log.read_bytes()


@contextmanager
def worker_proxy(
    pg_url: str, tmp_path: Path, upstreams: list[str], workers: int = 2, **overrides: Any
) -> Iterator[WorkerProxy]:
    """`python -m polar_mq.proxy --workers N` in front of `upstreams`, logging to `pg_url`."""
    values: dict[str, Any] = {
        "database_url": pg_url,
        "secret_key": SECRET,
        "served_model": "fake-model",
        "upstream_urls": upstreams,
        "proxy_admin_token": ADMIN_TOKEN,
        "proxy_redis_url": REDIS_URL,  # the shared per-rollout call counter
        "proxy_workers": workers,
        "proxy_port": free_port(),
        "proxy_spill_dir": tmp_path / "spill",
        "health_interval_s": 0.2,
        "policy_sync_s": 0.2,
    }
    values.update(overrides)
    log = tmp_path / "proxy.log"
    argv = [sys.executable, "-m", "polar_mq.proxy", "--workers", str(workers)]
    for _ in range(3):  # another test's service may bind the free port before this proxy does
        settings = Settings(**values)
        env = {**os.environ, **settings_env(settings)}
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        if not _lost_its_port(proc, settings.proxy_port, log):
            break
        values["proxy_port"] = free_port()
    url = f"http://127.0.0.1:{settings.proxy_port}"
    proxy = WorkerProxy(url, proc, log, workers)

    def up() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return FRESH_HTTP.get(f"{url}/healthz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(up, 60)
        wait_until(lambda: len(proxy.pids()) == workers, 60)
        yield proxy
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
