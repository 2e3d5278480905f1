"""Group leases over a real socket: concurrent consumers get disjoint groups, a long-poll returns
as soon as a group completes, the event stream sends groups and ends, and the clients'
`stream_groups` batch, auto-ack and extend."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from api_support import complete_rollout, rollout_ids
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.client import AsyncClient, Client, delivery_ids
from polar_mq.infra.tls import client_ssl_context
from polar_mq.jobs import deliveries
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.models import GroupDelivery
from tests.live_api import serve_api


@pytest.fixture()
def api(pg_url: str, db_session_factory: sessionmaker[Session]) -> Iterator[str]:
    published: list[StageMessage] = []
    with serve_api(pg_url, db_session_factory, published) as url:
        yield url


def submit(url: str, n_tasks: int, samples: int = 1) -> str:
    with Client(url) as client:
        tasks = [{"instruction": f"t{i}"} for i in range(n_tasks)]
        return client.submit(tasks, samples_per_task=samples).job_id


def complete_group(factory: sessionmaker[Session], job_id: str, index: int) -> None:
    for rid in rollout_ids(factory, job_id)[index]:
        complete_rollout(factory, rid, reward=float(index))


def test_concurrent_consumers_get_disjoint_groups(
    api: str, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(api, n_tasks=24)
    for index in range(24):
        complete_group(db_session_factory, job_id, index)
    start = threading.Barrier(8)
    got: dict[str, list[int]] = {}

    def consume(name: str) -> None:
        mine: list[int] = []
        with httpx.Client(base_url=api, timeout=30, verify=client_ssl_context()) as http:
            start.wait()
            while True:
                body = {"consumer": name, "max_groups": 2, "lease_s": 60}
                answer = http.post(f"/v1/jobs/{job_id}/groups/lease", json=body).json()
                if not answer["groups"]:
                    break
                mine.extend(g["task_index"] for g in answer["groups"])
        got[name] = mine

    threads = [threading.Thread(target=consume, args=(f"c{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    handed = [index for mine in got.values() for index in mine]
    assert sorted(handed) == list(range(24)), got  # each group to exactly one consumer
    with db_session_factory() as session:
        counts = session.scalars(select(GroupDelivery.delivery_count)).all()
    assert counts == [1] * 24


def test_concurrent_claims_in_the_service_never_overlap(
    db_session_factory: sessionmaker[Session], api: str
) -> None:
    """The claim statement itself, raced from threads with their own sessions, round after round."""
    job_id = submit(api, n_tasks=6)
    for index in range(6):
        complete_group(db_session_factory, job_id, index)
    lock = threading.Lock()

    def claim(name: str, start: threading.Barrier, won: list[int]) -> None:
        start.wait()
        with db_session_factory() as session, session.begin():
            lease = deliveries.lease_groups(session, uuid.UUID(job_id), name, 6, 60.0)
        with lock:
            won.extend(g.task_index for g in lease.groups)

    for _round in range(5):
        with db_session_factory() as session, session.begin():
            session.query(GroupDelivery).delete()
        start = threading.Barrier(6)
        won: list[int] = []
        threads = [threading.Thread(target=claim, args=(f"c{i}", start, won)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(won) == list(range(6))


def test_long_poll_returns_as_soon_as_a_group_completes(
    api: str, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(api, n_tasks=2, samples=2)
    with Client(api) as client:
        began = time.monotonic()
        empty = client.lease_groups(job_id, "a", wait_s=0.6)
        assert empty["groups"] == [] and time.monotonic() - began >= 0.6

        timer = threading.Timer(0.8, complete_group, (db_session_factory, job_id, 1))
        timer.start()
        began = time.monotonic()
        answer = client.lease_groups(job_id, "a", wait_s=20)
        waited = time.monotonic() - began
        timer.join()
    assert [g["task_index"] for g in answer["groups"]] == [1]
    assert 0.7 < waited < 3.0, waited


def _events(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    """(event, data) of a server-sent event stream; comment lines come as ("comment", text)."""
    kind, data = "message", b""
    for line in lines:
        if line.startswith(":"):
            yield "comment", line[1:].strip()
        elif line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data = line[6:].encode()
        elif line == "" and data:
            yield kind, orjson.loads(data)
            kind, data = "message", b""


def test_event_stream_sends_groups_as_they_complete_and_ends(
    api: str, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(api, n_tasks=2, samples=2)
    complete_group(db_session_factory, job_id, 0)
    seen: list[tuple[str, Any]] = []
    params = {"consumer": "sse", "lease_s": 30, "heartbeat_s": 0.3}
    with (
        Client(api) as client,
        httpx.stream(
            "GET", f"{api}/v1/jobs/{job_id}/groups/stream", params=params, timeout=30
        ) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        for kind, data in _events(response.iter_lines()):
            seen.append((kind, data))
            if kind == "group":
                client.ack_groups(job_id, "sse", [data["delivery"]["delivery_id"]])
                if data["task_index"] == 0:  # the second group completes while we listen
                    threading.Timer(0.7, complete_group, (db_session_factory, job_id, 1)).start()
            if kind == "end":
                break
    kinds = [k for k, _ in seen]
    groups = [d["task_index"] for k, d in seen if k == "group"]
    assert groups == [0, 1]
    assert "heartbeat" in [d for k, d in seen if k == "comment"]
    assert kinds[-1] == "end" and seen[-1][1]["done"] is True
    assert seen[-1][1]["groups_acked"] == 2

    missing = httpx.get(f"{api}/v1/jobs/{job_id[:-4]}beef/groups/stream", params=params)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"


def test_sync_stream_groups_fills_batches_and_auto_acks(
    api: str, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(api, n_tasks=5, samples=2)
    for index in (3, 1, 4):
        complete_group(db_session_factory, job_id, index)
    batches: list[list[int]] = []
    with Client(api) as client:
        for batch in client.stream_groups(job_id, batch_size=2, consumer="s", wait_s=1):
            batches.append([g["task_index"] for g in batch])
            if len(batches) == 1:  # the rest complete while the trainer works
                complete_group(db_session_factory, job_id, 0)
                complete_group(db_session_factory, job_id, 2)
        status = client.lease_groups(job_id, "probe")
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3, 4]
    assert [len(b) for b in batches] == [2, 2, 1]  # the last, partial batch once the job ended
    assert batches[0] == [3, 1]
    assert status["done"] is True and status["groups_acked"] == 5


def test_async_stream_groups_manual_ack_and_redelivery_after_a_break(
    api: str, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(api, n_tasks=3)
    for index in range(3):
        complete_group(db_session_factory, job_id, index)

    async def run() -> tuple[list[Any], list[Any]]:
        async with AsyncClient(api) as client:
            first: list[Any] = []
            async for batch in client.stream_groups(
                job_id, batch_size=2, consumer="quitter", lease_s=1.0, wait_s=1
            ):
                first = batch
                break  # never asks for the next batch: never acked
            rest: list[Any] = []
            async for batch in client.stream_groups(
                job_id, batch_size=2, consumer="finisher", lease_s=5.0, ack="manual", wait_s=1
            ):
                rest.extend(batch)
                await client.ack_groups(job_id, "finisher", delivery_ids(batch))
            return first, rest

    first, rest = asyncio.run(asyncio.wait_for(run(), 30))
    assert [g["task_index"] for g in first] == [0, 1]
    assert Counter(g["task_index"] for g in rest) == Counter([0, 1, 2])
    counts = {g["task_index"]: g["delivery"]["delivery_count"] for g in rest}
    assert counts == {0: 2, 1: 2, 2: 1}


def test_cli_groups_prints_each_group_once_and_acks(
    api: str, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(api, n_tasks=3)
    for index in (2, 0, 1):
        complete_group(db_session_factory, job_id, index)
    argv = [sys.executable, "-m", "polar_mq.cli", "groups", job_id, "--url", api]
    done = subprocess.run([*argv, "--batch-size", "2"], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert [g["task_index"] for g in lines] == [2, 0, 1]
    with Client(api) as client:
        assert client.lease_groups(job_id, "probe")["done"] is True


def test_stream_groups_extends_the_leases_of_a_batch_while_it_fills(
    api: str, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(api, n_tasks=3)
    complete_group(db_session_factory, job_id, 0)
    stolen: list[Any] = []

    def later() -> None:  # well past group 0's 0.9 s lease: another trainer tries its luck
        with Client(api) as other:
            stolen.extend(other.lease_groups(job_id, "intruder")["groups"])
        complete_group(db_session_factory, job_id, 1)

    timer = threading.Timer(2.5, later)
    timer.start()
    with Client(api) as client:
        stream = client.stream_groups(job_id, batch_size=2, consumer="s", lease_s=0.9, wait_s=5)
        batch = next(stream)
        stream.close()
    timer.join()
    assert stolen == []
    assert [(g["task_index"], g["delivery"]["delivery_count"]) for g in batch] == [(0, 1), (1, 1)]


def test_a_waiting_long_poll_holds_no_database_connection(
    api: str, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(api, n_tasks=1)
    engine = db_session_factory.kw["bind"]
    with Client(api) as client:
        wait = {"wait_s": 2}
        poll = threading.Thread(target=client.lease_groups, args=(job_id, "a"), kwargs=wait)
        poll.start()
        time.sleep(0.3)
        held = []
        for _ in range(20):
            held.append(engine.pool.checkedout())
            time.sleep(0.05)
        poll.join()
    assert held.count(0) >= 15, held  # a connection only for the instant of each short look
