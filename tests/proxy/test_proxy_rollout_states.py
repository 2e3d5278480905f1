"""The proxy's rollout-state cache: refusals, batching (no query per call), failure handling."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence

import httpx
import pytest
from proxy_support import SECRET, proxy_settings

from polar_mq.capability.tokens import JUDGE, issue_rollout_token
from polar_mq.models import RolloutStatus
from polar_mq.proxy import MemoryCallSink, create_proxy_app
from polar_mq.proxy.rollout_states import ENDED, UNKNOWN, RolloutStates
from polar_mq.testing.fake_vllm import create_fake_vllm_app

pytestmark = pytest.mark.anyio


class FakeDb:
    """Rollout statuses by id; counts the reads and can be made to fail."""

    def __init__(self) -> None:
        self.states: dict[uuid.UUID, str] = {}
        self.reads: list[list[uuid.UUID]] = []
        self.down = False

    def read(self, ids: Sequence[uuid.UUID]) -> Mapping[uuid.UUID, str]:
        self.reads.append(list(ids))
        if self.down:
            raise ConnectionError("database unreachable")
        return {i: self.states[i] for i in ids if i in self.states}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(ttl_s: float = 2.0) -> tuple[RolloutStates, FakeDb, Clock]:
    db, clock = FakeDb(), Clock()
    return RolloutStates(db.read, ttl_s, idle_s=60.0, clock=clock), db, clock


async def test_live_rollouts_pass_ended_and_unknown_are_refused() -> None:
    states, db, _ = make()
    live, done, cancelled = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    db.states = {
        live: RolloutStatus.EVALUATING,  # the judge calls while the rollout is evaluated
        done: RolloutStatus.COMPLETED,
        cancelled: RolloutStatus.CANCELLED,
    }
    assert await states.refusal(live) is None
    for rollout_id in (done, cancelled):
        refusal = await states.refusal(rollout_id)
        assert refusal is not None and (refusal.status, refusal.code) == (403, ENDED)
    unknown = await states.refusal(uuid.uuid4())
    assert unknown is not None and (unknown.status, unknown.code) == (401, UNKNOWN)


async def test_calls_cost_no_query_each_and_new_rollouts_share_one() -> None:
    states, db, clock = make()
    ids = [uuid.uuid4() for _ in range(20)]
    db.states = dict.fromkeys(ids, RolloutStatus.RUNNING)
    await asyncio.gather(*(states.refusal(i) for i in ids for _ in range(5)))
    assert len(db.reads) == 1 and sorted(db.reads[0]) == sorted(ids)  # 100 calls, one query
    for _ in range(50):
        clock.now += 0.05
        assert await states.refusal(ids[0]) is None
    assert len(db.reads) == 1


async def test_a_rollout_ending_is_seen_at_the_next_refresh() -> None:
    states, db, clock = make(ttl_s=2.0)
    rollout_id = uuid.uuid4()
    db.states[rollout_id] = RolloutStatus.RUNNING
    assert await states.refusal(rollout_id) is None
    db.states[rollout_id] = RolloutStatus.COMPLETED
    assert await states.refusal(rollout_id) is None  # within the bound: still the cached state
    clock.now += 2.0
    await states.refresh_once()  # what the background task does every ttl
    refusal = await states.refusal(rollout_id)
    assert refusal is not None and refusal.status == 403
    reads = len(db.reads)
    clock.now += 10.0
    await states.refresh_once()  # a terminal state is final: never read again
    assert len(db.reads) == reads


async def test_a_stale_entry_is_read_again_when_the_refresher_lags() -> None:
    states, db, clock = make(ttl_s=1.0)
    rollout_id = uuid.uuid4()
    db.states[rollout_id] = RolloutStatus.RUNNING
    await states.refusal(rollout_id)
    db.states[rollout_id] = RolloutStatus.FAILED
    clock.now += 2.5  # beyond 2 x ttl without a refresh
    refusal = await states.refusal(rollout_id)
    assert refusal is not None and refusal.status == 403


async def test_an_unreadable_database_keeps_the_proxy_serving() -> None:
    states, db, clock = make(ttl_s=1.0)
    known, done = uuid.uuid4(), uuid.uuid4()
    db.states = {known: RolloutStatus.RUNNING, done: RolloutStatus.COMPLETED}
    await states.refusal(known)
    await states.refusal(done)
    db.down = True
    clock.now += 5.0
    assert await states.refusal(known) is None  # last known state
    assert await states.refusal(uuid.uuid4()) is None  # never seen: served on its token alone
    reads = len(db.reads)
    assert await states.refusal(uuid.uuid4()) is None
    assert len(db.reads) == reads  # no query per call while down: retried after one period
    ended = await states.refusal(done)
    assert ended is not None and ended.status == 403  # what is known to have ended stays refused


async def test_idle_rollouts_are_forgotten() -> None:
    states, db, clock = make()
    rollout_id = uuid.uuid4()
    db.states[rollout_id] = RolloutStatus.RUNNING
    await states.refusal(rollout_id)
    clock.now += 61.0
    await states.refresh_once()
    assert len(db.reads) == 1  # dropped, not re-read
    await states.refusal(rollout_id)
    assert len(db.reads) == 2  # read again when it calls


@pytest.mark.parametrize("purpose", ["agent", JUDGE])
async def test_the_proxy_refuses_ended_rollouts_before_forwarding(purpose: str) -> None:
    db = FakeDb()
    ended, live = uuid.uuid4(), uuid.uuid4()
    db.states = {ended: RolloutStatus.COMPLETED, live: RolloutStatus.EVALUATING}
    fake = create_fake_vllm_app()
    sink = MemoryCallSink()
    app = create_proxy_app(
        proxy_settings(),
        upstream_transport=httpx.ASGITransport(fake),
        sink=sink,
        rollout_states=db.read,
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://proxy") as client,
    ):
        for rollout_id, expected in ((live, 200), (ended, 403)):
            token = issue_rollout_token(SECRET, rollout_id, 600, purpose=purpose)
            answer = await client.post(
                "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {token}"}
            )
            assert answer.status_code == expected, answer.text
        await sink.flush()
    assert [row["rollout_id"] for row in sink.rows] == [live]  # nothing forwarded for the other
