"""Which backend each recent rollout is bound to (its prefix cache lives there).

An LRU map bounded in size and age: a rollout idle for `ttl_s`, or pushed out by `max_rollouts`
more recent ones, is simply routed again as a new rollout. Each backend counts the rollouts bound
to it, which breaks ties between equally loaded backends for new rollouts.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict

from polar_mq.proxy.backends.backend import Backend


class StickyMap:
    def __init__(self, max_rollouts: int, ttl_s: float) -> None:
        if max_rollouts < 1 or ttl_s <= 0:
            raise ValueError("max_rollouts must be >= 1 and ttl_s > 0")
        self._map: OrderedDict[uuid.UUID, tuple[Backend, float]] = OrderedDict()
        self._max = max_rollouts
        self._ttl_s = ttl_s

    def __len__(self) -> int:
        return len(self._map)

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
