"""Call sequence numbers: shared through Redis, exact across counters, refused when unreachable,
and seeded from the stored calls when a counter does not know an attempt (restart, lost key)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis
from proxy_support import proxy_settings, start_harness
from sqlalchemy import Engine, create_engine, insert

from polar_mq.capability.receipts import started_key
from polar_mq.capability.tokens import RolloutClaim
from polar_mq.config import Settings
from polar_mq.models import LlmCall
from polar_mq.proxy.backends import BackendUnavailable
from polar_mq.proxy.redis_client import POOL_CONNECTIONS
from polar_mq.proxy.store.receipts import StartCounter, number_call
from polar_mq.proxy.store.seq import KEY_PREFIX, LocalSeq, RedisSeq, SeqFloor, sequencer
from polar_mq.proxy.store.seq_floor import db_seq_floor
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.anyio

BODY = {"model": "m", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}


async def test_two_counters_on_one_redis_number_a_rollout_as_one() -> None:
    """Two proxy processes (two clients) serving one rollout's calls in turn."""
    first, second = RedisSeq.from_url(REDIS_URL, 60), RedisSeq.from_url(REDIS_URL, 60)
    rollout, other = uuid.uuid4(), uuid.uuid4()
    try:
        taken = [await (first, second)[i % 3 % 2].next(rollout, 1) for i in range(7)]
        assert taken == list(range(7))
        assert await second.next(other, 1) == 0  # per rollout
        assert await second.next(rollout, 2) == 0  # per attempt
        ttl = redis.Redis.from_url(REDIS_URL).ttl(f"{KEY_PREFIX}{rollout.hex}:1")
        assert 0 < ttl <= 60  # the counter does not outlive its rollout for long
    finally:
        await first.aclose()
        await second.aclose()


async def test_more_calls_in_flight_than_pooled_connections_wait_for_one() -> None:
    """A proxy process with a few hundred calls in flight: each is numbered, none refused (the
    pool used to refuse past 100 connections: 503s at 256 clients on `--workers 2`)."""
    seqs = RedisSeq.from_url(REDIS_URL, 60)
    rollouts = [uuid.uuid4() for _ in range(3)]
    calls = 5 * POOL_CONNECTIONS
    try:
        taken = await asyncio.gather(*(seqs.next(rollouts[i % 3], 1) for i in range(calls)))
    finally:
        await seqs.aclose()
    for index, rollout in enumerate(rollouts):
        mine = sorted(taken[index::3])
        assert mine == list(range(len(mine))), rollout  # gap-free per rollout


async def test_an_unreachable_counter_refuses_the_call_with_a_retryable_503() -> None:
    seqs = RedisSeq.from_url("redis://127.0.0.1:1", 60)
    with pytest.raises(BackendUnavailable) as caught:
        await seqs.next(uuid.uuid4(), 1)
    assert caught.value.code == "sequence_unavailable"
    await seqs.aclose()
    settings = proxy_settings(proxy_shared_seq=True, proxy_redis_url="redis://127.0.0.1:1")
    async for h in start_harness(settings):
        for path, body in (
            ("/v1/chat/completions", BODY),
            ("/v1/messages", {**BODY, "max_tokens": 16}),
        ):
            answer = await h.post(path, body)
            assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
            assert "order store" in answer.text
        assert h.stats.requests == 0 and await h.rows() == []  # nothing forwarded, nothing logged


def test_settings_choose_the_counter_and_refuse_workers_without_redis() -> None:
    assert isinstance(sequencer(Settings()), LocalSeq)
    assert Settings(proxy_workers=2, broker_url=REDIS_URL).proxy_seq_redis_url == REDIS_URL
    assert Settings(proxy_shared_seq=True, proxy_redis_url="redis://r:1").proxy_seq_redis_url
    assert Settings(proxy_workers=2, proxy_shared_seq=False).proxy_seq_redis_url is None
    with pytest.raises(ValueError, match="needs Redis"):
        Settings(proxy_workers=2)  # the embedded broker: no Redis to share the order through


def _floors(stored: dict[tuple[uuid.UUID, int], int]) -> tuple[SeqFloor, list[uuid.UUID]]:
    """A durable record holding `stored` calls per attempt (seqs 0..n-1); the misses it saw."""
    asked: list[uuid.UUID] = []

    async def floor(rollout_id: uuid.UUID, attempt: int) -> int:
        asked.append(rollout_id)
        await asyncio.sleep(0)  # a read: other calls run meanwhile
        return stored.get((rollout_id, attempt), 0)

    return floor, asked


async def test_a_restarted_local_counter_goes_on_after_the_stored_calls() -> None:
    """A proxy process that never saw the attempt (restarted) numbers after its stored calls,
    asks the record once, and concurrent first calls each get their own number."""
    rollout = uuid.uuid4()
    floor, asked = _floors({(rollout, 1): 3})
    seqs = LocalSeq(floor=floor)
    first = await asyncio.gather(*(seqs.next(rollout, 1) for _ in range(3)))
    assert sorted(first) == [3, 4, 5]
    assert [await seqs.next(rollout, 1), await seqs.next(rollout, 2)] == [6, 0]
    assert asked.count(rollout) == 3 + 1  # the concurrent misses, then attempt 2's; no more


async def test_a_counter_redis_lost_is_seeded_again_from_the_stored_calls() -> None:
    """Redis restarted (no persistence) under two proxy processes: both go on past the stored
    calls, and their concurrent misses take distinct numbers."""
    rollout = uuid.uuid4()
    floor, asked = _floors({(rollout, 1): 5})
    first, second = RedisSeq.from_url(REDIS_URL, 60, floor), RedisSeq.from_url(REDIS_URL, 60, floor)
    try:
        taken = await asyncio.gather(*(s.next(rollout, 1) for s in (first, second, first)))
        assert sorted(taken) == [5, 6, 7]
        redis.Redis.from_url(REDIS_URL).delete(f"{KEY_PREFIX}{rollout.hex}:1")  # Redis forgot
        floor_after, _ = _floors({(rollout, 1): 8})
        third = RedisSeq.from_url(REDIS_URL, 60, floor_after)
        assert [await third.next(rollout, 1), await first.next(rollout, 1)] == [8, 9]
        await third.aclose()
        assert len(asked) <= 3
    finally:
        await first.aclose()
        await second.aclose()


def _insert_calls(engine: Engine, rollout: uuid.UUID, attempt: int, seqs: list[int]) -> None:
    rows: list[dict[str, Any]] = [
        {
            "id": uuid.uuid4(), "rollout_id": rollout, "seq": seq, "backend": "b", "model": "m",
            "api_type": "chat", "status_code": 200, "request": {}, "response": None,
            "latency_ms": 1.0, "ttft_ms": None, "attempt": attempt,
        }
        for seq in seqs
    ]  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(LlmCall), rows)


async def test_the_database_floor_reads_the_attempt_and_refuses_when_unsure(
    pg_engine: Engine,
) -> None:
    rollout = uuid.uuid4()
    _insert_calls(pg_engine, rollout, 1, [0, 1, 2])
    _insert_calls(pg_engine, rollout, 2, [0])
    spilled = [0]
    floor = db_seq_floor(pg_engine, lambda: spilled[0])
    assert [await floor(rollout, 1), await floor(rollout, 2), await floor(rollout, 3)] == [3, 1, 0]
    assert await floor(uuid.uuid4(), 1) == 0
    spilled[0] = 4  # rows on disk, not in the table yet: the floor may be too low
    with pytest.raises(BackendUnavailable) as caught:
        await floor(rollout, 1)
    assert caught.value.code == "sequence_unavailable"
    unreachable = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    with pytest.raises(BackendUnavailable) as caught:
        await db_seq_floor(unreachable, lambda: 0)(rollout, 1)
    assert caught.value.code == "sequence_unavailable"


async def test_a_counted_call_refused_a_number_is_counted_back() -> None:
    """Call receipts count a call before it is numbered: a call then refused its number (the
    durable record unreadable) must not leave the stage waiting for a call that never comes."""

    async def unreadable(rollout_id: uuid.UUID, attempt: int) -> int:
        raise BackendUnavailable("unreadable", "sequence_unavailable", 1)

    rollout = uuid.uuid4()
    claim = RolloutClaim(rollout, 0, attempt=1, receipts=True)
    receipts = StartCounter.from_url(REDIS_URL)
    try:
        with pytest.raises(BackendUnavailable):
            await number_call(LocalSeq(floor=unreadable), receipts, claim)
        assert await number_call(LocalSeq(), receipts, claim) == 0
    finally:
        await receipts.aclose()
    assert int(redis.Redis.from_url(REDIS_URL).get(started_key(rollout, 1)) or 0) == 1
