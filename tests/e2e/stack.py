"""Settings for an isolated end-to-end stack (own queues, ports, runtime root, secret)."""

from __future__ import annotations

import uuid
from pathlib import Path

from polar_mq.config import Settings
from polar_mq.processes import free_port

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
        "secret_key": "e2e-secret-" + uuid.uuid4().hex,
        "visibility_timeout_s": 7200,
        "max_agent_timeout_s": 600,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]
