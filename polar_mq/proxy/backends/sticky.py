"""Which backend each recent rollout is bound to (its prefix cache lives there).

An LRU map bounded in size and age: a rollout idle for `ttl_s`, or pushed out by `max_rollouts`
more recent ones, is simply routed again as a new rollout. Each backend counts the rollouts bound
to it, which breaks ties between equally loaded backends for new rollouts.

`SharedBindings` keeps the bindings in Redis too, for proxies that share a rollout's calls
(`--workers N`, or several instances behind a balancer: `Settings.proxy_sticky_redis_url`). The
rendezvous order alone gives every proxy the same *first* choice, but a rollout moved off it
(its backend was out, paused or full in one proxy's view) was bound elsewhere in that proxy only:
once the backend was back, the other proxies sent the rollout's next calls to it, away from its
prefix cache (found on the namespace bed, `tests/multihost/test_shared_proxies.py`). The local
map stays the cache: Redis is read only when a proxy does not know the rollout or its binding is
unusable here, and written only when a proxy binds it, so a rollout costs one read and at most
one write per proxy process, not a round trip per call. Redis unreachable: routing falls back to
the local map and rendezvous (logged once), never refuses a call.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict

import redis.asyncio as redis
from redis.exceptions import RedisError

from polar_mq.proxy.backends.backend import Backend
from polar_mq.proxy.redis_client import async_redis

logger = logging.getLogger(__name__)

KEY_PREFIX = "polar_mq:sticky:"


class StickyMap:
    def __init__(self, max_rollouts: int, ttl_s: float) -> None:
        if max_rollouts < 1 or ttl_s <= 0:
            raise ValueError("max_rollouts must be >= 1 and ttl_s > 0")
        self._map: OrderedDict[uuid.UUID, tuple[Backend, float]] = OrderedDict()
        self._max = max_rollouts
        self._ttl_s = ttl_s

    def __len__(self) -> int:
        return len(self._map)

    def peek(self, rollout_id: uuid.UUID) -> Backend | None:
        """The rollout's backend as bound now (no expiry check, no LRU touch)."""
        entry = self._map.get(rollout_id)
        return entry[0] if entry is not None else None

    def get(self, rollout_id: uuid.UUID) -> Backend | None:
        """The rollout's backend if it has one that has not expired (and mark it recently used)."""
        entry = self._map.get(rollout_id)
        if entry is None:
            return None
        backend, seen = entry
        now = time.monotonic()
        if now - seen > self._ttl_s:
            self._drop(rollout_id)
            return None
        self._map[rollout_id] = (backend, now)
        self._map.move_to_end(rollout_id)
        return backend

    def bind(self, rollout_id: uuid.UUID, backend: Backend) -> None:
        """Bind the rollout to `backend` (replacing any earlier binding) and evict the stale."""
        if rollout_id in self._map:
            self._drop(rollout_id)
        backend.sticky_rollouts += 1
        now = time.monotonic()
        self._map[rollout_id] = (backend, now)
        while self._map:
            oldest, (_, seen) = next(iter(self._map.items()))
            if len(self._map) <= self._max and now - seen <= self._ttl_s:
                break
            self._drop(oldest)

    def forget_backend(self, backend: Backend) -> None:
        """Unbind every rollout of a removed backend (they are routed again on their next call)."""
        for rollout_id in [r for r, (b, _) in self._map.items() if b is backend]:
            self._drop(rollout_id)

    def _drop(self, rollout_id: uuid.UUID) -> None:
        backend, _ = self._map.pop(rollout_id)
        backend.sticky_rollouts -= 1


class SharedBindings:
    """Rollouts' backend names in Redis, for every proxy process and instance (module doc)."""

    def __init__(self, client: redis.Redis, ttl_s: float) -> None:
        self._client = client
        self._ttl_s = max(1, int(ttl_s))
        self._failing = False

    @classmethod
    def from_url(cls, url: str, ttl_s: float) -> SharedBindings:
        return cls(async_redis(url), ttl_s)

    async def get(self, rollout_id: uuid.UUID) -> str | None:
        """The backend another proxy bound the rollout to, if any (None when unreachable)."""
        try:
            name = await self._client.get(KEY_PREFIX + rollout_id.hex)
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return None
        self._ok()
        return name.decode() if isinstance(name, bytes) else name

    async def put(self, rollout_id: uuid.UUID, backend: str) -> None:
        try:
            await self._client.set(KEY_PREFIX + rollout_id.hex, backend, ex=self._ttl_s)
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return
        self._ok()

    async def aclose(self) -> None:
        await self._client.aclose()

    def _failed(self, exc: BaseException) -> None:
        if not self._failing:
            logger.error("shared rollout bindings (Redis) unreachable, routing alone: %r", exc)
        self._failing = True

    def _ok(self) -> None:
        if self._failing:
            logger.warning("shared rollout bindings (Redis) reachable again")
            self._failing = False
