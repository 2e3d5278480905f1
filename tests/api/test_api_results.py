"""Results a trainer can use: usable samples, group statistics, GRPO advantages, incomplete groups,
retries, policy versions, and an OpenAPI schema that documents all of it."""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest
from api_support import complete_rollout, fail_rollout, rollout_ids
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.db import unit_of_work
from polar_mq.jobs.group_stats import GRPO_EPS
from polar_mq.models import Rollout, RolloutStatus, TrajectorySample


def _submit(client: TestClient, n_tasks: int, samples: int) -> str:
    tasks = [{"instruction": f"task {i}", "answer": str(i)} for i in range(n_tasks)]
    response = client.post("/v1/jobs", json={"tasks": tasks, "samples_per_task": samples})
    assert response.status_code == 201, response.text
    return str(response.json()["job_id"])


def _results(client: TestClient, job_id: str, **params: Any) -> dict[str, Any]:
    response = client.get(f"/v1/jobs/{job_id}/results", params=params)
    assert response.status_code == 200, response.text
    return dict(response.json())


def _set_versions(
    factory: sessionmaker[Session], rollout_id: uuid.UUID, versions: list[list[int]]
) -> None:
    """Give the rollout's training samples (current attempt) these `policy_versions` metas."""
    with unit_of_work(factory) as session:
        for index, piece_versions in enumerate(versions):
            session.execute(
                update(TrajectorySample)
                .where(
                    TrajectorySample.rollout_id == rollout_id,
                    TrajectorySample.sample_index == index,
                )
                .values(meta={"policy_versions": piece_versions})
            )


def test_infrastructure_failures_are_unscored_and_mark_the_group_incomplete(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = _submit(client, n_tasks=2, samples=3)
    (a, b, c), (d, e, f) = rollout_ids(db_session_factory, job_id)
    complete_rollout(db_session_factory, a, reward=1.0)
    complete_rollout(db_session_factory, b, reward=0.0)
    fail_rollout(db_session_factory, c, reason="worker_lost")
    for rid, reward in ((d, 1.0), (e, 0.5), (f, 0.0)):
        complete_rollout(db_session_factory, rid, reward=reward)
    # a reward written before the infrastructure failure must still never reach the trainer
    with unit_of_work(db_session_factory) as session:
        session.execute(update(Rollout).where(Rollout.id == c).values(reward=0.0))

    first, second = _results(client, job_id, complete_only="false")["groups"]
    assert first["group_id"] == f"{job_id}:0" and second["group_id"] == f"{job_id}:1"
    assert (first["complete"], first["incomplete"]) == (True, True)
    assert (first["n_samples"], first["n_usable"]) == (3, 2)
    assert first["mean_reward"] == pytest.approx(0.5)
    assert first["std_reward"] == pytest.approx(0.5)  # population std of [1, 0]
    failed = first["samples"][2]
    assert failed["termination_reason"] == "worker_lost"
    assert failed["reward"] is None and failed["usable"] is False
    assert [s["usable"] for s in first["samples"]] == [True, True, False]
    assert {s["group_id"] for s in first["samples"]} == {first["group_id"]}

    assert (second["incomplete"], second["n_usable"]) == (False, 3)
    assert second["mean_reward"] == pytest.approx(0.5)
    assert second["std_reward"] == pytest.approx(math.sqrt(1 / 6))
    assert all(s["advantage"] is None for g in (first, second) for s in g["samples"])


def test_grpo_advantages_over_usable_samples(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = _submit(client, n_tasks=2, samples=3)
    (a, b, c), (d, e, f) = rollout_ids(db_session_factory, job_id)
    complete_rollout(db_session_factory, a, reward=1.0)
    complete_rollout(db_session_factory, b, reward=0.0)
    fail_rollout(db_session_factory, c, reason="backend_error")
    for rid in (d, e, f):
        complete_rollout(db_session_factory, rid, reward=1.0)

    groups = _results(client, job_id, advantages="grpo", complete_only="false")["groups"]
    advantages = [[s["advantage"] for s in g["samples"]] for g in groups]
    scale = 0.5 + GRPO_EPS
    assert advantages[0][0] == pytest.approx(0.5 / scale, rel=1e-12)
    assert advantages[0][1] == pytest.approx(-0.5 / scale, rel=1e-12)
    assert advantages[0][2] is None  # the infrastructure failure gets no advantage
    assert advantages[1] == [0.0, 0.0, 0.0]  # equal rewards: no signal, and no division by 0


def test_advantages_only_for_complete_groups_and_known_kinds(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = _submit(client, n_tasks=1, samples=2)
    ((a, _b),) = rollout_ids(db_session_factory, job_id)
    complete_rollout(db_session_factory, a, reward=1.0)
    (group,) = _results(client, job_id, advantages="grpo", complete_only="false")["groups"]
    assert group["complete"] is False and group["incomplete"] is False
    assert group["n_usable"] == 1 and group["mean_reward"] == 1.0
    assert [s["advantage"] for s in group["samples"]] == [None, None]

    bad = client.get(f"/v1/jobs/{job_id}/results", params={"advantages": "ppo"})
    assert bad.status_code == 422
    assert bad.json()["error"]["type"] == "validation_error"
    assert "advantages" in bad.json()["error"]["message"]


def test_a_rollout_sent_back_for_another_attempt_keeps_its_group_open(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = _submit(client, n_tasks=1, samples=2)
    ((a, b),) = rollout_ids(db_session_factory, job_id)
    complete_rollout(db_session_factory, a, reward=1.0)
    complete_rollout(db_session_factory, b, reward=0.0)  # attempt 1's samples
    with unit_of_work(db_session_factory) as session:  # the sweeper restarts b from prepare
        session.execute(
            update(Rollout)
            .where(Rollout.id == b)
            .values(status=RolloutStatus.QUEUED, attempt=2, reward=None, finished_at=None,
                    termination_reason=None)
        )  # fmt: skip
    assert _results(client, job_id)["groups"] == []  # not complete while b runs again
    (open_group,) = _results(client, job_id, complete_only="false")["groups"]
    assert open_group["complete"] is False and open_group["completed_at"] is None

    complete_rollout(db_session_factory, b, reward=1.0, n_calls=1)  # attempt 2
    (group,) = _results(client, job_id, include_trajectories="true")["groups"]
    assert (group["complete"], group["incomplete"], group["n_usable"]) == (True, False, 2)
    retried = group["samples"][1]
    assert retried["attempt"] == 2 and retried["reward"] == 1.0
    assert len(retried["trajectories"]) == 1  # attempt 1's two samples are not mixed in


def test_policy_versions_seen_by_each_sample(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    job_id = _submit(client, n_tasks=1, samples=2)
    ((a, b),) = rollout_ids(db_session_factory, job_id)
    complete_rollout(db_session_factory, a, n_calls=2)
    complete_rollout(db_session_factory, b, n_calls=1)
    _set_versions(db_session_factory, a, [[5, 3], [7]])  # weights changed mid-rollout
    for trajectories in ("false", "true"):
        (group,) = _results(client, job_id, include_trajectories=trajectories)["groups"]
        first, second = group["samples"]
        assert first["policy_versions"] == {"min": 3, "max": 7, "versions": [3, 5, 7]}
        assert second["policy_versions"] is None  # its samples name no versions
    assert first["trajectories"][1]["meta"] == {"policy_versions": [7]}


def test_openapi_documents_the_results_fields(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    group = schemas["GroupResult"]["properties"]
    for name in ("group_id", "incomplete", "n_samples", "n_usable", "mean_reward", "std_reward"):
        assert name in group, name
    sample = schemas["SampleResult"]["properties"]
    for name in ("group_id", "usable", "reward", "advantage", "policy_versions"):
        assert name in sample, name
    assert set(schemas["PolicyVersions"]["properties"]) == {"min", "max", "versions"}
    params = spec["paths"]["/v1/jobs/{job_id}/results"]["get"]["parameters"]
    (advantages,) = [p for p in params if p["name"] == "advantages"]
    assert "grpo" in str(advantages["schema"])
