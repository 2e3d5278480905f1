"""Call receipts: how the run-agent stage knows every call of an attempt is stored, with no
round trip to the proxy.

Without them the stage asks the proxy (`POST /admin/flush`, fanned out to every proxy process)
to store everything it holds, for every rollout, after each agent: an HTTP round trip that
every rollout pays. With them the proxy keeps two records per rollout attempt in Redis:

- `started`: a counter the proxy increments *before* it numbers a call (`seq`) and serves it,
  so by the time the agent has its answer (and can exit) the call is counted. If Redis cannot
  be reached the call is refused with a retryable 503 before it gets a number: a call the
  agent saw answered is always counted, a refused one never waits to be stored.
- `stored`: the set of the attempt's call ids committed to the database, added by the proxy's
  writer thread after each commit (also for spilled rows replayed later, by whichever process
  replays them), each addition followed by a push on the attempt's wake-up list.

After the agent exits, the stage waits (`wait_stored`: a blocking pop on the wake-up list, no
sleep loop) until `stored` holds at least `started` ids; if they do not add up at once it
publishes on `HURRY_CHANNEL` so the proxies' writers commit without their batching wait. A
set, not a counter, so a segment replayed twice (crash between commit and delete) never counts
a row twice. The wait has a
deadline; when it passes (a proxy killed with rows only in memory, a row the database refused,
Redis lost meanwhile, a call counted but then refused for lack of a number) the stage falls
back to the flush, which stays the source of truth. Receipts only ever make the stage faster.

Whether a rollout's calls are receipted is signed into its token (`tokens`): a proxy that
cannot record receipts refuses such calls rather than letting the stage trust a count nobody
kept.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

KEY_PREFIX = "polar_mq:calls:"
TTL_S = 24 * 3600
"""How long an attempt's receipts live after its last call: the stage reads them minutes later."""
REDIS_TIMEOUT_S = 2.0
HURRY_CHANNEL = "polar_mq:calls:hurry"
"""Published on by a stage whose receipts do not add up yet: the proxies' writers commit now."""


def started_key(rollout_id: uuid.UUID, attempt: int) -> str:
    return f"{KEY_PREFIX}{rollout_id.hex}:{attempt}:started"


def stored_key(rollout_id: uuid.UUID, attempt: int) -> str:
    return f"{KEY_PREFIX}{rollout_id.hex}:{attempt}:stored"


def wake_key(rollout_id: uuid.UUID, attempt: int) -> str:
    return f"{KEY_PREFIX}{rollout_id.hex}:{attempt}:wake"


def opened_key(rollout_id: uuid.UUID, attempt: int) -> str:
    return f"{KEY_PREFIX}{rollout_id.hex}:{attempt}:opened"


def open_attempt(client: redis.Redis, rollout_id: uuid.UUID, attempt: int) -> None:
    """Mark the attempt's receipts as kept from now on (before its agent starts).

    Redis keeps nothing on disk here: a restart while the agent runs empties `started` and
    `stored` alike, and the counts kept after it could add up while a counted call is still
    unstored. The mark goes with them, so `read` sees the loss (`intact` False) and the stage
    flushes the proxy instead of trusting them."""
    client.set(opened_key(rollout_id, attempt), b"1", ex=TTL_S)


def connect(url: str) -> redis.Redis:
    """A synchronous client that fails in seconds rather than hanging a stage or the writer."""
    return redis.Redis.from_url(
        url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
    )


def record_stored(client: redis.Redis, rows: Iterable[Mapping[str, Any]]) -> int:
    """Add committed rows to their attempts' `stored` sets and wake their waiters (one round
    trip for the whole batch); returns how many attempts were touched."""
    ids: dict[tuple[Any, int], list[str]] = {}
    for row in rows:
        attempt = row.get("attempt")
        if attempt is None:
            continue
        ids.setdefault((row["rollout_id"], int(attempt)), []).append(str(row["id"]))
    if not ids:
        return 0
    pipe = client.pipeline(transaction=False)
    for (rollout_id, attempt), call_ids in ids.items():
        rid = rollout_id if isinstance(rollout_id, uuid.UUID) else uuid.UUID(str(rollout_id))
        stored, wake = stored_key(rid, attempt), wake_key(rid, attempt)
        pipe.sadd(stored, *call_ids)
        pipe.expire(stored, TTL_S)
        pipe.rpush(wake, b"1")
        pipe.ltrim(wake, -1, -1)  # one pending wake-up is enough: the waiter re-reads the counts
        pipe.expire(wake, TTL_S)
    pipe.execute()
    return len(ids)


@dataclass(frozen=True, slots=True)
class Receipts:
    """What Redis says of an attempt: calls started, calls stored, wake-ups taken."""

    started: int
    stored: int
    wakeups: int = 0
    intact: bool = True
    """False when the attempt's mark (`open_attempt`) is gone: Redis lost the receipts."""

    @property
    def complete(self) -> bool:
        return self.intact and self.stored >= self.started


def read(client: redis.Redis, rollout_id: uuid.UUID, attempt: int) -> Receipts:
    pipe = client.pipeline(transaction=False)
    pipe.get(started_key(rollout_id, attempt))
    pipe.scard(stored_key(rollout_id, attempt))
    pipe.exists(opened_key(rollout_id, attempt))
    started, stored, opened = pipe.execute()
    return Receipts(int(started or 0), int(stored or 0), intact=bool(opened))


def wait_stored(
    client: redis.Redis, rollout_id: uuid.UUID, attempt: int, timeout_s: float
) -> Receipts:
    """Block until every started call of the attempt is stored, or `timeout_s` passed (then
    the last counts, `complete` False). Raises Redis errors: the caller falls back to a flush."""
    deadline = time.monotonic() + timeout_s
    wakeups = 0
    while True:
        receipts = read(client, rollout_id, attempt)
        left = deadline - time.monotonic()
        if receipts.complete or left <= 0 or not receipts.intact:  # lost: no use waiting
            return Receipts(receipts.started, receipts.stored, wakeups, receipts.intact)
        if wakeups == 0:  # the writers need not linger for more rows to batch: we wait
            client.publish(HURRY_CHANNEL, b"")
        # A push since `read` returns at once (no lost wake-up); each pop is kept under the
        # client's socket timeout, BLPOP's own timeout has a 1 ms resolution (Redis >= 6).
        block = min(left, REDIS_TIMEOUT_S / 2)
        client.blpop([wake_key(rollout_id, attempt)], timeout=max(block, 0.001))
        wakeups += 1
