"""The set of backends behind the proxy and the routing decision for each call.

A rollout sticks to the backend it first used (its KV prefix cache is there); it is routed again
only when that backend is out (breaker open, removed) or its binding expired. A new rollout goes
to its first backend in rendezvous-hash order (`rendezvous`), the same one in every proxy
process and instance; only when that one is draining, out, paused or at its in-flight limit does
it spill over to the next in that order (so the spill-over is deterministic too). A call bound
for a paused backend waits for the resume, at most `pause_max_wait_s`, then gets a retryable 503.
Backends can be added, drained (no new rollouts), removed, paused and resumed, and given a policy
version, while the proxy runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import uuid
from collections.abc import Iterable
from typing import Any

import httpx
from starlette.responses import Response

from polar_mq.config import Settings
from polar_mq.policy.weights import Adapter
from polar_mq.proxy.backends.backend import (
    UPSTREAM_TIMEOUT,
    Backend,
    BreakerPolicy,
    upstream_base_url,
)
from polar_mq.proxy.backends.rendezvous import ranked
from polar_mq.proxy.backends.sticky import SharedBindings, StickyMap
from polar_mq.proxy.errors import openai_error


class BackendUnavailable(Exception):
    """No backend can take the call now: a retryable 503 with `Retry-After`, nothing forwarded."""

    def __init__(self, message: str, code: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.code = code
        self.retry_after_s = retry_after_s

    def response(self) -> Response:
        response = openai_error(503, str(self), "server_error", self.code)
        response.headers["retry-after"] = str(max(1, math.ceil(self.retry_after_s)))
        return response


class BackendPool:
    def __init__(
        self,
        paths: tuple[str, ...],
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        breaker: BreakerPolicy | None = None,
        sticky: StickyMap | None = None,
        pause_max_wait_s: float = 30.0,
        max_attempts: int = 3,
        max_in_flight: int = 0,
        shared: SharedBindings | None = None,
    ) -> None:
        self.paths = paths
        self.shared = shared
        """Bindings shared with the other proxies of the rollouts (`sticky.SharedBindings`)."""
        self.backends: dict[str, Backend] = {}
        self.sticky = sticky or StickyMap(100_000, 3600.0)
        self.pause_max_wait_s = pause_max_wait_s
        self.max_attempts = max_attempts
        self.max_in_flight = max_in_flight
        self.timeouts: dict[str, Any] = {"timeout": UPSTREAM_TIMEOUT.as_dict()}
        """Request extensions carrying the upstream timeouts (the hot path bypasses the client)."""
        self._transport = transport
        self._breaker = breaker or BreakerPolicy()
        self._closing: set[asyncio.Task[None]] = set()
        self._retired: list[Backend] = []
        self.adapter: Adapter | None = None
        """The LoRA adapter every backend must carry before it serves (`proxy.adapters`)."""

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        paths: tuple[str, ...],
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> BackendPool:
        """`upstream_urls` when given, else the single `upstream_url`; each named by its URL."""
        pool = cls(
            paths,
            transport=transport,
            breaker=BreakerPolicy(settings.breaker_failures, settings.breaker_cooldown_s),
            sticky=StickyMap(settings.sticky_rollouts_max, settings.sticky_ttl_s),
            pause_max_wait_s=settings.pause_max_wait_s,
            max_attempts=settings.upstream_max_attempts,
            max_in_flight=settings.upstream_max_in_flight,
            shared=(
                SharedBindings.from_url(settings.proxy_sticky_redis_url, settings.sticky_ttl_s)
                if settings.proxy_sticky_redis_url
                else None
            ),
        )
        for url in settings.upstream_urls or [settings.upstream_url]:
            pool.add(url)
        return pool

    @property
    def primary(self) -> Backend:
        """The first backend still in the pool (for calls that need just any backend)."""
        for backend in self.backends.values():
            if backend.usable():
                return backend
        return next(iter(self.backends.values()))

    def add(
        self,
        url: str,
        name: str | None = None,
        weight: float = 1.0,
        policy_version: int = 0,
    ) -> Backend:
        name = name or upstream_base_url(url)
        if name in self.backends:
            raise ValueError(f"a backend named {name!r} already exists")
        backend = Backend(
            name,
            url,
            self.paths,
            transport=self._transport,
            weight=weight,
            policy_version=policy_version,
            breaker=self._breaker,
            max_in_flight=self.max_in_flight,
        )
        if self.adapter is not None:  # out of rotation until it carries the current adapter
            backend.adapter_error = f"adapter {self.adapter.name} not loaded yet"
        self.backends[name] = backend
        return backend

    def get(self, name: str) -> Backend:
        """The backend called `name`; `KeyError` (with a message) when there is none."""
        backend = self.backends.get(name)
        if backend is None:
            raise KeyError(f"no backend named {name!r}")
        return backend

    def select(self, name: str | None) -> list[Backend]:
        """One named backend, or all of them."""
        return list(self.backends.values()) if name is None else [self.get(name)]

    def remove(self, name: str) -> Backend:
        """Take a backend out now: no new calls; its in-flight calls finish, then it is closed."""
        backend = self.get(name)
        if len(self.backends) == 1:
            raise ValueError("cannot remove the last backend (add its replacement first)")
        backend.removed = True
        del self.backends[name]
        self.sticky.forget_backend(backend)
        backend.resume()  # calls waiting on it re-route
        self._retired.append(backend)
        task = asyncio.ensure_future(self._close_when_idle(backend))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        return backend

    async def _close_when_idle(self, backend: Backend) -> None:
        await backend.wait_idle()
        await backend.aclose()

    async def wait_drained(self, backends: Iterable[Backend], timeout_s: float) -> bool:
        """Wait until none of `backends` has a call in flight; False if `timeout_s` passed first."""
        waits = [b.wait_idle() for b in backends]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), timeout_s)
        except TimeoutError:
            return False
        return True

    async def choose(self, rollout_id: uuid.UUID, tried: tuple[Backend, ...] = ()) -> Backend:
        """The backend for this call (waiting out a pause); raises `BackendUnavailable`.

        `tried` are the backends that already failed this call: a retry goes elsewhere and does
        not rebind the rollout (a single failure does not move it; an open breaker does).
        """
        shared = self.shared if not tried else None
        before = await self._adopt_shared(rollout_id, shared) if shared is not None else None
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while True:
            backend = self._pick(rollout_id, tried)
            if shared is not None:
                bound = self.sticky.peek(rollout_id)
                if bound is not None and bound is not before:  # bound here: tell the others
                    await shared.put(rollout_id, bound.name)
                    before, shared = bound, None
            if backend is None:
                wait = min((b.breaker.retry_after_s() for b in self.backends.values()), default=1)
                raise BackendUnavailable(
                    "no inference backend is available", "backend_unavailable", wait
                )
            if not backend.paused:
                return backend
            if deadline is None:
                deadline = loop.time() + self.pause_max_wait_s
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise BackendUnavailable(
                    "inference is paused for a weight update; retry shortly", "backend_paused", 1
                )
            backend.waiting += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(backend.wait_resumed(), remaining)
            finally:
                backend.waiting -= 1

    async def _adopt_shared(self, rollout_id: uuid.UUID, shared: SharedBindings) -> Backend | None:
        """The binding another proxy made, taken over when this one has no usable binding of
        its own; returns what is bound here now."""
        known = self.sticky.get(rollout_id)
        if known is not None and known.usable():
            return known
        name = await shared.get(rollout_id)
        theirs = self.backends.get(name) if name else None
        if theirs is not None and theirs is not known and theirs.usable():
            self.sticky.bind(rollout_id, theirs)
            return theirs
        return known

    def _pick(self, rollout_id: uuid.UUID, tried: tuple[Backend, ...]) -> Backend | None:
        bound = self.sticky.get(rollout_id)
        if bound is not None and bound not in tried and bound.usable():
            return bound
        best = self._first_choice(rollout_id, tried)
        if best is not None and not tried:
            self.sticky.bind(rollout_id, best)
        return best

    def _first_choice(self, rollout_id: uuid.UUID, tried: tuple[Backend, ...]) -> Backend | None:
        """The rollout's first backend in rendezvous order that can take it now.

        Passed over, in order: draining, failed for this call, breaker open, then paused or at
        capacity (taken only when every usable one is); the same answer in every process that
        sees the same backends.
        """
        candidates = [
            b for b in self.backends.values() if not b.draining and b not in tried and b.usable()
        ]
        if len(candidates) <= 1:
            return candidates[0] if candidates else None
        order = ranked(rollout_id, candidates)
        for backend in order:
            if not backend.paused and not backend.at_capacity():
                return backend
        for backend in order:  # all paused or full: a full one (queues) before a paused one
            if not backend.paused:
                return backend
        return order[0]

    def snapshot(self) -> dict[str, Any]:
        return {
            "backends": [b.snapshot() for b in self.backends.values()],
            "sticky_rollouts": len(self.sticky),
            "pause_max_wait_s": self.pause_max_wait_s,
            "routing": "rendezvous",
        }

    async def aclose(self) -> None:
        if self.shared is not None:
            await self.shared.aclose()
        for task in list(self._closing):
            task.cancel()
        for backend in [*self.backends.values(), *self._retired]:
            await backend.aclose()
