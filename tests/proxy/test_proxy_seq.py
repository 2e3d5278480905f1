"""Call sequence numbers shared through Redis: exact across counters, refused when unreachable."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis
from proxy_support import proxy_settings, start_harness

from polar_mq.config import Settings
from polar_mq.proxy.backends import BackendUnavailable
from polar_mq.proxy.redis_client import POOL_CONNECTIONS
from polar_mq.proxy.seq import KEY_PREFIX, LocalSeq, RedisSeq, sequencer
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.anyio

BODY = {"model": "m", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}


async def test_two_counters_on_one_redis_number_a_rollout_as_one() -> None:
    """Two proxy processes (two clients) serving one rollout's calls in turn."""
    first, second = RedisSeq.from_url(REDIS_URL, 60), RedisSeq.from_url(REDIS_URL, 60)
    rollout, other = uuid.uuid4(), uuid.uuid4()
    try:
        taken = [await (first, second)[i % 3 % 2].next(rollout) for i in range(7)]
        assert taken == list(range(7))
        assert await second.next(other) == 0  # per rollout
        ttl = redis.Redis.from_url(REDIS_URL).ttl(KEY_PREFIX + rollout.hex)
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
        taken = await asyncio.gather(*(seqs.next(rollouts[i % 3]) for i in range(calls)))
    finally:
        await seqs.aclose()
    for index, rollout in enumerate(rollouts):
        mine = sorted(taken[index::3])
        assert mine == list(range(len(mine))), rollout  # gap-free per rollout


async def test_an_unreachable_counter_refuses_the_call_with_a_retryable_503() -> None:
    seqs = RedisSeq.from_url("redis://127.0.0.1:1", 60)
    with pytest.raises(BackendUnavailable) as caught:
        await seqs.next(uuid.uuid4())
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
