"""PostgreSQL and Redis that require passwords: the whole stack runs on them, nothing gets in
without one, and a production process warns when its URLs carry none.

A private PostgreSQL cluster (initdb with scram-sha-256 for every connection, its own port and
socket directory) and a private `redis-server --requirepass`, both on free ports: the deployment
docs/hardening.md describes. The API, the proxy and the stage workers run as real processes on
password URLs and carry one rollout to its end (its LLM call stored by the proxy); the same
servers refuse a URL without the password; and `polar-mq api` in production says so at start.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest
import redis
from sqlalchemy import func, select

from polar_mq.infra.db import create_db_engine
from polar_mq.infra.migrate import upgrade
from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess
from polar_mq.models import LlmCall, Rollout
from tests.e2e.stack import client_of, fake_upstream_stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PASSWORD = "pw-" + uuid.uuid4().hex
USER = "polar"
START_WAIT_S = 60.0


@dataclass(frozen=True)
class Servers:
    pg_port: int
    redis_port: int

    def database_url(self, password: str | None = PASSWORD) -> str:
        auth = f"{USER}:{password}" if password else USER
        return f"postgresql+psycopg://{auth}@127.0.0.1:{self.pg_port}/polar_mq"

    def redis_url(self, password: str | None = PASSWORD) -> str:
        auth = f":{password}@" if password else ""
        return f"redis://{auth}127.0.0.1:{self.redis_port}/0"


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def as_postgres(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: drop to the `postgres` user when we are root."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def can_connect(dsn: str) -> bool:
    with psycopg.connect(dsn, connect_timeout=2):
        return True


def wait_until(ready: Callable[[], object], what: str, proc: ManagedProcess) -> None:
    """Poll `ready()` until it answers (a start-up wait, not a timed assertion)."""
    deadline = time.monotonic() + START_WAIT_S
    while True:
        try:
            if ready():
                return
        except Exception:  # not up yet
            pass
        if not proc.alive() or time.monotonic() > deadline:
            pytest.fail(f"{what} did not start: {proc.log_tail()}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    bin_dir = postgres_bin()
    if bin_dir is None or shutil.which("redis-server") is None:
        pytest.skip("needs PostgreSQL's binaries (/usr/lib/postgresql/*/bin) and redis-server")
    base = Path("/tmp") / f"pmq-passwords-{uuid.uuid4().hex[:8]}"
    base.mkdir(mode=0o755)
    data, pwfile = base / "pgdata", base / "pwfile"
    pwfile.write_text(PASSWORD + "\n")
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
        shutil.chown(pwfile, "postgres")
    pg_port, redis_port = free_port(), free_port()
    procs: list[ManagedProcess] = []
    try:
        initdb = [
            str(bin_dir / "initdb"), "-D", str(data), "-U", USER, f"--pwfile={pwfile}",
            "--auth=scram-sha-256", "--no-sync",
        ]  # fmt: skip
        done = subprocess.run(as_postgres(initdb), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        postgres = as_postgres(
            [str(bin_dir / "postgres"), "-D", str(data), "-p", str(pg_port), "-c",
             "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={base}",
             "-c", "fsync=off"]
        )  # fmt: skip
        pg = ManagedProcess("postgres", postgres, dict(os.environ), base / "logs").start()
        procs.append(pg)
        redis_argv = [
            "redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
            "--requirepass", PASSWORD, "--save", "", "--appendonly", "no",
        ]  # fmt: skip
        rd = ManagedProcess("redis", redis_argv, dict(os.environ), base / "logs").start()
        procs.append(rd)
        admin = f"host=127.0.0.1 port={pg_port} user={USER} password={PASSWORD} dbname=postgres"
        wait_until(lambda: can_connect(admin), "pg", pg)
        client = redis.Redis(port=redis_port, password=PASSWORD)
        wait_until(client.ping, "redis", rd)
        client.close()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE DATABASE polar_mq")
        found = Servers(pg_port, redis_port)
        upgrade(found.database_url())
        yield found
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_the_stack_runs_a_rollout_on_password_urls(
    servers: Servers, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """API, proxy and stage workers all connect with the passwords in their URLs: one rollout
    goes through, and its LLM call is stored (the proxy's own connection)."""
    tmp = tmp_path_factory.mktemp("passwords")
    url = servers.database_url()
    with fake_upstream_stack(url, tmp, broker_url=servers.redis_url()) as stack:
        client = client_of(stack)
        job = client.submit(
            [{"instruction": "What is 6*7?", "answer": "42"}],
            harness={"type": "reference"},
            runtime={"kind": "local"},
            timeouts={"agent_s": 120},
        )
        status = client.wait(str(job.job_id), progress=False, timeout=240)
        assert status["by_status"] == {"completed": 1}, status
        ready = httpx.get(f"http://127.0.0.1:{stack.settings.api_port}/readyz", timeout=30)
        assert ready.status_code == 200, ready.text
    engine = create_db_engine(url)
    try:
        with engine.connect() as conn:
            rollout_id = conn.scalar(select(Rollout.id).where(Rollout.job_id == job.job_id))
            calls = conn.scalar(
                select(func.count()).select_from(LlmCall).where(LlmCall.rollout_id == rollout_id)
            )
    finally:
        engine.dispose()
    assert (calls or 0) >= 1


def production_env(database_url: str, broker_url: str, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_MQ_")}
    env.update(
        POLAR_MQ_ENVIRONMENT="production",
        POLAR_MQ_DATABASE_URL=database_url,
        POLAR_MQ_BROKER_URL=broker_url,
        POLAR_MQ_SECRET_KEY=secrets.token_hex(32),
        POLAR_MQ_PROXY_ADMIN_TOKEN=secrets.token_hex(32),
        POLAR_MQ_API_PORT=str(port),
        POLAR_MQ_QUEUE_PREFIX=f"pw{uuid.uuid4().hex[:8]}",
    )
    return env


def test_production_warns_at_start_without_passwords_and_readyz_fails(
    servers: Servers, tmp_path: Path
) -> None:
    """The same API process: on URLs without the passwords it starts with one warning line per
    URL, and its readiness names both servers unreachable; with them, no warning."""
    for with_password in (False, True):
        port = free_port()
        password = PASSWORD if with_password else None
        env = production_env(servers.database_url(password), servers.redis_url(password), port)
        argv = [sys.executable, "-m", "polar_mq.cli", "api"]
        proc = ManagedProcess(f"api-{with_password}", argv, env, tmp_path).start()
        try:
            proc.wait_http(f"http://127.0.0.1:{port}/healthz", timeout_s=60)
            ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=30)
            log = proc.log_tail(20_000)
        finally:
            proc.stop()
        warned = [line for line in log.splitlines() if line.startswith("warning: ")]
        if with_password:
            assert warned == [] and ready.status_code == 200, (log, ready.text)
        else:
            assert len(warned) == 2, log
            assert "POLAR_MQ_DATABASE_URL carries no password" in warned[0], warned
            assert "POLAR_MQ_BROKER_URL carries no password" in warned[1], warned
            assert ready.status_code == 503, ready.text
            checks = ready.json()["checks"]
            assert "no password supplied" in checks["database"], checks
            assert "Authentication required" in checks["broker"], checks
