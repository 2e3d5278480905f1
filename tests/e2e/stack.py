"""Isolated end-to-end stacks (own queues, ports, runtime root, secret) and their clients."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from polar_mq.client import Client
from polar_mq.config import Settings
from polar_mq.inference import local_vllm
from polar_mq.infra.ports import free_port
from polar_mq.lifecycle.stages import Stage
from polar_mq.stack.devstack import LocalStack

REDIS_E2E_URL = "redis://127.0.0.1:6379/3"


def e2e_settings(pg_url: str, tmp: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "database_url": pg_url,
        "broker_url": REDIS_E2E_URL,
        "queue_prefix": f"e2e{uuid.uuid4().hex[:8]}",
        "node_name": "e2e-node",
        "pool": "e2e",
        "proxy_port": free_port(),
        "api_port": free_port(),
        "runtime_root": tmp / "runtimes",
        # not the per-port default below ~/.cache: a later proxy on a reused port (another
        # worker's, another run's) would replay this one's leftover rows into its own database
        "proxy_spill_dir": tmp / "proxy-spill",
        "secret_key": "e2e-secret-" + uuid.uuid4().hex,
        "visibility_timeout_s": 7200,
        "max_agent_timeout_s": 600,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@contextmanager
def fake_upstream_stack(
    pg_url: str,
    tmp: Path,
    concurrency: Mapping[Stage, int] | None = None,
    latency: Mapping[str, float | str] | None = None,
    **overrides: object,
) -> Iterator[LocalStack]:
    """Fake vLLM-shaped upstream + proxy + one worker process per stage + API.

    `latency`: the fake's options (`ttft_ms`, `token_delay_ms`, `script`, `max_model_len`);
    `overrides`: settings."""
    upstream_port = free_port()
    settings = e2e_settings(
        pg_url, tmp, upstream_url=f"http://127.0.0.1:{upstream_port}", served_model="fake-model",
        **overrides,
    )  # fmt: skip
    with LocalStack(settings, tmp / "logs") as stack:
        stack.fake_upstream(upstream_port, wait=False, **(latency or {}))
        stack.proxy(wait=False)
        stack.workers(concurrency=concurrency, one_supervisor=True)
        stack.api(wait=False)
        stack.wait_ready()  # the services boot side by side
        yield stack


@contextmanager
def real_vllm_stack(pg_url: str, tmp: Path, base_url: str) -> Iterator[LocalStack]:
    """Proxy + one worker process per stage + API in front of a running real vLLM server."""
    settings = e2e_settings(
        pg_url, tmp, upstream_url=base_url, served_model=local_vllm.SERVED_MODEL
    )
    with LocalStack(settings, tmp / "logs") as stack:
        stack.proxy(wait=False)
        stack.workers(one_supervisor=True)
        stack.api(wait=False)
        stack.wait_ready()
        yield stack


def client_of(stack: LocalStack) -> Client:
    """A client of the stack's API."""
    return Client(f"http://{stack.settings.api_host}:{stack.settings.api_port}")
