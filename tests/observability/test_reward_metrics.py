"""`polar_rollout_reward` and `polar_groups_ended_total` on the API's `/metrics`, counted in
PostgreSQL from rollouts ended the way the workers end them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.ui.app import create_app
from tests.api.api_support import complete_rollout, fail_rollout, rollout_ids
from tests.observability.scrape import Samples, value


@pytest.fixture()
def client(pg_url: str, db_session_factory: sessionmaker[Session]) -> Iterator[TestClient]:
    settings = Settings(database_url=pg_url, metrics_cache_s=0)

    def publish(messages: Sequence[StageMessage]) -> None:
        return None

    app = create_app(settings, session_factory=db_session_factory, publisher=publish)
    with TestClient(app) as test_client:
        yield test_client


def _scrape(client: TestClient) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return out


def _groups(client: TestClient, factory: sessionmaker[Session], n: int) -> list[list[uuid.UUID]]:
    tasks = [{"instruction": f"t{i}"} for i in range(n)]
    body = {"tasks": tasks, "samples_per_task": 2, "evaluator": "completed"}
    answer = client.post("/v1/jobs", json=body)
    assert answer.status_code == 201, answer.text
    return rollout_ids(factory, answer.json()["job_id"])


def test_rewards_and_no_signal_groups_are_exported(
    client: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    f = db_session_factory
    empty = _scrape(client)  # the series exist before any reward, at 0
    assert value(empty, "polar_rollout_reward_count", reason="completed") == 0
    assert value(empty, "polar_groups_ended_total", signal="none") == 0
    signal, flat, lost, running = _groups(client, f, 4)
    complete_rollout(f, signal[0], reward=1.0)
    complete_rollout(f, signal[1], reward=0.0)
    complete_rollout(f, flat[0], reward=0.5)
    complete_rollout(f, flat[1], reward=0.5)
    complete_rollout(f, lost[0], reward=1.0)
    fail_rollout(f, lost[1], reason="backend_error")  # unscored: one usable sample left
    complete_rollout(f, running[0], reward=1.0)  # its other sample has not ended
    samples = _scrape(client)
    assert value(samples, "polar_rollout_reward_count", reason="completed") == 6
    assert value(samples, "polar_rollout_reward_sum", reason="completed") == 4.0
    bucket = "polar_rollout_reward_bucket"
    assert value(samples, bucket, reason="completed", le="0") == 1  # 0 and below
    assert value(samples, bucket, reason="completed", le="0.5") == 3
    assert value(samples, bucket, reason="completed", le="1") == 6
    assert value(samples, bucket, reason="completed", le="+Inf") == 6
    assert value(samples, "polar_groups_ended_total", signal="some") == 1
    assert value(samples, "polar_groups_ended_total", signal="none") == 1
    assert value(samples, "polar_groups_ended_total", signal="too_few") == 1
    labels = {dict(k).get("reason") for k in samples[bucket]}
    assert labels == {"agent_error", "completed", "max_turns", "timeout", "token_budget"}
