"""Each rollout's call sequence numbers (`llm_calls.seq`): the order its calls arrived in.

Every reader orders a rollout's calls by `seq` (the trajectory builders, the evaluators' "last
call", the run-agent outcome, the API and the dashboard), and the prefix-merge builder indexes
calls by it, so seqs must be distinct, gap-free from 0 and in arrival order.

`LocalSeq` counts in the process: exact while one proxy process serves all of a rollout's calls.
With several processes (`--workers N`) or several proxy instances, one rollout's calls reach
different counters, which would hand out the same numbers; `RedisSeq` counts in Redis instead
(one `INCR` per call, pipelined with its `EXPIRE`, one round trip), exact across all of them.
If Redis cannot be reached the call is refused with a retryable 503 (`sequence_unavailable`)
rather than stored with a number that may collide.
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from typing import Protocol

import redis.asyncio as redis
from redis.exceptions import RedisError

from polar_mq.config import Settings
from polar_mq.proxy.backends.pool import BackendUnavailable
from polar_mq.proxy.redis_client import async_redis

logger = logging.getLogger(__name__)

SEQ_ROLLOUTS_MAX = 100_000
KEY_PREFIX = "polar_mq:seq:"


class Sequencer(Protocol):
    async def next(self, rollout_id: uuid.UUID) -> int:
        """The call's seq; raises `BackendUnavailable` (a retryable 503) when it cannot say."""
        ...

    async def aclose(self) -> None: ...


class LocalSeq:
    """Per-rollout counters in this process, for the most recently active rollouts (LRU).

    A rollout evicted after `max_rollouts` newer ones were seen restarts at 0; the builders order
    calls by (seq, created_at), so that only matters for rollouts idle through that many others.
    """

    def __init__(self, max_rollouts: int = SEQ_ROLLOUTS_MAX) -> None:
        self._next: OrderedDict[uuid.UUID, int] = OrderedDict()
        self._max = max_rollouts

    def take(self, rollout_id: uuid.UUID) -> int:
        seq = self._next.get(rollout_id, 0)
        self._next[rollout_id] = seq + 1
        self._next.move_to_end(rollout_id)
        if len(self._next) > self._max:
            self._next.popitem(last=False)
        return seq

    async def next(self, rollout_id: uuid.UUID) -> int:
        return self.take(rollout_id)

    async def aclose(self) -> None:
        return None


class RedisSeq:
    """Per-rollout counters in Redis, shared by every proxy process and instance using it.

    A counter lives `ttl_s` after its rollout's last call (longer than any rollout token), so
    Redis holds one small key per recently active rollout.
    """

    def __init__(self, client: redis.Redis, ttl_s: int) -> None:
        self._client = client
        self._ttl_s = ttl_s
        self._failing = False

    @classmethod
    def from_url(cls, url: str, ttl_s: int) -> RedisSeq:
        return cls(async_redis(url), ttl_s)

    async def next(self, rollout_id: uuid.UUID) -> int:
        key = KEY_PREFIX + rollout_id.hex
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.incr(key)
                pipe.expire(key, self._ttl_s)
                count, _ = await pipe.execute()
        except (RedisError, OSError) as exc:
            if not self._failing:
                logger.error("call order store (Redis) unreachable: refusing calls: %r", exc)
            self._failing = True
            raise BackendUnavailable(
                "the call order store is unreachable; retry shortly", "sequence_unavailable", 1
            ) from exc
        if self._failing:
            logger.warning("call order store (Redis) reachable again")
            self._failing = False
        return int(count) - 1

    async def aclose(self) -> None:
        await self._client.aclose()


def sequencer(settings: Settings) -> Sequencer:
    """Redis counters when the settings ask for a shared order, else this process's own."""
    url = settings.proxy_seq_redis_url
    if url is None:
        return LocalSeq()
    return RedisSeq.from_url(url, settings.rollout_token_ttl_s + 3600)
