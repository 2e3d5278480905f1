"""The backend pool's parts alone: breaker states, sticky bindings, routing choices, settings,
and retries before the first byte against the in-process fake (one host answering 5xx or not
reachable, the other the vLLM-shaped fake)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from backends_support import rollout_preferring
from proxy_support import SECRET, proxy_settings

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.config import Settings
from polar_mq.proxy import MemoryCallSink, create_proxy_app
from polar_mq.proxy.backends.backend import Backend
from polar_mq.proxy.backends.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from polar_mq.proxy.backends.pool import BackendPool, BackendUnavailable
from polar_mq.proxy.backends.sticky import StickyMap
from polar_mq.proxy.backends.upstream_conn import StaleConnection
from polar_mq.testing.fake_vllm import create_fake_vllm_app

PATHS = ("/v1/chat/completions",)
BODY = {"model": "policy", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}


def test_breaker_opens_after_consecutive_failures_and_probes_after_cooldown() -> None:
    breaker = CircuitBreaker(failure_threshold=3, cooldown_s=0.05)
    breaker.record_failure()
    breaker.record_failure()
    breaker.record_success()  # a success resets the count
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state == CLOSED and breaker.available()
    breaker.record_failure()
    assert breaker.state == OPEN and not breaker.available()
    assert 0 < breaker.retry_after_s() <= 0.05
    time.sleep(0.06)
    assert breaker.state == HALF_OPEN and breaker.available()
    breaker.on_dispatch()  # the one probe
    assert not breaker.available()
    breaker.record_failure()  # a failed probe opens it again
    assert breaker.state == OPEN and breaker.times_opened == 1
    time.sleep(0.06)
    breaker.on_dispatch()
    breaker.cancel_probe()  # the agent left: the slot is free again
    assert breaker.available()
    breaker.on_dispatch()
    breaker.record_success()
    assert breaker.state == CLOSED and breaker.failures == 0 and breaker.available()
    with pytest.raises(ValueError):
        CircuitBreaker(failure_threshold=0, cooldown_s=1)


def backend(name: str) -> Backend:
    return Backend(name, f"http://{name}.test", PATHS)


def test_sticky_map_is_bounded_by_size_and_age_and_counts_per_backend() -> None:
    a, b = backend("a"), backend("b")
    sticky = StickyMap(max_rollouts=2, ttl_s=0.05)
    r1, r2, r3 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    sticky.bind(r1, a)
    sticky.bind(r2, b)
    assert sticky.get(r1) is a  # now r2 is the least recently used
    sticky.bind(r3, a)
    assert sticky.get(r2) is None and len(sticky) == 2
    assert (a.sticky_rollouts, b.sticky_rollouts) == (2, 0)
    sticky.bind(r1, b)  # rebinding moves the count
    assert (a.sticky_rollouts, b.sticky_rollouts) == (1, 1)
    time.sleep(0.06)
    assert sticky.get(r1) is None and b.sticky_rollouts == 0
    sticky.forget_backend(a)
    assert len(sticky) == 0 and a.sticky_rollouts == 0


@pytest.fixture
async def pool() -> AsyncIterator[BackendPool]:
    p = BackendPool(PATHS, pause_max_wait_s=0.05)
    for name in ("a", "b", "c"):
        p.add(f"http://{name}.test", name)
    yield p
    await p.aclose()


@pytest.mark.anyio
async def test_pool_routes_new_rollouts_by_rendezvous_and_keeps_bindings(pool: BackendPool) -> None:
    a, b, c = pool.backends.values()
    first = rollout_preferring(["c", "b", "a"], "abc")
    for _ in range(3):
        c.acquire()  # load does not move a rollout off its first choice
    assert await pool.choose(first) is c
    assert await pool.choose(first, tried=(c,)) is b  # a retry goes to the next in its order...
    assert await pool.choose(first) is c  # ...without moving the binding
    c.breaker.trip()
    assert await pool.choose(first) is b  # an open breaker moves it, to the next in order
    b.draining = True
    assert await pool.choose(first) is b  # draining: keeps its rollouts
    assert await pool.choose(rollout_preferring(["b", "a"], "abc")) is a  # takes no new ones
    for x in (a, b):
        x.breaker.trip()
    with pytest.raises(BackendUnavailable) as caught:
        await pool.choose(uuid.uuid4())
    response = caught.value.response()
    assert response.status_code == 503 and response.headers["retry-after"] == "10"


@pytest.mark.anyio
async def test_every_pool_maps_a_rollout_to_the_same_backend(pool: BackendPool) -> None:
    """Another process (another pool, backends added in another order) makes the same choices."""
    other = BackendPool(PATHS)
    for name in ("c", "a", "b"):
        other.add(f"http://{name}.test", name)
    rollouts = [uuid.UUID(int=i) for i in range(3000)]
    mine = [(await pool.choose(r)).name for r in rollouts]
    assert mine == [(await other.choose(r)).name for r in rollouts]
    shares = {name: mine.count(name) / len(mine) for name in "abc"}
    assert all(0.28 < share < 0.39 for share in shares.values()), shares  # about a third each
    other.remove("a")  # only a's rollouts move, each to its own second choice
    moved = [(await other.choose(r)).name for r in rollouts]
    assert all(m == n for m, n in zip(mine, moved, strict=True) if m != "a")
    assert "a" not in moved
    await other.aclose()


@pytest.mark.anyio
async def test_weights_share_rollouts_and_a_full_backend_spills_to_the_next(
    pool: BackendPool,
) -> None:
    a, b, c = pool.backends.values()
    b.weight = 4.0
    chosen = [(await pool.choose(uuid.UUID(int=i))).name for i in range(3000)]
    assert 0.6 < chosen.count("b") / len(chosen) < 0.73  # 4 / 6 of them
    b.weight = 1.0
    a.max_in_flight = 1
    a.acquire()
    newcomer = rollout_preferring(["a", "c"], "abc")
    assert await pool.choose(newcomer) is c  # a is at capacity: the next in its order
    a.release()
    assert await pool.choose(newcomer) is c  # and it stays there


@pytest.mark.anyio
async def test_pool_prefers_unpaused_backends_and_bounds_the_wait(pool: BackendPool) -> None:
    a, b, c = pool.backends.values()
    a.pause()
    b.pause()
    assert await pool.choose(uuid.uuid4()) is c
    c.pause()
    with pytest.raises(BackendUnavailable, match="paused"):
        await pool.choose(uuid.uuid4())
    assert a.waiting == 0
    with pytest.raises(KeyError):
        pool.select("nope")
    with pytest.raises(ValueError, match="already exists"):
        pool.add("http://a.test", "a")


def test_settings_accept_a_list_of_upstreams() -> None:
    assert Settings(upstream_urls="http://a:1, http://b:2/v1").upstream_urls == [
        "http://a:1",
        "http://b:2/v1",
    ]
    assert Settings(upstream_urls='["http://a:1"]').upstream_urls == ["http://a:1"]
    assert Settings().upstream_urls == []
    with pytest.raises(ValueError):
        Settings(upstream_urls="[not json")
    pool = BackendPool.from_settings(Settings(upstream_urls="http://a:1,http://b:2/v1/"), PATHS)
    assert list(pool.backends) == ["http://a:1", "http://b:2"]
    single = BackendPool.from_settings(Settings(upstream_url="http://c:3/v1"), PATHS)
    assert list(single.backends) == ["http://c:3"]
    with pytest.raises(ValueError, match="already exists"):
        BackendPool.from_settings(Settings(upstream_urls="http://a:1,http://a:1/v1"), PATHS)
    with pytest.raises(ValueError, match="http"):
        BackendPool.from_settings(Settings(upstream_urls="a:1"), PATHS)


class ByHost(httpx.AsyncBaseTransport):
    """`bad.test` answers 503 (or refuses connections); every other host is the fake engine."""

    def __init__(self, refuse: bool) -> None:
        self.fake = httpx.ASGITransport(create_fake_vllm_app())
        self.refuse = refuse
        self.bad_calls = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host != "bad.test":
            return await self.fake.handle_async_request(request)
        if request.url.path == "/health":
            return httpx.Response(200)
        self.bad_calls += 1
        if self.refuse:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(503, json={"error": {"message": "overloaded"}})


@asynccontextmanager
async def proxy_over(
    transport: httpx.AsyncBaseTransport, urls: list[str]
) -> AsyncIterator[tuple[httpx.AsyncClient, MemoryCallSink, BackendPool]]:
    """The proxy in-process with `transport` as every backend's network."""
    sink = MemoryCallSink()
    settings = proxy_settings(upstream_urls=urls, breaker_failures=2)
    app = create_proxy_app(settings, upstream_transport=transport, sink=sink)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://proxy") as client,
    ):
        yield client, sink, app.state.proxy.backends


def headers(rollout: uuid.UUID | None = None) -> dict[str, str]:
    token = issue_rollout_token(SECRET, rollout or uuid.uuid4(), 60)
    return {"authorization": f"Bearer {token}"}


@pytest.mark.anyio
@pytest.mark.parametrize("refuse", [True, False])
@pytest.mark.parametrize("stream", [False, True])
async def test_failures_before_the_first_byte_are_retried_elsewhere(
    refuse: bool, stream: bool
) -> None:
    transport = ByHost(refuse)
    async with proxy_over(transport, ["http://bad.test", "http://good.test"]) as (c, sink, pool):
        urls = ["http://bad.test", "http://good.test"]
        for _ in range(3):  # each new rollout's first choice is `bad`: it is tried, then skipped
            body = {**BODY, "stream": stream}
            rollout = rollout_preferring(urls, urls)
            response = await c.post("/v1/chat/completions", json=body, headers=headers(rollout))
            assert response.status_code == 200
        await sink.flush()
        assert [r["backend"] for r in sink.rows] == ["http://good.test"] * 3
        assert all(r["complete"] for r in sink.rows)
        assert transport.bad_calls == 2  # then its breaker opened and it was skipped
        assert pool.backends["http://bad.test"].breaker.state == OPEN
        assert pool.backends["http://bad.test"].in_flight == 0


@pytest.mark.anyio
@pytest.mark.parametrize("refuse", [True, False])
async def test_when_every_backend_fails_the_agent_gets_the_failure_once(refuse: bool) -> None:
    transport = ByHost(refuse)
    async with proxy_over(transport, ["http://bad.test"]) as (client, sink, pool):
        response = await client.post("/v1/chat/completions", json=BODY, headers=headers())
        assert response.status_code == (502 if refuse else 503)
        assert transport.bad_calls == 1
        await sink.flush()
        (row,) = sink.rows
        assert (row["backend"], row["complete"]) == ("http://bad.test", False)
        assert pool.backends["http://bad.test"].in_flight == 0


class StaleOnce(httpx.AsyncBaseTransport):
    """The fake engine, except that the first `stale` calls fail as a keep-alive connection the
    server had closed does (`StaleConnection`: before any byte of the response)."""

    def __init__(self, stale: int) -> None:
        self.fake = httpx.ASGITransport(create_fake_vllm_app())
        self.stale = stale
        self.calls = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        self.calls += 1
        if self.calls <= self.stale:
            raise StaleConnection("connection reset by peer", request=request)
        return await self.fake.handle_async_request(request)


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_a_stale_keepalive_connection_is_retried_once_on_the_only_backend(
    stream: bool,
) -> None:
    transport = StaleOnce(stale=1)
    async with proxy_over(transport, ["http://only.test"]) as (client, _, pool):
        body = {**BODY, "stream": stream}
        response = await client.post("/v1/chat/completions", json=body, headers=headers())
        assert response.status_code == 200 and transport.calls == 2
        assert pool.backends["http://only.test"].breaker.state == CLOSED
        twice = StaleOnce(stale=2)  # a second failure in a row is the backend's, not the pool's
    async with proxy_over(twice, ["http://only.test"]) as (client, _, pool):
        response = await client.post("/v1/chat/completions", json=BODY, headers=headers())
        assert response.status_code == 502 and twice.calls == 2
