"""One typed Settings object for every polar_mq process.

Every process (API, proxy, worker, sweeper, CLI) builds its behaviour from a `Settings` instance
passed in explicitly; nothing reads the environment at import time. Unsafe or inconsistent values
are refused at boot so a misconfiguration fails loudly instead of silently dropping rollouts.
"""

from __future__ import annotations

import math
import socket
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from polar_mq.config.checks import DEFAULT_SECRET, security_problems
from polar_mq.config.checks import is_loopback as is_loopback  # where the proxy takes it from
from polar_mq.config.floor import FloorSettings
from polar_mq.config.quota import UNLIMITED as UNLIMITED
from polar_mq.config.quota import QuotaLimits as QuotaLimits
from polar_mq.spec import TimeoutSpec

TOKEN_GRACE_S = 120
"""An agent token outlives the agent's own time limit by this much: the kill, the proxy flush."""


class Settings(FloorSettings, BaseSettings):
    """Configuration shared by all processes; env prefix `POLAR_MQ_` (+ `floor_settings`)."""

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
    rollout_token_ttl_s: int = Field(
        24 * 3600,
        ge=60,
        description="upper bound of a token's life; agent tokens end sooner, with their "
        "rollout's time limits (agent_token_ttl_s)",
    )
    import_allowlist: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["polar_mq"],
        description="module prefixes evaluator and builder import paths may name (JSON list or "
        "comma-separated); entry points of the polar_mq.evaluators / polar_mq.builders groups "
        "are always allowed",
    )
    body_read_timeout_s: float = Field(
        30.0,
        gt=0,
        description="API and proxy: a request body not received whole within this long is cut "
        "(408, connection closed)",
    )
    header_read_timeout_s: float = Field(
        10.0,
        gt=0,
        description="API and proxy: a connection whose request line and headers are not "
        "received whole within this long is closed (408; half-sent heads, slowloris)",
    )

    api_host: str = "127.0.0.1"
    api_port: int = 8000
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    group_poll_s: float = Field(
        0.25,
        gt=0,
        le=10,
        description="how often a waiting group long-poll or stream looks for newly complete "
        "groups (one short query per waiting consumer; no connection held in between)",
    )

    quota_max_rollouts_per_request: int | None = Field(
        10_000, ge=1, description="every tenant: rollouts (tasks x samples) one job may ask for"
    )
    quota_max_rollouts_in_flight: int | None = Field(
        100_000, ge=1, description="every tenant: rollouts not yet terminal at any time"
    )
    quota_max_tokens_per_rollout: int | None = Field(
        None,
        ge=1,
        description="every tenant: the largest sampling.max_tokens a job may set (jobs without "
        "one get it); unset: no limit",
    )
    tenant_quotas: dict[str, QuotaLimits] = Field(
        default_factory=dict,
        description='per tenant, as JSON: {"team-a": {"max_rollouts_in_flight": 5000}}; a limit '
        "left out falls back to the quota_* above (API keys can override both)",
    )

    proxy_host: str = "127.0.0.1"
    proxy_port: int = 8010
    proxy_public_url: str | None = Field(
        None, description="base URL agents use to reach the proxy (default http://host:port)"
    )
    upstream_url: str = Field("http://127.0.0.1:8011", description="vLLM-compatible backend")
    upstream_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="several backends (JSON list or comma-separated); when set, replaces "
        "upstream_url",
    )
    upstream_max_attempts: int = Field(
        3, ge=1, description="backends a call may be tried on before its first byte"
    )
    upstream_max_in_flight: int = Field(
        0,
        ge=0,
        description="per backend and proxy process: at this many calls in flight a backend takes "
        "no new rollouts (they go to the next backend in rendezvous order); 0: no limit",
    )
    breaker_failures: int = Field(5, ge=1, description="consecutive failures that open a breaker")
    breaker_cooldown_s: float = Field(10.0, ge=0, description="open breaker: wait before a probe")
    health_interval_s: float = Field(5.0, gt=0, description="backend health-check period")
    health_timeout_s: float = Field(2.0, gt=0)
    sticky_rollouts_max: int = Field(100_000, ge=1, description="rollout->backend bindings kept")
    sticky_ttl_s: float = Field(3600.0, gt=0, description="a binding idle this long is dropped")
    pause_max_wait_s: float = Field(
        30.0, ge=0, description="a call held by a pause waits this long, then gets a 503"
    )
    upstream_engine: str = Field("vllm", description="vllm | sglang | generic")
    proxy_tito: Literal["auto", "on", "off"] = Field(
        "off",
        description="token-in/token-out for chat calls (polar_mq.proxy.tito): a turn that "
        "extends the previous one is sent as its exact prompt + completion ids + the new "
        "messages' ids; `auto`: on where the engine takes token prompts (vllm), `on` refuses "
        "to boot on one that does not",
    )
    proxy_tito_tool_parser: str = Field(
        "hermes", description="how TITO reads tool calls out of generated text (tito.tool_parsers)"
    )
    proxy_tito_backends: dict[str, Literal["auto", "on", "off"]] = Field(
        default_factory=dict,
        description="a backend's own TITO setting over proxy_tito, by backend name (its URL "
        'for the upstream_urls ones), as a JSON object: {"http://gpu1:8000": "off"}',
    )
    served_model: str | None = Field(None, description="model name sent upstream")
    served_model_max_len: int | None = Field(
        None,
        ge=1,
        description="the served model's context in tokens (vLLM's --max-model-len): a job whose "
        "sampling.max_tokens leaves no room for a prompt in it is refused at submit (422)",
    )
    proxy_admin_token: str | None = Field(None, description="bearer token for proxy admin calls")
    proxy_admin_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="every proxy the API pauses and resumes around a weight update (JSON list or "
        "comma-separated; default: the one proxy at proxy_host:proxy_port)",
    )
    proxy_rollout_state_ttl_s: float = Field(
        2.0,
        gt=0,
        le=60,
        description="how long the proxy trusts the rollout states it read (one batched query "
        "per period): a token dies at most this long (plus one query) after its rollout ended",
    )
    policy_sync_s: float = Field(
        2.0, gt=0, description="how often a proxy re-reads the policy version from the database"
    )
    log_batch_size: int = Field(256, ge=1)
    log_flush_interval_s: float = Field(0.05, gt=0)
    log_queue_max: int = Field(100_000, ge=1)
    proxy_spill_dir: Path | None = Field(
        None,
        description="durable buffer for call rows while the database is down "
        "(default ~/.cache/polar_mq/proxy-spill/<proxy_port>; one proxy per directory)",
    )
    proxy_spill_max_bytes: int = Field(
        1 << 30, ge=0, description="spill bound; a batch that does not fit is dropped; 0: off"
    )
    proxy_workers: int = Field(
        1,
        ge=1,
        le=64,
        description="proxy processes serving proxy_port (each with its own call writer and "
        "spill subdirectory worker-<i>); admin calls reach all of them",
    )
    proxy_redis_url: str | None = Field(
        None,
        description="Redis holding the shared per-rollout call counter (default: broker_url "
        "when it is redis://)",
    )
    proxy_shared_seq: bool | None = Field(
        None,
        description="number each rollout's calls with a counter in Redis, exact across proxy "
        "processes and instances (default: on with proxy_workers > 1 or several proxies in "
        "proxy_admin_urls; rollouts' backend bindings are then shared there too)",
    )
    proxy_call_receipts: bool | None = Field(
        None,
        description="the proxy counts each rollout attempt's calls in Redis and the run-agent "
        "stage waits for them to be stored instead of flushing the proxy (default: on when a "
        "Redis is known: proxy_redis_url or a redis:// broker_url)",
    )
    proxy_redis_retry_s: float = Field(
        15.0,
        ge=0,
        description="how long an agent's call waits for an unreachable receipts Redis (a broker "
        "restart) before the proxy refuses it with a retryable 503",
    )
    call_receipts_wait_s: float = Field(
        5.0,
        gt=0,
        description="how long the run-agent stage waits for an attempt's call receipts before "
        "it falls back to flushing the proxy",
    )
    proxy_durable_answers: bool = Field(
        True,
        description="an answer leaves the proxy only once its call row is committed or spilled "
        "to local disk (group commit: one commit round trip per call), so a proxy killed with "
        "-9 loses no call an agent saw answered; false: answer first, store after",
    )
    proxy_answer_journal: bool = Field(
        True,
        description="with durable answers and a spill directory, make each answer's row "
        "durable by an fsync to a local journal in the spill directory and commit the rows to "
        "the database in batches (every log_flush_interval_s, or at once when a stage waits); "
        "a killed proxy's journal is replayed by the next one. false: each answer waits for its "
        "row's database commit",
    )
    proxy_journal_sync: Literal["fdatasync", "write"] = Field(
        "write",
        description="what an answer waits for in the answer journal: 'write' (its row is in "
        "the kernel's page cache, written by the serving loop itself: a proxy killed with -9 "
        "spares it; a crash of its host loses the rows of the last flush interval, as the "
        "host's loss would, and the call receipts then find them missing) or 'fdatasync' (its "
        "row is on the disk: a host that crashes and comes back spares it too, for more CPU "
        "and latency per call: docs/benchmarks.md)",
    )
    proxy_flush_timeout_s: float = Field(
        20.0,
        gt=0,
        description="/admin/flush waits this long for spilled rows to be replayed, then 503 "
        "(below the run-agent stage's 30 s HTTP timeout, so it sees the clear error)",
    )

    runtime_root: Path = Field(Path("/tmp/polar_mq/runtimes"))
    agent_user: str | None = Field(
        None,
        description="who agents run as when the worker is root: a user name or uid[:gid] "
        "(default: the user polar-agent if it exists, else nobody); never root",
    )
    agent_claims_dir: Path = Field(
        Path("/run/polar_mq/agent-claims"),
        description="where `local` records which pool user (polar-agent-N) each live runtime "
        "holds; one directory per node, shared by all its workers",
    )
    unsafe_root_agents: bool = Field(
        False,
        description="development only (refused in production): when the runtime root is below "
        "a private directory, run agents as the worker itself (root) instead of refusing; "
        "never with untrusted agents",
    )
    local_hidden_paths: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="more absolute paths `local` agents must not see (JSON list or "
        "comma-separated), covered like the checkout and the log directory in their private "
        "mount view (runtimes/private_view.py)",
    )
    local_allow_shared_view: bool = Field(
        False,
        description="production: still run `local` on a root node that cannot give agents their "
        "private mount view (they can then read the checkout and every world-readable file)",
    )
    harness_root: Path = Field(
        Path.home() / ".cache" / "polar_mq" / "harnesses",
        description="installed harness presets, one directory per name/version (harness install)",
    )
    artifact_max_bytes: int = Field(
        1 << 20, ge=1024, description="per stored rollout artifact; a longer file keeps its tail"
    )
    warm_pool_max_per_node: int = Field(
        16, ge=0, description="warm-pool runtimes a node keeps (idle, building, in use)"
    )
    warm_pool_idle_ttl_s: float = Field(
        600.0, gt=0, description="an idle warm runtime no queued rollout wants is destroyed after"
    )
    warm_pool_refill_interval_s: float = Field(
        1.0, gt=0, description="how often the refiller compares the pool with the demand"
    )
    warm_pool_build_concurrency: int = Field(
        2, ge=1, description="warm runtimes the refiller builds at once"
    )
    prepare_admission_window: int | None = Field(
        None,
        ge=0,
        description="a node takes no new prepares while this many of its rollouts wait for a "
        "run-agent slot (workers/admission.py); default: its run_agent concurrency; 0: no limit",
    )
    visibility_timeout_s: int = Field(3 * 3600, ge=10)
    lease_s: float = Field(
        60.0, gt=0, description="stage lease; renewed every lease_s/3 while the stage runs"
    )
    retry_backoff_s: float = Field(2.0, gt=0, description="first in-place stage retry delay")
    sweep_interval_s: float = Field(10.0, gt=0, description="how often the sweeper looks")
    republish_after_s: float = Field(
        300.0, gt=0, description="re-send a ready rollout's message after this long untouched"
    )
    call_retention_days: float | None = Field(
        None,
        gt=0,
        description="automatic prune: LLM calls older than this many days are exported (if "
        "call_export_dir) and deleted by the sweeper's maintenance; unset: keep every call",
    )
    call_export_dir: Path | None = Field(
        None, description="where the automatic prune writes the calls it deletes (JSONL.gz)"
    )
    call_partitions_ahead_days: int = Field(
        7, ge=1, le=366, description="daily llm_calls partitions kept created ahead of today"
    )
    call_maintenance_interval_s: float = Field(
        3600.0, gt=0, description="how often partitions are created ahead and the prune runs"
    )
    default_agent_timeout_s: float = Field(600.0, gt=0)
    max_agent_timeout_s: float = Field(3600.0, gt=0)
    default_inactivity_timeout_s: float | None = Field(None, gt=0)
    log_level: str = Field(
        "INFO", description="level of polar_mq's own loggers (libraries log at WARNING)"
    )
    log_dir: Path | None = Field(
        None,
        description="also write JSON lines to <dir>/<process>-<pid>.jsonl (read by polar-mq logs)",
    )
    metrics_host: str = Field(
        "127.0.0.1", description="bind address of the worker node's and sweeper's /metrics"
    )
    worker_metrics_port: int | None = Field(
        None, ge=1, le=65535, description="`polar-mq worker` serves the node's /metrics here"
    )
    sweeper_metrics_port: int | None = Field(
        None, ge=1, le=65535, description="`polar-mq sweeper` serves its /metrics here"
    )
    metrics_cache_s: float = Field(
        5.0, ge=0, description="the API's /metrics re-counts rollouts and jobs at most this often"
    )
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

    @property
    def proxy_admin_bases(self) -> list[str]:
        """Base URLs of the proxies a policy update pauses, resumes and stamps."""
        if self.proxy_admin_urls:
            return [url.rstrip("/") for url in self.proxy_admin_urls]
        return [f"http://{self.proxy_host}:{self.proxy_port}"]

    @property
    def proxy_seq_redis_url(self) -> str | None:
        """The Redis of the shared per-rollout call counter, None when the proxy counts alone."""
        return self._proxy_redis if self._proxy_shared else None

    @property
    def proxy_sticky_redis_url(self) -> str | None:
        """The Redis where rollouts' backend bindings are shared, None when the proxy is alone."""
        return self._proxy_redis if self._proxy_shared else None

    @property
    def _proxy_shared(self) -> bool:
        """Several proxy processes (`--workers`) or instances (more than one admin URL: the
        list the API pauses around a weight update) serve one rollout's calls: its call order
        and its backend must be kept where all of them see it."""
        if self.proxy_shared_seq is not None:
            return self.proxy_shared_seq
        return self.proxy_workers > 1 or len(self.proxy_admin_urls) > 1

    @property
    def _proxy_redis(self) -> str | None:
        """The Redis the proxy shares state in: its own, else a Redis broker's, else none."""
        if self.proxy_redis_url:
            return self.proxy_redis_url
        return self.broker_url if self.broker_url.startswith(("redis://", "rediss://")) else None

    @property
    def call_receipts_redis_url(self) -> str | None:
        """The Redis of call receipts (`polar_mq.capability.receipts`), None when they are off."""
        if self.proxy_call_receipts is False:
            return None
        return self._proxy_redis

    @property
    def proxy_spill_path(self) -> Path | None:
        """The proxy's spill directory, or None when spilling is off (max bytes 0)."""
        if self.proxy_spill_max_bytes == 0:
            return None
        if self.proxy_spill_dir is not None:
            return self.proxy_spill_dir
        return Path.home() / ".cache" / "polar_mq" / "proxy-spill" / str(self.proxy_port)

    def agent_token_ttl_s(self, timeouts: TimeoutSpec) -> int:
        """Life of an agent's rollout token: the job's own time limits plus a short grace.

        The agent is killed after `agent_s` (capped by `max_agent_timeout_s`) and never runs past
        the whole-rollout budget `rollout_s`, so a token valid longer than that only serves a
        process that should be dead. `rollout_token_ttl_s` stays the upper bound.
        """
        limit = min(timeouts.agent_s, self.max_agent_timeout_s)
        if timeouts.rollout_s is not None:
            limit = min(limit, timeouts.rollout_s)
        return min(self.rollout_token_ttl_s, math.ceil(limit) + TOKEN_GRACE_S)

    @field_validator(
        "upstream_urls", "proxy_admin_urls", "import_allowlist", "local_hidden_paths", mode="before"
    )
    @classmethod
    def _split_urls(cls, value: Any) -> Any:
        """`POLAR_MQ_UPSTREAM_URLS` (and the other lists) as a JSON list or comma-separated."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return orjson.loads(text)
            return [url.strip() for url in text.split(",") if url.strip()]
        return value

    @field_validator("local_hidden_paths")
    @classmethod
    def _absolute_paths(cls, value: list[Path]) -> list[Path]:
        """Relative paths would depend on each worker's directory; `/` would hide everything."""
        for path in value:
            if not path.is_absolute() or path == Path("/"):
                raise ValueError(
                    f"POLAR_MQ_LOCAL_HIDDEN_PATHS: {str(path)!r} must be an absolute path below /"
                )
        return value

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.strip().upper()
        if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError(f"unknown log level {value!r}; use debug, info, warning or error")
        return level

    @field_validator("proxy_admin_token", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        """An empty admin token would let anyone in with `Authorization: Bearer`: it means none."""
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> Settings:
        problems = security_problems(self)
        if self.is_production and self.database_url.startswith("sqlite"):
            problems.append("production needs PostgreSQL (POLAR_MQ_DATABASE_URL)")
        if self.is_production and self.unsafe_root_agents:
            problems.append("POLAR_MQ_UNSAFE_ROOT_AGENTS is for development only")
        if self._proxy_shared and self.proxy_seq_redis_url is None:
            problems.append(
                "the proxy's call order across processes (POLAR_MQ_PROXY_WORKERS > 1, several "
                "POLAR_MQ_PROXY_ADMIN_URLS or POLAR_MQ_PROXY_SHARED_SEQ) needs Redis: set "
                "POLAR_MQ_PROXY_REDIS_URL (or a redis:// POLAR_MQ_BROKER_URL)"
            )
        if self.proxy_call_receipts and self.call_receipts_redis_url is None:
            problems.append("POLAR_MQ_PROXY_CALL_RECEIPTS needs POLAR_MQ_PROXY_REDIS_URL")
        if self.visibility_timeout_s <= self.max_agent_timeout_s:
            problems.append(
                "POLAR_MQ_VISIBILITY_TIMEOUT_S must exceed POLAR_MQ_MAX_AGENT_TIMEOUT_S, otherwise "
                "the broker redelivers a running agent stage"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


def describe_config_error(exc: ValidationError) -> str:
    """One line naming what to fix, for a process that refuses to start (no traceback)."""
    parts = []
    for error in exc.errors():
        message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
        field = ".".join(str(part) for part in error.get("loc", ()))
        parts.append(f"POLAR_MQ_{field.upper()}: {message}" if field else message)
    return "; ".join(parts) or str(exc).replace("\n", " ")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Settings from the environment, built once per process on first use (not at import)."""
    return Settings()
