"""One typed Settings object for every polar_mq process.

Every process (API, proxy, worker, sweeper, CLI) builds its behaviour from a `Settings` instance
passed in explicitly; nothing reads the environment at import time. Unsafe or inconsistent values
are refused at boot so a misconfiguration fails loudly instead of silently dropping rollouts.
"""

from __future__ import annotations

import socket
from functools import lru_cache
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SECRET = "polar-mq-dev-secret-change-me"


class Settings(BaseSettings):
    """Configuration shared by all processes; env prefix `POLAR_MQ_`."""

    model_config = SettingsConfigDict(env_prefix="POLAR_MQ_", env_file=None, extra="ignore")

    environment: str = Field("development", description="development | production")
    database_url: str = Field(
        "sqlite:///polar_mq.db", description="SQLAlchemy URL; PostgreSQL in production"
    )
    broker_url: str = Field(
        "sqla+sqlite:///polar_mq_broker.db",
        description="Celery broker URL (redis://, amqp://, or the embedded sqla+sqlite://)",
    )
    queue_prefix: str = Field("polar", description="prefix of every Celery queue name")
    pool: str = Field("default", description="worker pool this node belongs to")
    node_name: str = Field(default_factory=socket.gethostname, description="this node's name")
    secret_key: str = Field(DEFAULT_SECRET, description="signs per-rollout proxy tokens")
    rollout_token_ttl_s: int = Field(24 * 3600, ge=60)

    api_host: str = "127.0.0.1"
    api_port: int = 8000
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)

    proxy_host: str = "127.0.0.1"
    proxy_port: int = 8010
    proxy_public_url: str | None = Field(
        None, description="base URL agents use to reach the proxy (default http://host:port)"
    )
    upstream_url: str = Field("http://127.0.0.1:8011", description="vLLM-compatible backend")
    upstream_engine: str = Field("vllm", description="vllm | generic")
    served_model: str | None = Field(None, description="model name sent upstream")
    proxy_admin_token: str | None = Field(None, description="bearer token for proxy admin calls")
    log_batch_size: int = Field(256, ge=1)
    log_flush_interval_s: float = Field(0.05, gt=0)
    log_queue_max: int = Field(100_000, ge=1)

    runtime_root: Path = Field(Path("/tmp/polar_mq/runtimes"))
    visibility_timeout_s: int = Field(3 * 3600, ge=10)
    lease_s: int = Field(600, ge=1)
    default_agent_timeout_s: float = Field(600.0, gt=0)
    max_agent_timeout_s: float = Field(3600.0, gt=0)
    default_inactivity_timeout_s: float | None = Field(None, gt=0)
    result_backend: str | None = None
    task_always_eager: bool = False

    @property
    def is_production(self) -> bool:
        return self.environment == "production"

    @property
    def proxy_base_url(self) -> str:
        """Base URL (without /v1) that agents and workers use to reach the proxy."""
        if self.proxy_public_url:
            return self.proxy_public_url.rstrip("/")
        return f"http://{self.proxy_host}:{self.proxy_port}"

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> Settings:
        if self.is_production and self.secret_key == DEFAULT_SECRET:
            raise ValueError("POLAR_MQ_SECRET_KEY must be set in production")
        if self.is_production and self.database_url.startswith("sqlite"):
            raise ValueError("production needs PostgreSQL (POLAR_MQ_DATABASE_URL)")
        if self.visibility_timeout_s <= self.max_agent_timeout_s:
            raise ValueError(
                "POLAR_MQ_VISIBILITY_TIMEOUT_S must exceed POLAR_MQ_MAX_AGENT_TIMEOUT_S, otherwise "
                "the broker redelivers a running agent stage"
            )
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Settings from the environment, built once per process on first use (not at import)."""
    return Settings()
