"""Truthful charts, timelines and states: retried and cancelled attempts are closed everywhere.

Before, the running-per-stage chart kept every attempt that never logged an end (restarted by the
agent stage or the sweeper, or cancelled) running until now (72 running with 4 slots, flat after
the job ended); a retried attempt's run_agent row stayed `running`; a cancelled stage's timing
stayed `running`; and an ended job with failures read as a green `completed`.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from ui_support import sign_in, submit

from polar_mq.infra.db import unit_of_work
from polar_mq.jobs.read_models import EventRecord
from polar_mq.models import Event, Rollout, RolloutStatus
from polar_mq.models.base import utcnow
from polar_mq.ui.queries import STAGES, stage_intervals
from polar_mq.ui.timeline import stage_spans
from tests.api.api_support import complete_rollout, fail_rollout
from tests.ui.conftest import Keys

T0 = datetime(2026, 1, 1)


def _events(
    factory: sessionmaker[Session], rollout_id: uuid.UUID, *rows: tuple[str, str, int, float]
) -> None:
    """(stage, kind, attempt, seconds after T0) events of a rollout, as the workers log them."""
    with unit_of_work(factory) as session:
        rollout = session.get_one(Rollout, rollout_id)
        for stage, kind, attempt, s in rows:
            at = utcnow() - timedelta(seconds=60 - s)
            event = Event(job_id=rollout.job_id, rollout_id=rollout_id, stage=stage, kind=kind)
            event.attempt, event.worker, event.at, event.detail = attempt, "w", at, {}
            session.add(event)


def _set(factory: sessionmaker[Session], rollout_id: uuid.UUID, **values: object) -> None:
    with unit_of_work(factory) as session:
        rollout = session.get_one(Rollout, rollout_id)
        for key, value in values.items():
            setattr(rollout, key, value)


def _open_runs(factory: sessionmaker[Session], job: uuid.UUID) -> dict[str, int]:
    with factory() as session:
        intervals = stage_intervals(session, job)
    counts = dict.fromkeys(STAGES, 0)
    for stage, _, end in intervals:
        if end is None:
            counts[stage] += 1
    return counts


def test_stage_chart_counts_only_what_really_runs(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session]
) -> None:
    job, (retried, cancelled, running, given_up) = submit(
        client, keys.alice_write, [{"instruction": "a"}], 4
    )
    f = db_session_factory
    # restarted once (the engine 503'd under the agent), then completed in attempt 2
    _events(f, retried, ("prepare", "started", 1, 0), ("prepare", "finished", 1, 1),
            ("run_agent", "started", 1, 2), ("run_agent", "requeued", 2, 5))  # fmt: skip
    _set(f, retried, attempt=2)
    complete_rollout(f, retried, reward=1.0)
    # cancelled while its agent ran
    _events(f, cancelled, ("run_agent", "started", 1, 3))
    _set(f, cancelled, status=RolloutStatus.RUNNING)
    # restarted, its new attempt then failed for good
    _events(f, given_up, ("run_agent", "started", 1, 2), ("run_agent", "requeued", 2, 4))
    _set(f, given_up, attempt=2)
    fail_rollout(f, given_up, reason="backend_error")
    # really running now
    _events(f, running, ("run_agent", "started", 1, 4))
    _set(f, running, status=RolloutStatus.RUNNING)
    assert client.post(
        f"/v1/rollouts/{cancelled}/cancel", headers={"authorization": f"Bearer {keys.alice_write}"}
    ).json()["cancelled"] == [str(cancelled)]

    status = client.get(
        f"/v1/jobs/{job}", headers={"authorization": f"Bearer {keys.alice_read}"}
    ).json()
    really = {stage: slots["running"] for stage, slots in status["stages"].items()}
    assert really == {"prepare": 0, "run_agent": 1, "build": 0, "evaluate": 0}
    assert _open_runs(f, job) == really

    # once the last one ends, nothing is running on the chart either
    complete_rollout(f, running, reward=0.0)
    assert _open_runs(f, job) == dict.fromkeys(STAGES, 0)
    sign_in(client, keys.alice_read)
    page = client.get(f"/ui/jobs/{job}").text
    assert 'class="state completed_with_failures"' in page
    assert ">completed with failures<" in page
    assert 'class="state-bar completed_with_failures"' in page


def test_rest_timings_close_a_stage_cancelled_while_it_ran(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session]
) -> None:
    _, (rollout,) = submit(client, keys.alice_write, [{"instruction": "a"}], 1)
    _events(db_session_factory, rollout, ("run_agent", "started", 1, 3))
    _set(db_session_factory, rollout, status=RolloutStatus.RUNNING)
    auth = {"authorization": f"Bearer {keys.alice_write}"}
    assert client.post(f"/v1/rollouts/{rollout}/cancel", headers=auth).status_code == 200
    detail = client.get(f"/v1/rollouts/{rollout}", headers=auth).json()
    timing = detail["timings"]["run_agent"]
    assert timing["outcome"] == "cancelled" and timing["ended_at"] is not None
    sign_in(client, keys.alice_read)
    page = client.get(f"/ui/rollouts/{rollout}").text
    assert ">running<" not in page


def test_dashboard_names_each_ended_state_apart(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session]
) -> None:
    auth = {"authorization": f"Bearer {keys.alice_write}"}
    done, (a,) = submit(client, keys.alice_write, [{"instruction": "a"}], 1)
    complete_rollout(db_session_factory, a)
    failed, (b,) = submit(client, keys.alice_write, [{"instruction": "b"}], 1)
    fail_rollout(db_session_factory, b, reason="backend_error")
    cancelled, _ = submit(client, keys.alice_write, [{"instruction": "c"}], 1)
    assert client.post(f"/v1/jobs/{cancelled}/cancel", headers=auth).status_code == 200
    sign_in(client, keys.alice_read)
    listing = client.get("/ui/").text
    for job, state in ((done, "completed"), (failed, "failed"), (cancelled, "cancelled")):
        row = listing.split(str(job)[:8], 1)[1].split("</tr>", 1)[0]
        assert f'class="state {state}"' in row, (state, row)
        assert f'class="state-bar {state}"' in row, (state, row)


def ev(i: int, stage: str, kind: str, attempt: int = 1, s: float = 0.0) -> EventRecord:
    return EventRecord(i, stage, kind, attempt, "w", T0 + timedelta(seconds=s), {})


def test_timeline_closes_a_retried_attempt_and_a_cancelled_stage() -> None:
    retried = [
        ev(1, "run_agent", "started", s=1),
        ev(2, "run_agent", "requeued", 2, s=5),
        ev(3, "prepare", "started", 2, s=6),
    ]
    spans, _ = stage_spans(retried)
    first = spans[0]
    assert (first.attempt, first.stage, first.outcome) == (1, "run_agent", "retried")
    assert first.ended_at == T0 + timedelta(seconds=5)

    cancelled = [
        ev(1, "prepare", "finished", s=1),
        ev(2, "run_agent", "started", s=2),
        ev(3, "cancel", "cancelled", s=9),
    ]
    spans, _ = stage_spans(cancelled)
    agent = next(s for s in spans if s.stage == "run_agent")
    assert agent.outcome == "cancelled" and agent.ended_at == T0 + timedelta(seconds=9)
    assert not [s for s in spans if s.outcome in ("queued", "running")]
