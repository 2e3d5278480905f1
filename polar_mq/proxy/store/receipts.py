"""The proxy's half of call receipts (`polar_mq.capability.receipts`): count a call before numbering
it.

`number_call` is what both call paths (the OpenAI routes and the other API families) use to get
a call's `seq`: for a token that asks for receipts it first increments the attempt's `started`
counter in Redis, so a call is counted before it is numbered and served, and a call refused
here (Redis unreachable, or no receipt store configured) gets a retryable 503 before it has a
number: the stage waiting for the attempt's calls never waits for it, and the seqs stay
gap-free. A call counted and then refused a number (`seq`: the order store or the database it
seeds from unreachable) has its count taken back. The writer thread's half (the `stored` set)
is `call_receipts.record_stored`; `HurryListener` lets a waiting stage cut the writer's batching
wait short.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

import redis as sync_redis
import redis.asyncio as redis
from redis.exceptions import RedisError

from polar_mq.capability.receipts import (
    HURRY_CHANNEL,
    REDIS_TIMEOUT_S,
    TTL_S,
    connect,
    record_stored,
    started_key,
)
from polar_mq.capability.tokens import RolloutClaim
from polar_mq.proxy.backends.pool import BackendUnavailable
from polar_mq.proxy.redis_client import async_redis
from polar_mq.proxy.store.seq import Sequencer

logger = logging.getLogger(__name__)


class StartCounter:
    """Increments attempts' `started` counters (one pipelined round trip per call).

    Redis may be away for seconds (the broker restarting, a failover): a call then waits up to
    `retry_s` for it, retrying with a growing pause, before it is refused with a 503. An agent's
    call must not fail on a blip the platform recovers from, and harnesses rarely retry a 503.
    A retry after a reply lost on the way may count a call twice: the stage then waits its
    deadline for a call that never comes and falls back to the flush (slower, never wrong).
    """

    RETRY_PAUSE_S = (0.05, 1.0)
    """First and longest pause between attempts while Redis is unreachable."""

    def __init__(self, client: redis.Redis, retry_s: float = 0.0) -> None:
        self._client = client
        self._retry_s = retry_s
        self._failing = False

    @classmethod
    def from_url(cls, url: str, retry_s: float = 0.0) -> StartCounter:
        return cls(async_redis(url), retry_s)

    async def start(self, rollout_id: uuid.UUID, attempt: int) -> None:
        key = started_key(rollout_id, attempt)
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self._retry_s
        pause, longest = self.RETRY_PAUSE_S
        while True:
            try:
                async with self._client.pipeline(transaction=False) as pipe:
                    pipe.incr(key)
                    pipe.expire(key, TTL_S)
                    await pipe.execute()
                break
            except (RedisError, OSError) as exc:
                if not self._failing:
                    logger.error("call receipts (Redis) unreachable: %r", exc)
                self._failing = True
                if loop.time() + pause > give_up_at:
                    raise BackendUnavailable(
                        "the call receipt store is unreachable; retry shortly",
                        "receipts_unavailable",
                        1,
                    ) from exc
                await asyncio.sleep(pause)
                pause = min(pause * 2, longest)
        if self._failing:
            logger.warning("call receipts (Redis) reachable again")
            self._failing = False

    async def unstart(self, rollout_id: uuid.UUID, attempt: int) -> None:
        """Take back a count whose call was refused before it had a number (best effort: a
        count left behind only makes the stage wait its deadline, then flush)."""
        try:
            await self._client.decr(started_key(rollout_id, attempt))
        except (RedisError, OSError) as exc:
            logger.warning("call receipts: a refused call stays counted: %r", exc)

    async def aclose(self) -> None:
        await self._client.aclose()


async def number_call(seqs: Sequencer, receipts: StartCounter | None, claim: RolloutClaim) -> int:
    """The call's seq, counted first when its token asks for receipts; `BackendUnavailable`
    (a retryable 503) when either cannot be had."""
    if claim.receipts and claim.attempt is not None:
        if receipts is None:
            raise BackendUnavailable(
                "this rollout's calls must be counted (call receipts) but the proxy has no "
                "Redis for them (POLAR_MQ_PROXY_REDIS_URL or a redis:// broker)",
                "receipts_unavailable",
                1,
            )
        await receipts.start(claim.rollout_id, claim.attempt)
        try:
            return await seqs.next(claim.rollout_id, claim.attempt)
        except BackendUnavailable:  # refused after all: the stage must not wait for it
            await receipts.unstart(claim.rollout_id, claim.attempt)
            raise
    return await seqs.next(claim.rollout_id, claim.attempt or 1)  # as `new_call` stores it


class StoredReceipts:
    """The writer thread's half: committed rows into their attempts' `stored` sets.

    Runs on the writer thread with its own synchronous client. A failure is logged (once per
    outage) and otherwise ignored: the rows are stored, only their receipt is missing, and the
    waiting stage falls back to a flush after its deadline.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._client: sync_redis.Redis | None = None
        self._failing = False

    def record(self, rows: list[dict[str, Any]]) -> None:
        try:
            if self._client is None:
                self._client = connect(self._url)
            record_stored(self._client, rows)
        except (RedisError, OSError) as exc:
            if not self._failing:
                logger.error("call receipts not recorded (Redis unreachable): %r", exc)
            self._failing = True
            return
        if self._failing:
            logger.warning("call receipts recorded again")
            self._failing = False

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


class HurryListener:
    """Cuts the writer's batching wait short when a stage waits for receipts (`call_receipts`).

    The writer lingers `log_flush_interval_s` after a first row to batch more: cheap per call,
    but the last calls of an agent that just exited would wait out that linger. A stage whose
    receipts do not add up yet publishes on `HURRY_CHANNEL`; every proxy process listening
    here pokes its writer, which commits what it holds at once. Best effort: while Redis is
    unreachable the listener retries each second and the writer keeps its pace.

    It listens on its own daemon thread with the synchronous client, reading for at most
    `POLL_S` at a time between looks at a stop flag, so stopping never depends on cancelling a
    read: redis-py's asyncio pubsub could swallow a cancel that arrived while it subscribed (a
    stop right after the start), and the proxy process then never finished its shutdown.
    """

    POLL_S = 0.25
    """Longest read between looks at the stop flag: what a stop may wait, 4 idle wake-ups/s."""

    def __init__(self, url: str, hurry: Callable[[], None], poll_s: float = POLL_S) -> None:
        self._url = url
        self._hurry = hurry
        self._poll_s = poll_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._listen, name="receipts-hurry", daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        failing = False
        while not self._stopping.is_set():
            client = connect(self._url)
            try:
                with client.pubsub(ignore_subscribe_messages=True) as pubsub:
                    pubsub.subscribe(HURRY_CHANNEL)
                    failing = False
                    while not self._stopping.is_set():
                        if pubsub.get_message(timeout=self._poll_s) is not None:
                            self._hurry()
            except (RedisError, OSError) as exc:
                if not failing:
                    logger.warning("call receipts: hurry channel lost, retrying: %r", exc)
                failing = True
            finally:
                client.close()
            self._stopping.wait(1.0)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    async def stop(self) -> None:
        """Stop listening; waits for the thread at most one read and one Redis timeout (the
        thread is a daemon: a Redis that stopped answering cannot hold the process)."""
        self._stopping.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, self._poll_s + 2 * REDIS_TIMEOUT_S)
