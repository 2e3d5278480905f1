"""One upstream inference server: its pooled connection, load, health and weight-update state."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx

from polar_mq.infra.tls import client_ssl_context
from polar_mq.proxy.backends.breaker import CircuitBreaker
from polar_mq.proxy.backends.rendezvous import hash_key
from polar_mq.proxy.backends.upstream_conn import StaleConnection
from polar_mq.proxy.backends.upstream_pool import UpstreamPool

UPSTREAM_LIMITS = httpx.Limits(max_connections=64, max_keepalive_connections=16)
"""The httpx client's pool: the control requests (health checks, `/v1/models`, weight loads).
Calls and the small requests on a call's path (`/tokenize`) go through the backend's own
keep-alive pool, `upstream_pool`."""
UPSTREAM_TIMEOUT = httpx.Timeout(connect=10.0, read=1800.0, write=60.0, pool=None)
"""No pool timeout (calls queue for a connection); a generous read timeout for long generations."""
SMALL_HEADERS = {"content-type": "application/json"}
NAME_MAX = 200
"""The `llm_calls.backend` column width."""


@dataclass(frozen=True, slots=True)
class SmallAnswer:
    """An engine's whole answer to a small request (`Backend.post_small`)."""

    status_code: int
    content_type: str | None
    content: bytes


def _nothing() -> None:
    pass


def upstream_base_url(url: str) -> str:
    """The engine's root URL; a trailing `/v1` (as in OpenAI base URLs) is tolerated."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    failure_threshold: int = 5
    cooldown_s: float = 10.0


class Backend:
    """An engine the proxy forwards to. All state lives on the event loop: no locks needed.

    `in_flight` counts calls dispatched here whose upstream response is not closed yet (for
    least-loaded routing and for draining before a weight update). `paused` holds new calls back;
    `draining` takes no new rollouts but keeps serving its sticky ones; `removed` takes nothing.
    """

    def __init__(
        self,
        name: str,
        url: str,
        paths: tuple[str, ...],
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        weight: float = 1.0,
        policy_version: int = 0,
        breaker: BreakerPolicy | None = None,
        max_in_flight: int = 0,
    ) -> None:
        if not name or len(name) > NAME_MAX:
            raise ValueError(f"a backend name must have 1..{NAME_MAX} characters")
        if weight <= 0:
            raise ValueError("a backend weight must be > 0")
        self.name = name
        self.url = upstream_base_url(url)
        base = httpx.URL(self.url)
        if base.scheme not in ("http", "https") or not base.host:
            raise ValueError(f"backend URL {url!r} is not an http(s) URL")
        self.weight = weight
        self.hash_key = hash_key(name)
        """Keys the rendezvous hash: the same name ranks the same in every proxy process."""
        self.max_in_flight = max_in_flight
        """At this many calls in flight (in this process) it takes no new rollouts; 0: no limit."""
        self.policy_version = policy_version
        policy = breaker or BreakerPolicy()
        self.breaker = CircuitBreaker(policy.failure_threshold, policy.cooldown_s)
        self.transport: httpx.AsyncBaseTransport = transport or httpx.AsyncHTTPTransport(
            limits=UPSTREAM_LIMITS, trust_env=False
        )
        self.client = httpx.AsyncClient(
            base_url=self.url,
            transport=self.transport,
            timeout=UPSTREAM_TIMEOUT,
            trust_env=False,
            verify=client_ssl_context(),
        )
        self.urls = {path: httpx.URL(self.url + path) for path in paths}
        """Upstream URL per forwarded API path, parsed once (for an injected transport)."""
        self.upstream: UpstreamPool | None = (
            UpstreamPool(self.url, paths) if transport is None else None
        )
        """The generate calls' keep-alive pool; None: they go through the injected transport."""
        self.in_flight = 0
        self.waiting = 0
        """Calls held by a pause."""
        self.served = 0
        self.failures = 0
        self.sticky_rollouts = 0
        self.draining = False
        self.removed = False
        self.last_health: str | None = None
        self.adapter: str | None = None
        """The LoRA adapter (`lora_name`) new calls here are served by; None: the base model."""
        self.adapter_error: str | None = None
        """Why this backend does not carry the current adapter (a failed or pending load): it
        takes no call until it does (`polar_mq.proxy.adapters`), never serving old weights."""
        self.loading: dict[str, asyncio.Future[str | None]] = {}
        """Loads under way here, by adapter name (`adapters.load_on` sends each once)."""
        self.loaded: set[str] = set()
        """Adapters this process loaded here (unloaded once no call can still use them)."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._resumed = asyncio.Event()
        self._resumed.set()

    @property
    def paused(self) -> bool:
        return not self._resumed.is_set()

    def usable(self) -> bool:
        """May serve a call now (its sticky rollouts included)."""
        return not self.removed and self.adapter_error is None and self.breaker.available()

    def at_capacity(self) -> bool:
        return 0 < self.max_in_flight <= self.in_flight

    def acquire(self) -> None:
        self.in_flight += 1
        self._idle.clear()
        self.breaker.on_dispatch()

    def release(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    def pause(self) -> None:
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    async def wait_resumed(self) -> None:
        await self._resumed.wait()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def post_small(self, path: str, content: bytes) -> SmallAnswer:
        """A small JSON request on a call's path (`/tokenize`), its answer read whole.

        Through the own keep-alive pool, like the generate calls (a generic client cost more CPU
        than the tokenizing it asks for); through the httpx client only where a transport was
        injected (tests). A pooled connection the engine had closed is retried once on a new
        one. Raises `httpx.HTTPError` (connect, read and protocol errors) on either path.
        """
        if self.upstream is None:
            answer = await self.client.post(path, content=content, headers=SMALL_HEADERS)
            return SmallAnswer(
                answer.status_code, answer.headers.get("content-type"), answer.content
            )
        try:
            response = await self.upstream.post(path, content, _nothing)
        except StaleConnection:
            response = await self.upstream.post(path, content, _nothing)
        try:
            body = await response.aread()
        finally:
            response.close()
        return SmallAnswer(response.status_code, response.headers.get("content-type"), body)

    async def aclose(self) -> None:
        await self.client.aclose()
        if self.upstream is not None:
            self.upstream.close()

    def snapshot(self) -> dict[str, Any]:
        """The admin view of this backend."""
        return {
            "name": self.name,
            "url": self.url,
            "weight": self.weight,
            "policy_version": self.policy_version,
            "paused": self.paused,
            "draining": self.draining,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "waiting": self.waiting,
            "served": self.served,
            "failures": self.failures,
            "sticky_rollouts": self.sticky_rollouts,
            "breaker": self.breaker.state,
            "breaker_opened": self.breaker.times_opened,
            "last_health": self.last_health,
            "adapter": self.adapter,
            "adapter_error": self.adapter_error,
        }
