"""Rollout detail, trajectory and LLM calls over HTTP, from hand-written stage progress."""

from __future__ import annotations

import uuid

import pytest
from api_support import complete_rollout, fail_rollout, rollout_ids, set_status
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import RolloutStatus


def _one_rollout(client: TestClient, factory: sessionmaker[Session]) -> uuid.UUID:
    job = client.post("/v1/jobs", json={"tasks": [{"instruction": "fix the bug"}]}).json()
    ((rid,),) = rollout_ids(factory, job["job_id"])
    return rid


def test_detail_of_a_completed_rollout(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    rid = _one_rollout(client, db_session_factory)
    complete_rollout(db_session_factory, rid, reward=0.75)
    detail = client.get(f"/v1/rollouts/{rid}").json()
    assert detail["rollout_id"] == str(rid)
    assert detail["status"] == "completed" and detail["stage"] is None
    assert detail["reward"] == pytest.approx(0.75)
    assert detail["termination_reason"] == "completed"
    assert detail["node"] == "test-node" and detail["n_llm_calls"] == 2
    assert set(detail["timings"]) == {"prepare", "run_agent", "build", "evaluate"}
    prepare = detail["timings"]["prepare"]
    assert prepare["outcome"] == "finished" and prepare["duration_s"] == pytest.approx(1.5)
    assert prepare["started_at"] < prepare["ended_at"]
    kinds = [(e["stage"], e["kind"]) for e in detail["events"]]
    assert kinds[0] == ("prepare", "submitted")
    assert kinds[-1] == ("evaluate", "finished")
    assert detail["evaluation"]["evaluator"] == "completed"
    assert detail["evaluation"]["detail"] == {"why": "exit 0"}


def test_detail_of_a_failed_and_of_a_running_rollout(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    rid = _one_rollout(client, db_session_factory)
    set_status(db_session_factory, rid, RolloutStatus.RUNNING)
    running = client.get(f"/v1/rollouts/{rid}").json()
    assert running["stage"] == "run_agent" and running["timings"] == {}

    fail_rollout(db_session_factory, rid, reason="worker_lost")
    failed = client.get(f"/v1/rollouts/{rid}").json()
    assert failed["status"] == "failed" and failed["termination_reason"] == "worker_lost"
    assert failed["error"] == "container vanished" and failed["reward"] is None
    timing = failed["timings"]["run_agent"]
    assert timing["outcome"] == "failed" and timing["duration_s"] == pytest.approx(1.0)
    assert failed["evaluation"] is None


def test_trajectory_and_calls(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    rid = _one_rollout(client, db_session_factory)
    empty = client.get(f"/v1/rollouts/{rid}/trajectory").json()
    assert empty["samples"] == [] and empty["status"] == "queued"
    complete_rollout(db_session_factory, rid, n_calls=2)

    trajectory = client.get(f"/v1/rollouts/{rid}/trajectory").json()
    assert trajectory["attempt"] == 1
    assert [s["sample_index"] for s in trajectory["samples"]] == [0, 1]
    sample = trajectory["samples"][0]
    assert sample["prompt_ids"] == [1, 2, 3] and sample["response_ids"] == [7, 8]
    assert sample["loss_mask"] == [1, 1] and sample["logprobs"] == [-0.5, -0.25]
    assert sample["builder"] == "per_call" and sample["meta"] == {"calls": [0]}

    calls = client.get(f"/v1/rollouts/{rid}/calls").json()["calls"]
    assert [c["seq"] for c in calls] == [0, 1]
    assert calls[1]["prompt_ids"] == [1, 2, 4] and calls[1]["completion_ids"] == [7, 8]
    assert calls[1]["logprobs"] == [-0.5, -0.25] and calls[1]["policy_version"] == 3
    assert calls[0]["request"]["messages"][0]["content"] == "q0"
    assert calls[0]["response"]["choices"][0]["message"]["content"] == "a0"


@pytest.mark.parametrize("suffix", ["", "/trajectory", "/calls"])
def test_unknown_rollout_is_404(client: TestClient, suffix: str) -> None:
    response = client.get(f"/v1/rollouts/{uuid.uuid4()}{suffix}")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found"
    assert "rollout" in response.json()["error"]["message"]
