"""The job page's plots are aggregated in the database: a fixed number of queries whatever the
job's size, on PostgreSQL and on the embedded SQLite alike."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker
from ui_support import submit

from polar_mq.config import Settings
from polar_mq.infra.db import create_db_engine, make_session_factory
from polar_mq.infra.migrate import upgrade
from polar_mq.models.base import utcnow
from polar_mq.ui.app import create_app
from polar_mq.ui.job_plots import JobPlots, job_plots
from tests.api.api_support import RecordingPublisher, complete_rollout, fail_rollout
from tests.ui.conftest import Keys


def _statements(engine: Engine, run: Any) -> tuple[Any, list[str]]:
    seen: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        return run(), seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _fill(factory: sessionmaker[Session], rollouts: list[uuid.UUID]) -> None:
    start = utcnow()
    for i, rid in enumerate(rollouts[:-1]):
        at = start + timedelta(seconds=i)
        complete_rollout(factory, rid, float(i % 2), finished_at=at, policy_version=i % 3)
    fail_rollout(factory, rollouts[-1], "backend_error", finished_at=start)


def test_the_plots_cost_the_same_queries_for_a_small_and_a_bigger_job(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session], pg_engine: Engine
) -> None:
    small, small_rollouts = submit(client, keys.alice_write, [{"instruction": "a"}], 3)
    big, big_rollouts = submit(
        client, keys.alice_write, [{"instruction": f"t{i}"} for i in range(10)], 4
    )
    _fill(db_session_factory, small_rollouts)
    _fill(db_session_factory, big_rollouts)
    with db_session_factory() as session:
        small_plots, few = _statements(pg_engine, lambda: job_plots(session, small))
        big_plots, many = _statements(pg_engine, lambda: job_plots(session, big))
    assert len(few) == len(many)  # aggregates: nothing per rollout or per call
    assert all("GROUP BY" in s or "count(" in s or "max(" in s for s in many)
    assert small_plots.rewards.n == 2 and big_plots.rewards.n == 39
    assert big_plots.call_tokens.n == 78  # 39 rollouts x 2 calls, read as counts
    assert sum(v.n for v in big_plots.versions) == 39


def _summary(plots: JobPlots) -> tuple[object, ...]:
    throughput = plots.throughput
    assert throughput is not None
    return (
        plots.rewards.n, plots.rewards.mean, plots.signal, plots.call_tokens.n,
        plots.call_tokens.mean, plots.call_latency_ms.mean, plots.rollout_tokens.mean,
        round(plots.rollout_seconds.mean or 0, 3),
        [(v.version, v.n, v.mean) for v in plots.versions],
        sum(throughput.rollouts), sum(throughput.tokens),
        plots.rewards.hist.counts if plots.rewards.hist else None,
    )  # fmt: skip


def _sqlite_plots(tmp_path: Path, tasks: list[dict[str, object]]) -> tuple[object, ...]:
    url = f"sqlite:///{tmp_path / 'ui.db'}"
    upgrade(url)
    engine = create_db_engine(url)
    try:
        factory = make_session_factory(engine)
        settings = Settings.model_validate({"database_url": url, "pool": "cpu"})
        app = create_app(settings, session_factory=factory, publisher=RecordingPublisher(factory))
        with TestClient(app) as sqlite_client:
            answer = sqlite_client.post("/v1/jobs", json={"tasks": tasks, "samples_per_task": 4})
            assert answer.status_code == 201, answer.text
            rollouts = [uuid.UUID(r) for r in answer.json()["rollout_ids"]]
            _fill(factory, rollouts)
            page = sqlite_client.get(f"/ui/jobs/{answer.json()['job_id']}")
            assert page.status_code == 200 and 'id="plot-rewards"' in page.text
        with factory() as session:
            return _summary(job_plots(session, uuid.UUID(answer.json()["job_id"])))
    finally:
        engine.dispose()


def test_sqlite_and_postgresql_draw_the_same_plots(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    tasks: list[dict[str, object]] = [{"instruction": f"t{i}"} for i in range(3)]
    job, rollouts = submit(client, keys.alice_write, tasks, 4)
    _fill(db_session_factory, rollouts)
    with db_session_factory() as session:
        on_postgres = _summary(job_plots(session, job))
    assert _sqlite_plots(tmp_path, tasks) == on_postgres
