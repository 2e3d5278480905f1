"""Call receipts on real PostgreSQL and Redis: the proxy counts a receipted call before numbering
it, its writer adds the ids it committed, and `wait_stored` returns only once they add up."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import redis
from proxy_support import SECRET, proxy_settings
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker
from test_proxy_spill import Outage, spilling_writer
from test_proxy_writer import call_row

from polar_mq.capability import receipts as call_receipts
from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.config import Settings
from polar_mq.infra.db import create_db_engine
from polar_mq.models import LlmCall
from polar_mq.proxy import DbCallWriter, MemoryCallSink, create_proxy_app
from polar_mq.proxy.store.receipts import HurryListener, StartCounter
from polar_mq.proxy.store.sink import CallSink
from polar_mq.testing.fake_vllm import create_fake_vllm_app
from polar_mq.testing.servers import free_port
from tests.conftest import REDIS_URL
from tests.reliability.tcp_relay import TcpRelay

pytestmark = pytest.mark.anyio

BODY = {"model": "agent", "messages": [{"role": "user", "content": "What is 6 * 7?"}]}


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    c = call_receipts.connect(REDIS_URL)
    yield c
    c.close()


def opened(client: redis.Redis) -> uuid.UUID:
    """A new rollout whose attempt 1 keeps receipts (as the run-agent stage opens it)."""
    rollout = uuid.uuid4()
    call_receipts.open_attempt(client, rollout, 1)
    return rollout


def stored(factory: sessionmaker[Session], rollout: uuid.UUID) -> int:
    with factory() as session:
        n = session.scalar(select(func.count()).where(LlmCall.rollout_id == rollout))
    return int(n or 0)


@asynccontextmanager
async def proxy_client(settings: Settings, sink: CallSink) -> AsyncIterator[httpx.AsyncClient]:
    """The proxy app in front of the fake engine, its lifespan running, and a client of it."""
    engine = httpx.ASGITransport(create_fake_vllm_app())
    app = create_proxy_app(settings, upstream_transport=engine, sink=sink)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://proxy") as proxy,
    ):
        yield proxy


def headers(rollout: uuid.UUID, receipts: bool = True) -> dict[str, str]:
    token = issue_rollout_token(SECRET, rollout, 60, attempt=1, receipts=receipts)
    return {"authorization": f"Bearer {token}"}


async def test_the_wait_ends_only_when_a_slow_writer_committed_every_call(
    pg_engine: Engine, db_session_factory: sessionmaker[Session], client: redis.Redis
) -> None:
    # the writer lingers a second after a first row (answers do not wait for their rows): the
    # agent is long done by then
    writer = DbCallWriter(
        engine=pg_engine, flush_interval_s=1.0, receipts_url=REDIS_URL, durable_answers=False
    )
    rollout = opened(client)
    async with proxy_client(proxy_settings(proxy_redis_url=REDIS_URL), writer) as proxy:
        for stream in (False, True, False):
            answer = await proxy.post(
                "/v1/chat/completions", json={**BODY, "stream": stream}, headers=headers(rollout)
            )
            assert answer.status_code == 200
        early = call_receipts.read(client, rollout, 1)
        assert (early.started, early.complete) == (3, False)  # counted, not stored yet
        seen = await asyncio.to_thread(call_receipts.wait_stored, client, rollout, 1, 10.0)
        assert (seen.started, seen.stored, seen.complete) == (3, 3, True)
        assert seen.wakeups >= 1  # it waited on the writer's wake-up, not a sleep
        assert stored(db_session_factory, rollout) == 3  # committed before the wait ended
    with db_session_factory() as session:
        seqs = session.scalars(select(LlmCall.seq).where(LlmCall.rollout_id == rollout)).all()
    assert sorted(seqs) == [0, 1, 2]


async def test_a_waiting_stage_cuts_the_writers_batching_wait_short(
    pg_engine: Engine, db_session_factory: sessionmaker[Session], client: redis.Redis
) -> None:
    """A writer that would linger 60 s for more rows commits as soon as a stage waits."""
    writer = DbCallWriter(engine=pg_engine, flush_interval_s=60.0, receipts_url=REDIS_URL)
    rollout = opened(client)
    before = _subscribers(client)  # other proxies on this Redis (other tests' stacks)
    async with proxy_client(proxy_settings(proxy_redis_url=REDIS_URL), writer) as proxy:
        await _wait_subscribed(client, before)
        answer = await proxy.post("/v1/chat/completions", json=BODY, headers=headers(rollout))
        assert answer.status_code == 200
        seen = await asyncio.to_thread(call_receipts.wait_stored, client, rollout, 1, 20.0)
        assert (seen.started, seen.stored, seen.complete) == (1, 1, True)
        assert stored(db_session_factory, rollout) == 1
        assert writer.pending == 0


async def test_the_hurry_listener_pokes_on_a_publish_and_stops_however_soon_after_its_start(
    client: redis.Redis,
) -> None:
    """Stopped while it connects or subscribes, it still ends within a read: the asyncio
    listener it replaced swallowed such a cancel now and then (a proxy worker then never exited
    on SIGTERM)."""
    poked = threading.Event()
    before = _subscribers(client)
    listener = HurryListener(REDIS_URL, poked.set, poll_s=0.02)
    listener.start()
    await _wait_subscribed(client, before)
    client.publish(call_receipts.HURRY_CHANNEL, b"1")
    assert await asyncio.to_thread(poked.wait, 10)
    await asyncio.wait_for(listener.stop(), 5)
    assert not listener.alive
    for delay in [0.0, 0.0005, 0.001, 0.002, 0.005] * 8:
        listener = HurryListener(REDIS_URL, lambda: None, poll_s=0.02)
        listener.start()
        await asyncio.sleep(delay)
        await asyncio.wait_for(listener.stop(), 5)
        assert not listener.alive, delay


def _subscribers(client: redis.Redis) -> int:
    counts = dict(client.pubsub_numsub(call_receipts.HURRY_CHANNEL))
    return int(counts.get(call_receipts.HURRY_CHANNEL.encode(), 0))


async def _wait_subscribed(client: redis.Redis, before: int) -> None:
    """The proxy's hurry listener subscribes in the background at startup."""
    for _ in range(100):
        if _subscribers(client) > before:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the proxy never subscribed to the hurry channel")


async def test_calls_refused_before_numbering_are_never_waited_for(client: redis.Redis) -> None:
    """No receipt store (off, or Redis unreachable): a receipted call is refused before it has a
    number, so it is neither counted nor given a seq, and the wait has nothing to wait for."""
    dead = f"redis://127.0.0.1:{free_port()}"
    rollout = opened(client)
    for settings in (
        proxy_settings(proxy_call_receipts=False),
        proxy_settings(proxy_redis_url=dead, proxy_redis_retry_s=0.3),
    ):
        sink = MemoryCallSink()
        async with proxy_client(settings, sink) as proxy:
            refused = await proxy.post("/v1/chat/completions", json=BODY, headers=headers(rollout))
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "receipts_unavailable"
            plain = await proxy.post(  # not receipted: served, and numbered from 0
                "/v1/chat/completions", json=BODY, headers=headers(rollout, receipts=False)
            )
            assert plain.status_code == 200
            assert [row["seq"] for row in sink.rows] == [0]
    seen = call_receipts.wait_stored(client, rollout, 1, 5.0)
    assert (seen.started, seen.complete, seen.wakeups) == (0, True, 0)


def test_no_wait_when_the_agent_made_no_call(client: redis.Redis) -> None:
    seen = call_receipts.wait_stored(client, opened(client), 1, 5.0)
    assert (seen.started, seen.stored, seen.complete, seen.wakeups) == (0, 0, True, 0)


def test_a_wait_that_does_not_add_up_ends_at_its_deadline(client: redis.Redis) -> None:
    rollout = opened(client)
    client.incr(call_receipts.started_key(rollout, 1), 2)  # two counted, one stored: lost
    call_receipts.record_stored(client, [call_row(rollout_id=rollout, attempt=1)])
    seen = call_receipts.wait_stored(client, rollout, 1, 0.3)
    assert (seen.started, seen.stored, seen.complete) == (2, 1, False)


async def test_a_restarted_writer_replays_spilled_calls_and_their_receipts_once(
    pg_url: str,
    tmp_path: Path,
    db_session_factory: sessionmaker[Session],
    client: redis.Redis,
) -> None:
    rollout = opened(client)
    counter = StartCounter.from_url(REDIS_URL)
    rows = [call_row(i, rollout_id=rollout, attempt=1) for i in range(3)]
    for _ in rows:
        await counter.start(rollout, 1)
    await counter.aclose()
    engine = create_db_engine(pg_url, pool_size=2)
    outage = Outage(engine)
    outage.down = True
    spill = tmp_path / "spill"
    first = spilling_writer(engine, spill, receipts_url=REDIS_URL)
    await first.start()
    for row in rows:
        first.submit(row)
    await asyncio.wait_for(first.close(), 10)  # the proxy stops with its rows on disk
    assert first.stats()["spilled_rows"] == 3
    assert not call_receipts.wait_stored(client, rollout, 1, 0.2).complete  # spilled: not stored
    saved = tmp_path / "saved"
    shutil.copytree(spill, saved, ignore=shutil.ignore_patterns("LOCK"))
    outage.down = False

    async def restart() -> None:
        writer = spilling_writer(engine, spill, receipts_url=REDIS_URL)
        await writer.start()  # replays at start
        seen = await asyncio.to_thread(call_receipts.wait_stored, client, rollout, 1, 10.0)
        assert (seen.started, seen.stored, seen.complete) == (3, 3, True)
        assert stored(db_session_factory, rollout) == 3
        await writer.close()

    await restart()
    shutil.copytree(saved, spill)  # a crash between the commit and the segment's deletion
    await restart()  # replayed again: the receipts still count each call once
    assert call_receipts.read(client, rollout, 1).stored == 3
    engine.dispose()


async def test_a_call_waits_out_a_redis_blip_instead_of_failing(client: redis.Redis) -> None:
    """Redis away for a second (a broker restart): the call waits for it, is counted, served."""
    host, port = REDIS_URL.removeprefix("redis://").split("/")[0].split(":")
    relay = TcpRelay((host, int(port))).start()
    sink = MemoryCallSink()
    via_relay = f"redis://127.0.0.1:{relay.port}"
    settings = proxy_settings(proxy_redis_url=via_relay, proxy_redis_retry_s=10.0)
    rollout = opened(client)
    try:
        async with proxy_client(settings, sink) as proxy:
            relay.cut()
            call = asyncio.ensure_future(
                proxy.post("/v1/chat/completions", json=BODY, headers=headers(rollout))
            )
            await asyncio.sleep(1.0)
            assert not call.done()  # waiting for Redis, not refused
            relay.restore()
            answer = await asyncio.wait_for(call, 15.0)
            assert answer.status_code == 200, answer.text
    finally:
        relay.cut()
    assert call_receipts.read(client, rollout, 1).started == 1
    assert [row["seq"] for row in sink.rows] == [0]


def test_receipts_lost_with_a_redis_restart_never_add_up(client: redis.Redis) -> None:
    """Redis restarted while the agent ran (nothing kept on disk): the counts kept after it may
    add up while a counted call is unstored; the lost mark says so and the wait ends at once."""
    rollout = opened(client)
    client.incr(call_receipts.started_key(rollout, 1), 2)
    client.delete(  # what a restart of a Redis without persistence does to the attempt's keys
        call_receipts.started_key(rollout, 1), call_receipts.opened_key(rollout, 1)
    )
    client.incr(call_receipts.started_key(rollout, 1))  # one call after the restart...
    call_receipts.record_stored(client, [call_row(rollout_id=rollout, attempt=1)])  # ...one stored
    started = time.monotonic()
    seen = call_receipts.wait_stored(client, rollout, 1, 5.0)
    assert (seen.started, seen.stored, seen.intact, seen.complete) == (1, 1, False, False)
    assert time.monotonic() - started < 1.0  # no use waiting for receipts known lost
