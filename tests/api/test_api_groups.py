"""Group leases on a real PostgreSQL: completion order, redelivery after expiry, acknowledgements
(idempotent, all or nothing, refused when superseded or not yours) and lease extension."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from api_support import complete_rollout, fail_rollout, rollout_ids
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import GroupDelivery
from polar_mq.models.base import utcnow

# A short lease that still outlives the next request on a loaded machine (parallel test workers).
LEASE_S = 1.5


def submit(client: TestClient, n_tasks: int, samples: int = 2) -> str:
    tasks = [{"instruction": f"task {i}"} for i in range(n_tasks)]
    response = client.post("/v1/jobs", json={"tasks": tasks, "samples_per_task": samples})
    assert response.status_code == 201, response.text
    return str(response.json()["job_id"])


def complete_group(
    factory: sessionmaker[Session], job_id: str, task_index: int, ago_s: float = 0.0
) -> None:
    finished = utcnow() - timedelta(seconds=ago_s)
    for rid in rollout_ids(factory, job_id)[task_index]:
        complete_rollout(factory, rid, reward=1.0, finished_at=finished)


def lease(client: TestClient, job_id: str, consumer: str, **body: Any) -> dict[str, Any]:
    response = client.post(
        f"/v1/jobs/{job_id}/groups/lease", json={"consumer": consumer, "lease_s": 30, **body}
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def ack(client: TestClient, job_id: str, consumer: str, ids: list[str]) -> Any:
    return client.post(
        f"/v1/jobs/{job_id}/groups/ack", json={"consumer": consumer, "delivery_ids": ids}
    )


def ids(answer: dict[str, Any]) -> list[str]:
    return [g["delivery"]["delivery_id"] for g in answer["groups"]]


def test_groups_are_leased_in_completion_order_once_and_done_after_the_last_ack(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(client, n_tasks=3)
    complete_group(db_session_factory, job_id, 2, ago_s=5)
    complete_group(db_session_factory, job_id, 0, ago_s=1)
    first = lease(client, job_id, "trainer-a")
    assert [g["task_index"] for g in first["groups"]] == [2, 0]
    group = first["groups"][0]
    assert group["group_id"] == f"{job_id}:2" and group["n_samples"] == 2
    assert group["mean_reward"] == 1.0 and len(group["samples"]) == 2
    assert group["delivery"]["delivery_id"] == f"{job_id}:2:1"
    assert group["delivery"]["delivery_count"] == 1 and group["delivery"]["redelivered"] is False
    assert group["delivery"]["consumer"] == "trainer-a"
    assert (first["job_finished"], first["done"], first["groups_in_flight"]) == (False, False, 2)

    assert lease(client, job_id, "trainer-b")["groups"] == []  # both are leased
    complete_group(db_session_factory, job_id, 1)
    second = lease(client, job_id, "trainer-b", advantages="grpo")
    assert [g["task_index"] for g in second["groups"]] == [1]
    assert second["groups"][0]["samples"][0]["advantage"] == 0.0
    assert second["job_finished"] is True and second["done"] is False

    assert ack(client, job_id, "trainer-a", ids(first)).json() == {
        "acked": ids(first),
        "already_acked": [],
    }
    assert ack(client, job_id, "trainer-b", ids(second)).status_code == 200
    end = lease(client, job_id, "trainer-c")
    assert end["groups"] == [] and end["done"] is True
    assert (end["groups_acked"], end["groups_total"], end["groups_in_flight"]) == (3, 3, 0)


def test_incomplete_groups_are_delivered_and_max_groups_is_respected(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(client, n_tasks=3)
    for index in range(3):
        complete_group(db_session_factory, job_id, index, ago_s=3 - index)
    answer = lease(client, job_id, "t", max_groups=2, include_trajectories=True)
    assert [g["task_index"] for g in answer["groups"]] == [0, 1]
    assert answer["groups"][0]["samples"][0]["trajectories"]

    job2 = submit(client, n_tasks=1)
    ((ok, lost),) = rollout_ids(db_session_factory, job2)
    complete_rollout(db_session_factory, ok, reward=0.5)
    fail_rollout(db_session_factory, lost, reason="worker_lost")
    (group,) = lease(client, job2, "t")["groups"]
    assert group["incomplete"] is True and group["n_usable"] == 1


def test_an_expired_lease_is_handed_out_again_and_only_the_new_delivery_can_be_acked(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(client, n_tasks=1)
    complete_group(db_session_factory, job_id, 0)
    old = lease(client, job_id, "dead-trainer", lease_s=LEASE_S)
    assert ids(old) == [f"{job_id}:0:1"]
    assert lease(client, job_id, "next-trainer")["groups"] == []  # still leased
    time.sleep(LEASE_S + 0.1)
    new = lease(client, job_id, "next-trainer", lease_s=LEASE_S)
    (group,) = new["groups"]
    assert group["delivery"]["delivery_count"] == 2 and group["delivery"]["redelivered"] is True
    assert group["delivery"]["delivery_id"] == f"{job_id}:0:2"

    late = ack(client, job_id, "dead-trainer", ids(old))
    assert late.status_code == 409
    assert late.json()["error"]["type"] == "delivery_superseded"
    assert ack(client, job_id, "next-trainer", ids(new)).json()["acked"] == ids(new)
    assert ack(client, job_id, "next-trainer", ids(new)).json() == {
        "acked": [],
        "already_acked": ids(new),
    }
    time.sleep(LEASE_S + 0.1)  # the acked delivery's lease is over too
    assert lease(client, job_id, "third")["groups"] == []  # acked: never again
    with db_session_factory() as session:
        row = session.scalars(select(GroupDelivery)).one()
    assert (row.delivery_count, row.consumer, row.acked_at is not None) == (2, "next-trainer", True)


def test_a_late_ack_counts_while_nobody_else_took_the_group(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(client, n_tasks=1)
    complete_group(db_session_factory, job_id, 0)
    slow = lease(client, job_id, "slow", lease_s=0.2)
    time.sleep(0.3)
    assert ack(client, job_id, "slow", ids(slow)).json()["acked"] == ids(slow)
    assert lease(client, job_id, "other")["groups"] == []


def test_ack_errors_are_clear_and_all_or_nothing(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(client, n_tasks=2)
    complete_group(db_session_factory, job_id, 0)
    complete_group(db_session_factory, job_id, 1)
    mine = lease(client, job_id, "a", max_groups=1)
    theirs = lease(client, job_id, "b", max_groups=1)

    for bogus in ("nonsense", f"{job_id}:0:7", f"{job_id}:5:1", f"{uuid.uuid4()}:0:1"):
        response = ack(client, job_id, "a", [*ids(mine), bogus])
        assert response.status_code == 404, bogus
        assert response.json()["error"]["type"] == "unknown_delivery"
        assert bogus in response.json()["error"]["message"]
    stolen = ack(client, job_id, "a", [*ids(mine), *ids(theirs)])
    assert stolen.status_code == 409
    assert stolen.json()["error"]["type"] == "not_your_delivery"
    # nothing of the refused calls stuck: a's delivery is acked only now, for the first time
    assert ack(client, job_id, "a", ids(mine)).json()["acked"] == ids(mine)

    missing = ack(client, str(uuid.uuid4()), "a", ids(mine))
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"
    invalid = client.post(f"/v1/jobs/{job_id}/groups/lease", json={"consumer": ""})
    assert invalid.status_code == 422 and "consumer" in invalid.json()["error"]["message"]
    too_long = client.post(f"/v1/jobs/{job_id}/groups/lease", json={"consumer": "a", "wait_s": 1e4})
    assert too_long.status_code == 422


def test_extend_keeps_a_group_from_redelivery(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(client, n_tasks=1)
    complete_group(db_session_factory, job_id, 0)
    held = lease(client, job_id, "a", lease_s=0.5)
    url = f"/v1/jobs/{job_id}/groups/extend"
    body = {"consumer": "a", "delivery_ids": ids(held), "lease_s": 30}
    extended = client.post(url, json=body)
    assert extended.status_code == 200 and extended.json()["extended"] == ids(held)
    time.sleep(0.6)
    assert lease(client, job_id, "b")["groups"] == []
    wrong = client.post(url, json={**body, "consumer": "b"})
    assert wrong.status_code == 409 and wrong.json()["error"]["type"] == "not_your_delivery"
    assert ack(client, job_id, "a", ids(held)).status_code == 200
    after = client.post(url, json=body)
    assert after.status_code == 409 and after.json()["error"]["type"] == "already_acked"


def test_max_in_flight_holds_back_until_acks(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = submit(client, n_tasks=3)
    for index in range(3):
        complete_group(db_session_factory, job_id, index, ago_s=3 - index)
    first = lease(client, job_id, "a", max_in_flight=2)
    assert [g["task_index"] for g in first["groups"]] == [0, 1]
    assert lease(client, job_id, "a", max_in_flight=2)["groups"] == []
    ack(client, job_id, "a", ids(first)[:1])
    assert [g["task_index"] for g in lease(client, job_id, "a", max_in_flight=2)["groups"]] == [2]


@pytest.mark.parametrize("path", ["lease", "ack", "extend"])
def test_unknown_job_is_404(client: TestClient, path: str) -> None:
    body: dict[str, Any] = {"consumer": "a"}
    if path != "lease":
        body["delivery_ids"] = []
    response = client.post(f"/v1/jobs/{uuid.uuid4()}/groups/{path}", json=body)
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found"
