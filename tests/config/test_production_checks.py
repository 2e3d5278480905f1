"""Production refuses to start unsafe, through the real CLI: a forgeable secret, an open admin API,
a guessable secret or admin token (short, a few characters repeated, a pattern, a placeholder).

Every process (API, proxy, worker) is started as a real subprocess with the environment an
operator would give it; a refusal is exit code 2 and one line on stderr, never a traceback. The
development defaults (loopback, no admin token) keep working, and `/admin/*` then answers this
machine only.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess

GOOD_SECRET = "21b8b2f830206461779cda725c86dd3e"  # as `openssl rand -hex 16` prints
ADMIN = "iU_LUNGqfqq1_O7N3YdXxElIIXJwvmKg"  # as `secrets.token_urlsafe(24)` prints
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


@pytest.mark.parametrize("process", PROCESSES)
def test_production_refuses_a_guessable_secret_and_admin_token(pg_url: str, process: str) -> None:
    """The attacker's values: 32 x "a" passes a length floor, a 1-character token any check of
    presence."""
    env = base_env(pg_url, POLAR_MQ_SECRET_KEY="a" * 32, POLAR_MQ_PROXY_ADMIN_TOKEN="x")
    assert_refused(
        run_cli(process, env),
        "POLAR_MQ_SECRET_KEY is too predictable",
        "POLAR_MQ_PROXY_ADMIN_TOKEN must be at least 24 characters (got 1",
    )


WEAK = [
    ("abc" * 11, ADMIN, "POLAR_MQ_SECRET_KEY is too predictable: 1.6 bits"),
    ("0123456789abcdef" * 2, ADMIN, "POLAR_MQ_SECRET_KEY is too predictable: one shorter"),
    ("change-me-to-the-output-of-openssl", ADMIN, "POLAR_MQ_SECRET_KEY is a placeholder"),
    (GOOD_SECRET, "t" * 30, "POLAR_MQ_PROXY_ADMIN_TOKEN is too predictable: 0.0 bits"),
    (GOOD_SECRET, "admin-token", "POLAR_MQ_PROXY_ADMIN_TOKEN must be at least 24 characters"),
]
"""Patterns a length floor lets through (or not even that), and what the refusal says."""


def _production(secret: str, token: str) -> Any:
    from polar_mq.config import Settings

    return Settings(
        environment="production",
        database_url="postgresql://postgres@127.0.0.1/none",
        unsafe_root_agents=False,  # the test environment's own setting: development only
        secret_key=secret,
        proxy_admin_token=token,
    )


def test_production_settings_name_the_weak_value_and_accept_generated_ones() -> None:
    """The same check in-process: each weak pattern refused, naming its setting; values from a
    generator (its poorest alphabet, the shortest lengths) and the dev defaults still start."""
    from polar_mq.config import Settings

    for secret, token, refused in WEAK:
        with pytest.raises(ValidationError) as error:
            _production(secret, token)
        assert refused in str(error.value), (secret, token)
    for _ in range(200):
        _production(secrets.token_hex(16), secrets.token_hex(12))
    Settings(environment="development", proxy_admin_token="x")


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
