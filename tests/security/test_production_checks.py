"""Production refuses to start unsafe, through the real CLI: a forgeable secret, an open admin API.

Every process (API, proxy, worker) is started as a real subprocess with the environment an
operator would give it; a refusal is exit code 2 and one line on stderr, never a traceback. The
development defaults (loopback, no admin token) keep working, and `/admin/*` then answers this
machine only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import httpx
import pytest

from polar_mq.ports import free_port
from polar_mq.processes import ManagedProcess

GOOD_SECRET = "s" * 32
ADMIN = "admin-" + "t" * 26
PROCESSES = ("api", "proxy", "worker")


def base_env(pg_url: str, **extra: str) -> dict[str, str]:
    """This process's environment without its POLAR_MQ_* settings, plus a production config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_MQ_")}
    env.update(
        POLAR_MQ_ENVIRONMENT="production",
        POLAR_MQ_DATABASE_URL=pg_url,
        POLAR_MQ_BROKER_URL="redis://127.0.0.1:6379/3",
        POLAR_MQ_API_PORT=str(free_port()),
        POLAR_MQ_PROXY_PORT=str(free_port()),
    )
    env.update(extra)
    return env


def run_cli(command: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "polar_mq.cli", command]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def assert_refused(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("configuration error: "), lines
    assert "Traceback" not in done.stderr + done.stdout
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize("process", PROCESSES)
def test_production_refuses_a_secret_under_32_bytes(pg_url: str, process: str) -> None:
    env = base_env(pg_url, POLAR_MQ_SECRET_KEY="x", POLAR_MQ_PROXY_ADMIN_TOKEN=ADMIN)
    assert_refused(run_cli(process, env), "POLAR_MQ_SECRET_KEY must be at least 32 bytes")


@pytest.mark.parametrize("process", PROCESSES)
def test_production_refuses_an_unset_admin_token(pg_url: str, process: str) -> None:
    env = base_env(pg_url, POLAR_MQ_SECRET_KEY=GOOD_SECRET)
    assert_refused(run_cli(process, env), "POLAR_MQ_PROXY_ADMIN_TOKEN must be set in production")
    env["POLAR_MQ_PROXY_ADMIN_TOKEN"] = "   "  # blank is unset, not a token everyone knows
    assert_refused(run_cli(process, env), "POLAR_MQ_PROXY_ADMIN_TOKEN must be set in production")


def test_production_refuses_the_default_secret_and_a_public_proxy(pg_url: str) -> None:
    env = base_env(pg_url, POLAR_MQ_PROXY_HOST="0.0.0.0")
    assert_refused(
        run_cli("proxy", env),
        "POLAR_MQ_SECRET_KEY must be set in production",
        "POLAR_MQ_PROXY_ADMIN_TOKEN must be set",
        "POLAR_MQ_PROXY_HOST=0.0.0.0 is not a loopback address",
    )


def test_any_mode_refuses_a_public_proxy_without_admin_token(pg_url: str) -> None:
    env = base_env(pg_url, POLAR_MQ_ENVIRONMENT="development", POLAR_MQ_PROXY_HOST="0.0.0.0")
    assert_refused(run_cli("proxy", env), "POLAR_MQ_PROXY_HOST=0.0.0.0 is not a loopback address")
    argv = [sys.executable, "-m", "polar_mq.proxy", "--host", "0.0.0.0"]  # the module entry too
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert_refused(done, "is not a loopback address")


def _env_for(mode: str) -> dict[str, str]:
    extra = {"POLAR_MQ_PROXY_SPILL_MAX_BYTES": "0"}
    if mode == "production":
        extra |= {"POLAR_MQ_SECRET_KEY": GOOD_SECRET, "POLAR_MQ_PROXY_ADMIN_TOKEN": ADMIN}
    else:
        extra |= {"POLAR_MQ_ENVIRONMENT": "development"}
    return extra


@pytest.mark.parametrize("mode", ["production", "development"])
def test_a_safe_proxy_starts_and_locks_admin_as_configured(
    pg_url: str, tmp_path: Path, mode: str
) -> None:
    env = base_env(pg_url, **_env_for(mode))
    argv = [sys.executable, "-m", "polar_mq.cli", "proxy"]
    proc = ManagedProcess("proxy", argv, env, tmp_path, fork=True)
    proc.start()
    base = f"http://127.0.0.1:{env['POLAR_MQ_PROXY_PORT']}"
    try:
        proc.wait_http(f"{base}/healthz")
        with httpx.Client(base_url=base, timeout=10) as client:
            anonymous = client.get("/admin/backends")
            wrong = client.get("/admin/backends", headers={"authorization": "Bearer nope"})
            right = client.get("/admin/backends", headers={"authorization": f"Bearer {ADMIN}"})
            flush = client.post("/admin/flush")
    finally:
        proc.stop()
    if mode == "production":
        assert anonymous.status_code == 401 and wrong.status_code == 401
        assert right.status_code == 200 and flush.status_code == 401
    else:  # development, loopback, no token: this machine may administer the proxy, as today
        assert anonymous.status_code == 200 and flush.status_code == 200


@pytest.mark.anyio
async def test_admin_without_a_token_answers_this_machine_only() -> None:
    """Even a proxy whose settings checks were bypassed never opens `/admin/*` to the network."""
    from polar_mq.config import Settings
    from polar_mq.proxy import MemoryCallSink, create_proxy_app

    settings = Settings(upstream_url="http://upstream.test")
    app = create_proxy_app(settings, sink=MemoryCallSink())
    async with app.router.lifespan_context(app):
        for peer, expected in ((("10.1.2.3", 4567), 401), (("127.0.0.1", 4567), 200)):
            transport = httpx.ASGITransport(app, client=peer)
            async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
                assert (await client.get("/admin/backends")).status_code == expected
                assert (await client.post("/admin/flush")).status_code == expected
