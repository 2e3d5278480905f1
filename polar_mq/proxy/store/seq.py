"""Each rollout attempt's call sequence numbers (`llm_calls.seq`): the order its calls arrived in.

Every reader orders an attempt's calls by `seq` (the trajectory builders, the evaluators' "last
call", the run-agent outcome, the API and the dashboard), and the prefix-merge builder indexes
calls by it, so seqs must be distinct, gap-free from 0 and in arrival order, per (rollout,
attempt), across proxy restarts, `--workers N` and several proxy instances.

`LocalSeq` counts in the process: exact while one proxy process serves all of a rollout's calls.
With several processes (`--workers N`) or several proxy instances, one rollout's calls reach
different counters, which would hand out the same numbers; `RedisSeq` counts in Redis instead
(one script call per call, one round trip), exact across all of them. If Redis cannot be reached
the call is refused with a retryable 503 (`sequence_unavailable`) rather than stored with a
number that may collide.

Why a counter *seeded from the database* (`SeqFloor`), and not the other two designs:

A counter forgets: a proxy killed (kill -9, OOM) and restarted, a Redis restarted (it runs with no
persistence), a counter expired or evicted. Counting from 0 again then gave a rollout's calls
the seqs 0, 1, 0: its samples, the calls API and the answer fallback read the wrong order. So a
counter that does not know an attempt (a *miss*: its first call in this process, or the first
after Redis lost the key) asks the durable record where to go on: `max(seq) + 1` of the
attempt's stored calls. A miss happens once per attempt per process (one indexed read in a
thread, ~0.8 ms); every other call costs what it cost before (a dict lookup, or one Redis round
trip: a script now, measured no dearer than the pipeline it replaced; docs/benchmarks.md).

- The other durable counters: Redis with persistence is not guaranteed here, and a PostgreSQL
  row or sequence per rollout bumped by every call is a hot UPDATE, which the spec forbids.
- An epoch scheme, (proxy start epoch, local counter), needs no read, but seqs would no longer be
  gap-free from 0, so every reader (and `prefix_merge`, which indexes by seq) would have to order
  by a pair, and the API would show duplicate seqs.

What a database read cannot see, and how each case is covered:
- Rows the killed process still held in its writer queue are lost with it (kill -9 loses the
  queue; call receipts make the run-agent stage notice). Nothing stored carries their numbers, so
  reusing them collides with nothing: stored seqs stay distinct and in arrival order.
- Rows in a spill buffer (written while the database was down, replayed later, also by the next
  process, which adopts a dead one's spill directory) are not in the table yet: while this
  process holds spilled rows, or cannot read the database, a miss is refused with a retryable
  503 (`sequence_unavailable`) instead of numbered from a floor that may be too low. Calls of
  attempts whose counter is held (here, or in Redis) are never refused: a database outage only
  delays the first call of an attempt the counter does not know.
- Another live process's rows not in the table yet (its batching linger, ~50 ms, or its spill
  during an outage) could meet a miss in a second process only if the shared Redis lost the
  counter meanwhile (two faults at once).
- The database cannot check: a unique index on (rollout_id, attempt, seq) would have to hold
  the partition key `created_at` on the partitioned table, which makes it unique per instant,
  not per attempt; and the writer's `ON CONFLICT DO NOTHING` would then drop a colliding call.
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol

import redis.asyncio as redis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from polar_mq.config import Settings
from polar_mq.proxy.backends.pool import BackendUnavailable
from polar_mq.proxy.redis_client import async_redis

logger = logging.getLogger(__name__)

SEQ_ROLLOUTS_MAX = 100_000
KEY_PREFIX = "polar_mq:seq:"

SeqFloor = Callable[[uuid.UUID, int], Awaitable[int]]
"""The first seq an attempt's next call may take by the durable record (`seq_floor`); raises
`BackendUnavailable` when it cannot say."""

Key = tuple[uuid.UUID, int]


async def unknown_floor(rollout_id: uuid.UUID, attempt: int) -> int:
    """No durable record (a proxy without a database: tests, benchmarks): count from 0."""
    return 0


class Sequencer(Protocol):
    async def next(self, rollout_id: uuid.UUID, attempt: int) -> int:
        """The call's seq; raises `BackendUnavailable` (a retryable 503) when it cannot say."""
        ...

    async def aclose(self) -> None: ...


class LocalSeq:
    """Per-attempt counters in this process, for the most recently active attempts (LRU).

    An attempt it does not hold (never seen here, or evicted after `max_rollouts` newer ones) is
    seeded from `floor` before its call is numbered.
    """

    def __init__(
        self, max_rollouts: int = SEQ_ROLLOUTS_MAX, floor: SeqFloor = unknown_floor
    ) -> None:
        self._next: OrderedDict[Key, int] = OrderedDict()
        self._max = max_rollouts
        self._floor = floor

    def take(self, key: Key, at_least: int = 0) -> int:
        seq = max(self._next.get(key, 0), at_least)
        self._next[key] = seq + 1
        self._next.move_to_end(key)
        if len(self._next) > self._max:
            self._next.popitem(last=False)
        return seq

    async def next(self, rollout_id: uuid.UUID, attempt: int) -> int:
        key = (rollout_id, attempt)
        if key in self._next:
            return self.take(key)
        floor = await self._floor(rollout_id, attempt)
        return self.take(key, floor)  # a call numbered during the read counts too: max()

    async def aclose(self) -> None:
        return None


_NEXT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local n = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[1])
return n
"""
"""A known counter's next number (+1), or -1 on a miss (the key is then left absent)."""

_SEEDED = """
local floor = tonumber(ARGV[2])
if tonumber(redis.call('GET', KEYS[1]) or '0') < floor then redis.call('SET', KEYS[1], floor) end
local n = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[1])
return n
"""
"""Raise the counter to at least the floor, then take a number: processes that missed together
each take their own number above the floor, whichever seeds first."""


class RedisSeq:
    """Per-attempt counters in Redis, shared by every proxy process and instance using it.

    A counter lives `ttl_s` after its attempt's last call (longer than any rollout token), so
    Redis holds one small key per recently active attempt; a counter Redis lost is re-seeded.
    """

    def __init__(self, client: redis.Redis, ttl_s: int, floor: SeqFloor = unknown_floor) -> None:
        self._client = client
        self._ttl_s = ttl_s
        self._floor = floor
        self._next = client.register_script(_NEXT)
        self._seeded = client.register_script(_SEEDED)
        self._failing = False

    @classmethod
    def from_url(cls, url: str, ttl_s: int, floor: SeqFloor = unknown_floor) -> RedisSeq:
        return cls(async_redis(url), ttl_s, floor)

    async def next(self, rollout_id: uuid.UUID, attempt: int) -> int:
        key = f"{KEY_PREFIX}{rollout_id.hex}:{attempt}"
        count = await self._run(self._next, key)
        if count < 0:
            floor = await self._floor(rollout_id, attempt)
            count = await self._run(self._seeded, key, floor)
        return count - 1

    async def _run(self, script: AsyncScript, key: str, *rest: int) -> int:
        try:
            count = await script(keys=[key], args=[self._ttl_s, *rest])
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
        return int(count)

    async def aclose(self) -> None:
        await self._client.aclose()


def sequencer(settings: Settings, floor: SeqFloor = unknown_floor) -> Sequencer:
    """Redis counters when the settings ask for a shared order, else this process's own; both
    seeded from `floor` (the database, when the proxy has one) on a miss."""
    url = settings.proxy_seq_redis_url
    if url is None:
        return LocalSeq(floor=floor)
    return RedisSeq.from_url(url, settings.rollout_token_ttl_s + 3600, floor)
