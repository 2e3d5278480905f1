"""Jobs over HTTP: submit (messages after commit), idempotency, status counts, listing, results."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from api_support import (
    RecordingPublisher,
    complete_rollout,
    fail_rollout,
    rollout_ids,
    row_counts,
    set_status,
)
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.jobs import results
from polar_mq.lifecycle.stages import Stage
from polar_mq.models import RolloutStatus
from polar_mq.models.base import utcnow
from tests.conftest import module_database

pg_url, pg_engine = module_database("polar_mq_api_jobs")  # it counts every row


def _job(n_tasks: int = 2, samples: int = 3, **extra: Any) -> dict[str, Any]:
    tasks = [{"instruction": f"task {i}", "answer": str(i)} for i in range(n_tasks)]
    return {"tasks": tasks, "samples_per_task": samples, **extra}


def _submit(client: TestClient, **kw: Any) -> dict[str, Any]:
    response = client.post("/v1/jobs", json=_job(**kw))
    assert response.status_code == 201, response.text
    return dict(response.json())


def test_submit_creates_rows_then_publishes_prepare_messages(
    client: TestClient,
    publisher: RecordingPublisher,
    db_session_factory: sessionmaker[Session],
) -> None:
    body = _submit(client, n_tasks=2, samples=3)
    assert body["created"] is True
    assert len(body["rollout_ids"]) == 6
    assert [str(m.rollout_id) for m in publisher.messages] == body["rollout_ids"]
    assert {(m.stage, m.pool, m.node) for m in publisher.messages} == {(Stage.PREPARE, "cpu", None)}
    assert publisher.unseen_at_publish == []  # every message named a committed rollout
    counts = row_counts(db_session_factory)
    assert counts == {"jobs": 1, "job_tasks": 2, "rollouts": 6, "events": 6}


def test_submit_routes_to_the_requested_pool(
    client: TestClient, publisher: RecordingPublisher
) -> None:
    _submit(client, n_tasks=1, samples=2, pool="gpu-a")
    assert {m.pool for m in publisher.messages} == {"gpu-a"}


def test_priority_goes_on_every_message_and_shows_in_the_status(
    client: TestClient, publisher: RecordingPublisher
) -> None:
    urgent = _submit(client, n_tasks=1, samples=2, priority=9)
    default = _submit(client, n_tasks=1, samples=1)
    assert [m.priority for m in publisher.messages] == [9, 9, 0]
    status = client.get(f"/v1/jobs/{urgent['job_id']}").json()
    assert (status["priority"], status["spec"]["priority"]) == (9, 9)
    assert client.get(f"/v1/jobs/{default['job_id']}").json()["priority"] == 0


def test_idempotency_key_returns_the_existing_job(
    client: TestClient,
    publisher: RecordingPublisher,
    db_session_factory: sessionmaker[Session],
) -> None:
    spec = _job(idempotency_key="run-42")
    first = client.post("/v1/jobs", json=spec)
    second = client.post("/v1/jobs", json=spec)
    assert first.status_code == 201 and second.status_code == 200
    assert second.json()["created"] is False
    assert second.json()["job_id"] == first.json()["job_id"]
    assert second.json()["rollout_ids"] == first.json()["rollout_ids"]
    assert len(publisher.messages) == 6  # the resubmission published nothing
    assert row_counts(db_session_factory)["jobs"] == 1


def test_idempotency_key_with_a_different_body_is_a_conflict(
    client: TestClient,
    publisher: RecordingPublisher,
    db_session_factory: sessionmaker[Session],
) -> None:
    assert client.post("/v1/jobs", json=_job(idempotency_key="k")).status_code == 201
    response = client.post("/v1/jobs", json=_job(samples=4, idempotency_key="k"))
    assert response.status_code == 409
    assert response.json()["error"]["type"] == "idempotency_conflict"
    assert "'k'" in response.json()["error"]["message"]
    assert row_counts(db_session_factory)["rollouts"] == 6
    assert len(publisher.messages) == 6


def test_an_untrusted_preset_is_stored_with_the_proxy_only_network(client: TestClient) -> None:
    """The effective network is resolved at submit and shown; a resubmission still matches."""
    job = _job(harness={"type": "smolagents"}, runtime={"kind": "bwrap"}, idempotency_key="n")
    submitted = _submit(
        client, harness={"type": "smolagents"}, runtime={"kind": "bwrap"}, idempotency_key="n"
    )
    shown = client.get(f"/v1/jobs/{submitted['job_id']}").json()["spec"]["runtime"]
    assert shown["network"] == "proxy_only"
    again = client.post("/v1/jobs", json=job)
    assert again.status_code == 200 and again.json()["job_id"] == submitted["job_id"]
    host = {**job, "runtime": {"kind": "bwrap", "network": "host"}}
    assert client.post("/v1/jobs", json=host).status_code == 409  # a different request
    command = _submit(
        client, harness={"type": "command", "command": "true"}, runtime={"kind": "bwrap"}
    )
    shown = client.get(f"/v1/jobs/{command['job_id']}").json()["spec"]["runtime"]
    assert shown["network"] == "host"  # the user's own code: unchanged


def test_idempotency_treats_the_default_priority_as_unset_and_another_as_a_change(
    client: TestClient, publisher: RecordingPublisher
) -> None:
    assert client.post("/v1/jobs", json=_job(idempotency_key="p")).status_code == 201
    same = client.post("/v1/jobs", json=_job(idempotency_key="p", priority=0))
    assert same.status_code == 200  # jobs stored before priorities existed resubmit the same way
    other = client.post("/v1/jobs", json=_job(idempotency_key="p", priority=5))
    assert other.status_code == 409
    assert len(publisher.messages) == 6


def test_status_counts_stages_outcomes_groups_and_reward(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = _submit(client, n_tasks=3, samples=2)["job_id"]
    (a, b), (c, d), (e, f) = rollout_ids(db_session_factory, job_id)
    set_status(db_session_factory, a, RolloutStatus.PREPARING)
    set_status(db_session_factory, b, RolloutStatus.PREPARED)
    set_status(db_session_factory, c, RolloutStatus.RUNNING)
    complete_rollout(db_session_factory, d, reward=1.0)
    fail_rollout(db_session_factory, e, reason="runtime_error")
    complete_rollout(db_session_factory, f, reward=0.0)

    status = client.get(f"/v1/jobs/{job_id}").json()
    assert status["state"] == "running"
    assert (status["total"], status["terminal"]) == (6, 3)
    assert status["stages"] == {
        "prepare": {"queued": 0, "running": 1},
        "run_agent": {"queued": 1, "running": 1},
        "build": {"queued": 0, "running": 0},
        "evaluate": {"queued": 0, "running": 0},
    }
    assert status["by_status"] == {"completed": 2, "failed": 1}
    assert status["by_termination_reason"] == {"completed": 2, "runtime_error": 1}
    assert (status["groups_complete"], status["groups_total"]) == (1, 3)
    assert status["n_scored"] == 2 and status["mean_reward"] == pytest.approx(0.5)
    assert status["finished_at"] is None

    for rid in (a, b, c):
        complete_rollout(db_session_factory, rid, reward=1.0)
    done = client.get(f"/v1/jobs/{job_id}").json()
    assert done["state"] == "completed_with_failures"  # e failed
    assert done["groups_complete"] == 3
    assert done["finished_at"] is not None
    assert done["mean_reward"] == pytest.approx(4 / 5)  # the infrastructure failure is unscored


def test_unknown_job_is_404(client: TestClient) -> None:
    response = client.get(f"/v1/jobs/{uuid.uuid4()}")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found"
    bad = client.get("/v1/jobs/not-a-uuid")
    assert bad.status_code == 422
    assert bad.json()["error"]["message"].startswith("job_id:")


def test_list_jobs_newest_first_with_a_keyset_cursor(client: TestClient) -> None:
    created = [_submit(client, n_tasks=1, samples=1)["job_id"] for _ in range(5)]
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/jobs", params=params).json()
        seen += [job["job_id"] for job in page["jobs"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(created))
    assert pages == 3
    assert client.get("/v1/jobs").json()["jobs"][0]["state"] == "running"


def test_bad_cursor_is_400(client: TestClient) -> None:
    job_id = _submit(client, n_tasks=1, samples=1)["job_id"]
    for url in ("/v1/jobs?cursor=garbage!", f"/v1/jobs/{job_id}/results?cursor=WzEsMiwzXQ"):
        response = client.get(url)
        assert response.status_code == 400, url
        assert response.json()["error"]["type"] == "invalid_cursor"


def _collect(client: TestClient, job_id: str, **params: Any) -> list[list[dict[str, Any]]]:
    pages: list[list[dict[str, Any]]] = []
    cursor = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        page = client.get(f"/v1/jobs/{job_id}/results", params=query).json()
        pages.append(page["groups"])
        cursor = page["next_cursor"]
        if cursor is None:
            return pages


def test_results_complete_groups_in_completion_order(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = _submit(client, n_tasks=4, samples=2)["job_id"]
    groups = rollout_ids(db_session_factory, job_id)
    now = utcnow()
    for task_index, age_s in ((2, 30), (0, 20), (3, 10)):
        for rid in groups[task_index]:
            complete_rollout(
                db_session_factory, rid, reward=0.5, finished_at=now - timedelta(seconds=age_s)
            )
    complete_rollout(db_session_factory, groups[1][0], reward=1.0)  # group 1 stays incomplete

    pages = _collect(client, job_id, limit=2)
    assert [[g["task_index"] for g in page] for page in pages] == [[2, 0], [3]]
    first = pages[0][0]
    assert first["complete"] is True and first["task"] == {"instruction": "task 2", "answer": "2"}
    assert first["mean_reward"] == pytest.approx(0.5) and first["n_usable"] == 2
    assert [s["sample_index"] for s in first["samples"]] == [0, 1]
    sample = first["samples"][0]
    assert sample["status"] == "completed" and sample["termination_reason"] == "completed"
    assert sample["n_llm_calls"] == 2 and sample["attempt"] == 1
    assert sample["trajectories"] is None

    # a group's own cursor resumes right after it
    after = client.get(
        f"/v1/jobs/{job_id}/results", params={"cursor": pages[0][0]["cursor"]}
    ).json()
    assert [g["task_index"] for g in after["groups"]] == [0, 3]
    assert after["job_state"] == "running" and after["job_finished"] is False

    every = _collect(client, job_id, complete_only="false", limit=3)
    flat = [g for page in every for g in page]
    assert [g["task_index"] for g in flat] == [0, 1, 2, 3]
    assert [g["complete"] for g in flat] == [True, False, True, True]
    assert flat[1]["completed_at"] is None


def test_results_with_trajectories(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = _submit(client, n_tasks=1, samples=2)["job_id"]
    ((first, second),) = rollout_ids(db_session_factory, job_id)
    complete_rollout(db_session_factory, first, n_calls=2)
    complete_rollout(db_session_factory, second, n_calls=1)
    page = client.get(f"/v1/jobs/{job_id}/results", params={"include_trajectories": "true"}).json()
    samples = page["groups"][0]["samples"]
    assert [len(s["trajectories"]) for s in samples] == [2, 1]
    piece = samples[0]["trajectories"][1]
    assert piece == {
        "sample_index": 1,
        "prompt_ids": [1, 2, 4],
        "response_ids": [7, 8],
        "loss_mask": [1, 1],
        "logprobs": [-0.5, -0.25],
        "meta": {"calls": [1]},
    }
    assert page["job_finished"] is True and page["job_state"] == "completed"


def test_results_hold_back_just_completed_groups_while_the_job_runs(
    client: TestClient, db_session_factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(results, "RESULTS_SETTLE_S", 60.0)
    job_id = _submit(client, n_tasks=2, samples=1)["job_id"]
    (a,), (b,) = rollout_ids(db_session_factory, job_id)
    complete_rollout(db_session_factory, a)
    url = f"/v1/jobs/{job_id}/results"
    assert client.get(url).json()["groups"] == []  # completed just now: not settled yet
    complete_rollout(db_session_factory, b)
    # once every rollout is terminal nothing can still be in flight: all groups are listed
    assert [g["task_index"] for g in client.get(url).json()["groups"]] == [0, 1]


def test_results_of_unknown_job_is_404(client: TestClient) -> None:
    response = client.get(f"/v1/jobs/{uuid.uuid4()}/results")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found"
