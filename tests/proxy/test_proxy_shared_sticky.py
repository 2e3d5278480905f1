"""Rollouts' backend bindings shared in Redis (`sticky.SharedBindings`): two pools stand for two
proxy processes; the multi-host version with real proxies is tests/multihost/test_shared_proxies.
"""

from __future__ import annotations

import uuid

import pytest
from backends_support import rollout_preferring

from polar_mq.config import Settings
from polar_mq.infra.ports import free_port
from polar_mq.proxy.backends.pool import BackendPool
from polar_mq.proxy.backends.sticky import KEY_PREFIX, SharedBindings
from polar_mq.proxy.redis_client import async_redis

pytestmark = pytest.mark.anyio
REDIS_URL = "redis://127.0.0.1:6379/3"
B1, B2 = "http://b1:8000", "http://b2:8000"


def _pool(redis_url: str | None) -> BackendPool:
    shared = SharedBindings.from_url(redis_url, 60) if redis_url else None
    pool = BackendPool(("/v1/chat/completions",), shared=shared)
    pool.add(B1, "b1")
    pool.add(B2, "b2")
    return pool


async def test_a_rollout_moved_by_one_proxy_is_followed_by_the_other() -> None:
    rollout = rollout_preferring(["b1"], ["b1", "b2"])
    first, second = _pool(REDIS_URL), _pool(REDIS_URL)
    try:
        first.get("b1").draining = True  # in the first proxy's view only
        assert (await first.choose(rollout)).name == "b2"
        assert (await second.choose(rollout)).name == "b2"  # not its own first choice, b1
        assert (await first.choose(rollout)).name == "b2"
    finally:
        client = async_redis(REDIS_URL)
        await client.delete(KEY_PREFIX + rollout.hex)
        await client.aclose()
        await first.aclose()
        await second.aclose()


async def test_alone_each_proxy_routes_by_itself() -> None:
    """What the shared bindings fix: without them the second proxy takes its own choice."""
    rollout = rollout_preferring(["b1"], ["b1", "b2"])
    first, second = _pool(None), _pool(None)
    first.get("b1").draining = True
    assert (await first.choose(rollout)).name == "b2"
    assert (await second.choose(rollout)).name == "b1"
    await first.aclose()
    await second.aclose()


async def test_an_unreachable_redis_never_refuses_a_call() -> None:
    rollout = rollout_preferring(["b1"], ["b1", "b2"])
    pool = _pool(f"redis://127.0.0.1:{free_port()}/0")
    try:
        assert (await pool.choose(rollout)).name == "b1"  # rendezvous, as without Redis
        assert (await pool.choose(uuid.uuid4())).name in ("b1", "b2")
    finally:
        await pool.aclose()


def test_several_proxies_share_order_and_bindings_by_default() -> None:
    redis = {"proxy_redis_url": REDIS_URL}
    alone = Settings(**redis)
    assert alone.proxy_seq_redis_url is None and alone.proxy_sticky_redis_url is None
    two = Settings(proxy_admin_urls=["http://p1:8010", "http://p2:8010"], **redis)
    assert two.proxy_seq_redis_url == two.proxy_sticky_redis_url == REDIS_URL
    workers = Settings(proxy_workers=2, **redis)
    assert workers.proxy_sticky_redis_url == REDIS_URL
    off = Settings(proxy_workers=2, proxy_shared_seq=False, **redis)
    assert off.proxy_seq_redis_url is None and off.proxy_sticky_redis_url is None
