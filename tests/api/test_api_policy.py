"""Policy versions and staleness control on a real PostgreSQL: the capacity rule admits groups as
the trainer's version moves, stale groups are withheld from leases (or dropped, cancelling their
unfinished rollouts), versions only go forward, and unreachable proxies are reported, not fatal."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from api_support import RecordingPublisher, complete_rollout, rollout_ids, set_status
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.db import unit_of_work
from polar_mq.models import Event, EventKind, LlmCall, Rollout, RolloutStatus
from polar_mq.models.base import utcnow


def submit(client: TestClient, n_tasks: int, **staleness: Any) -> str:
    body = {
        "tasks": [{"instruction": f"task {i}"} for i in range(n_tasks)],
        "samples_per_task": 2,
        "staleness": {"max_staleness": 1, "batch_size": 2, **staleness},
    }
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["job_id"])


def statuses(factory: sessionmaker[Session], job_id: str) -> dict[int, set[str]]:
    with unit_of_work(factory) as session:
        rows = session.execute(
            select(Rollout.task_index, Rollout.status).where(Rollout.job_id == uuid.UUID(job_id))
        ).all()
    out: dict[int, set[str]] = {}
    for index, status in rows:
        out.setdefault(index, set()).add(status)
    return out


def admitted(factory: sessionmaker[Session], job_id: str) -> list[int]:
    return sorted(i for i, s in statuses(factory, job_id).items() if s != {RolloutStatus.HELD})


def set_version(client: TestClient, version: int, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/policy", json={"version": version, **body})
    assert response.status_code == 200, response.text
    return dict(response.json())


def lease(client: TestClient, job_id: str) -> dict[str, Any]:
    response = client.post(
        f"/v1/jobs/{job_id}/groups/lease", json={"consumer": "trainer", "lease_s": 30}
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_groups_are_admitted_as_the_policy_version_moves(
    client: TestClient, db_session_factory: sessionmaker[Session], publisher: RecordingPublisher
) -> None:
    job_id = submit(client, n_tasks=9)
    # (max_staleness 1 + 0 + 1) * batch 2 = 4 groups admitted; their 8 prepare messages sent
    assert admitted(db_session_factory, job_id) == [0, 1, 2, 3]
    assert len(publisher.messages) == 8
    status = client.get(f"/v1/jobs/{job_id}").json()
    assert status["held"] == 10 and status["state"] == "running"
    assert status["staleness"]["capacity_groups"] == 4
    assert status["staleness"]["admitted_groups"] == 4

    update = set_version(client, 1)
    assert update["previous_version"] == 0 and update["groups_admitted"] == 2
    assert admitted(db_session_factory, job_id) == [0, 1, 2, 3, 4, 5]
    assert client.get("/v1/policy").json()["version"] == 1
    set_version(client, 1)  # repeating a version is a no-op
    assert admitted(db_session_factory, job_id) == [0, 1, 2, 3, 4, 5]
    set_version(client, 5)
    assert admitted(db_session_factory, job_id) == list(range(9))
    assert len(publisher.messages) == 18  # each rollout published exactly once
    assert Counter(m.rollout_id for m in publisher.messages).most_common(1)[0][1] == 1


def test_a_job_submitted_later_counts_from_the_version_it_was_submitted_at(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    set_version(client, 7)
    job_id = submit(client, n_tasks=6, max_staleness=0)
    assert admitted(db_session_factory, job_id) == [0, 1]
    assert client.get(f"/v1/jobs/{job_id}").json()["spec"]["staleness"]["base_version"] == 7


def test_versions_only_go_forward(client: TestClient) -> None:
    set_version(client, 4)
    response = client.post("/v1/policy", json={"version": 3})
    assert response.status_code == 409
    assert response.json()["error"]["type"] == "policy_version_went_back"
    assert client.get("/v1/policy").json()["version"] == 4
    bad = client.post("/v1/policy", json={"version": -1})
    assert bad.status_code == 422
    assert client.post("/v1/policy", json={"version": 5, "oops": 1}).status_code == 422


def test_unreachable_proxies_are_reported_and_the_version_still_set(client: TestClient) -> None:
    update = set_version(client, 2, pause=True, drain_timeout_s=0.5)
    assert update["paused"] is True
    assert [p["ok"] for p in update["proxies"]] == [False]  # nothing listens on the proxy port
    assert client.get("/v1/policy").json() == {
        **client.get("/v1/policy").json(), "version": 2, "paused": True,
    }  # fmt: skip
    resumed = client.post("/v1/policy/resume").json()
    assert resumed["paused"] is False and resumed["version"] == 2
    assert client.get("/v1/policy").json()["paused"] is False


def test_stale_complete_groups_are_withheld_from_leases_and_free_capacity(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(client, n_tasks=6)  # capacity 4 at version 0
    groups = rollout_ids(db_session_factory, job_id)
    for rid in groups[0]:
        complete_rollout(db_session_factory, rid, policy_version=0)
    complete_rollout(db_session_factory, groups[1][0], policy_version=0)
    complete_rollout(db_session_factory, groups[1][1], policy_version=1)
    set_version(client, 2)  # oldest allowed now: 1; group 0 is stale, group 1 is fresh
    answer = lease(client, job_id)
    assert [g["task_index"] for g in answer["groups"]] == []  # group 1 holds a version-0 token
    assert answer["groups_stale"] == 2
    results = client.get(f"/v1/jobs/{job_id}/results?complete_only=false").json()["groups"]
    stale = {g["task_index"]: g["stale"] for g in results if g["stale"]}
    assert stale == {0: "withheld", 1: "withheld"}
    assert results[0]["policy_versions"]["min"] == 0
    status = client.get(f"/v1/jobs/{job_id}").json()["staleness"]
    assert status["stale_groups"] == 2 and status["capacity_groups"] == 8
    assert admitted(db_session_factory, job_id) == list(range(6))  # stale ones freed room

    for rid in groups[2]:
        complete_rollout(db_session_factory, rid, policy_version=2)
    fresh = lease(client, job_id)
    assert [g["task_index"] for g in fresh["groups"]] == [2]
    assert fresh["groups"][0]["stale"] is None
    assert fresh["groups"][0]["policy_versions"] == {"min": 2, "max": 2, "versions": [2]}


def test_a_leased_group_is_not_judged_again_until_its_lease_expires(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(client, n_tasks=2)
    for rid in rollout_ids(db_session_factory, job_id)[0]:
        complete_rollout(db_session_factory, rid, policy_version=0)
    held = lease(client, job_id)
    assert [g["task_index"] for g in held["groups"]] == [0]
    set_version(client, 3)
    delivery = held["groups"][0]["delivery"]["delivery_id"]
    acked = client.post(
        f"/v1/jobs/{job_id}/groups/ack", json={"consumer": "trainer", "delivery_ids": [delivery]}
    )
    assert acked.status_code == 200, acked.text  # handed out fresh: the trainer may train on it
    assert (
        client.get(f"/v1/jobs/{job_id}/results?complete_only=false").json()["groups"][0]["stale"]
        is None
    )


def test_drop_cancels_the_unfinished_rollouts_of_a_group_that_can_never_be_fresh(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(client, n_tasks=4, on_stale="drop")
    groups = rollout_ids(db_session_factory, job_id)
    complete_rollout(db_session_factory, groups[0][0], policy_version=0)
    running = groups[0][1]
    set_status(db_session_factory, running, RolloutStatus.RUNNING)
    with unit_of_work(db_session_factory) as session:  # its first call was served by version 0
        session.add(
            LlmCall(
                id=uuid.uuid4(), rollout_id=running, seq=0, backend="b", model="m",
                api_type="chat", policy_version=0, status_code=200, request={},
                latency_ms=1.0, created_at=utcnow(),
            )
        )  # fmt: skip
    update = set_version(client, 2)
    assert update["groups_stale"] == 1
    with unit_of_work(db_session_factory) as session:
        row = session.get_one(Rollout, running)
        assert (row.status, row.termination_reason) == ("cancelled", "stale")
        kinds = session.scalars(
            select(Event.kind).where(Event.job_id == uuid.UUID(job_id), Event.kind == "stale")
        ).all()
    assert kinds == [EventKind.STALE]
    results = client.get(f"/v1/jobs/{job_id}/results?complete_only=false").json()["groups"]
    assert results[0]["stale"] == "dropped" and results[0]["complete"] is True
    assert lease(client, job_id)["groups"] == []


def test_cancel_covers_held_rollouts(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(client, n_tasks=8)
    answer = client.post(f"/v1/jobs/{job_id}/cancel").json()
    assert len(answer["cancelled"]) == 16
    assert all(s == {"cancelled"} for s in statuses(db_session_factory, job_id).values())
    set_version(client, 9)
    assert all(s == {"cancelled"} for s in statuses(db_session_factory, job_id).values())
