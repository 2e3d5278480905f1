"""Job priorities: the 0..9 scale, its mapping per broker, and every hop of a rollout keeping it.

A hop that forgot the priority would silently demote a rollout to the lowest one, so each place
that builds a stage message is exercised here: submit, next stage, in-place retry, restart from
prepare, and both sweeper paths (expired lease, lost message).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.dispatch.celery_app import create_celery
from polar_mq.dispatch.priority import (
    REDIS_PRIORITY_STEPS,
    BrokerKind,
    broker_kind,
    broker_priority,
)
from polar_mq.infra.db import unit_of_work
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.lifecycle.recovery import restart_claimed
from polar_mq.lifecycle.stages import Stage
from polar_mq.lifecycle.transitions import Claimed, claim
from polar_mq.models.base import utcnow
from polar_mq.spec import load_spec
from polar_mq.workers.context import WorkerContext
from polar_mq.workers.run_result import RunResult
from polar_mq.workers.runner import _next_message, _unexpected
from polar_mq.workers.stages.outcomes import Prepared
from polar_mq.workers.sweeper import Sweeper


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("redis://127.0.0.1:6379/0", BrokerKind.REDIS),
        ("rediss://h:6380/1", BrokerKind.REDIS),
        ("sentinel://a:26379;sentinel://b:26379", BrokerKind.REDIS),
        ("amqp://guest@h//", BrokerKind.AMQP),
        ("pyamqp://h//", BrokerKind.AMQP),
        ("sqla+sqlite:///broker.db", BrokerKind.OTHER),
        ("memory://", BrokerKind.OTHER),
    ],
)
def test_broker_kind_from_url(url: str, kind: BrokerKind) -> None:
    assert broker_kind(url) is kind


def test_redis_serves_lower_numbers_first_so_the_scale_is_reversed() -> None:
    assert [broker_priority(p, BrokerKind.REDIS) for p in range(10)] == list(range(9, -1, -1))
    assert broker_priority(0, BrokerKind.REDIS) == 9  # the default job is served last


def test_amqp_serves_higher_numbers_first_so_the_scale_is_kept() -> None:
    assert [broker_priority(p, BrokerKind.AMQP) for p in range(10)] == list(range(10))


def test_brokers_without_priorities_get_none_and_out_of_range_is_clamped() -> None:
    assert broker_priority(7, BrokerKind.OTHER) is None
    assert broker_priority(42, BrokerKind.REDIS) == 0
    assert broker_priority(-3, BrokerKind.AMQP) == 0


@pytest.mark.parametrize(("spec", "expected"), [({}, 0), ({"priority": 7}, 7)])
def test_job_priority_of_a_stored_spec(spec: dict[str, Any], expected: int) -> None:
    assert load_spec(spec).priority == expected  # a row stored before priorities: the default


@pytest.mark.parametrize("priority", [12, True, -1])
def test_a_stored_priority_off_the_scale_is_refused(priority: object) -> None:
    with pytest.raises(ValidationError):
        load_spec({"priority": priority})


def test_celery_on_redis_polls_ten_priority_lists_and_keeps_the_restore_options() -> None:
    app = create_celery(Settings(broker_url="redis://127.0.0.1:6379/0", visibility_timeout_s=7200))
    options = app.conf.broker_transport_options
    assert options["priority_steps"] == REDIS_PRIORITY_STEPS == list(range(10))
    assert options["visibility_timeout"] == 7200
    assert options["unacked_restore_throttle"] == 1
    assert "sep" not in options and "queue_order_strategy" not in options  # kombu's defaults
    assert app.conf.worker_prefetch_multiplier == 1 and app.conf.task_acks_late
    assert app.polar_broker_kind is BrokerKind.REDIS


def test_celery_on_amqp_declares_priority_queues() -> None:
    app = create_celery(Settings(broker_url="amqp://127.0.0.1:5672//"))
    assert app.conf.task_queue_max_priority == 9
    assert "priority_steps" not in app.conf.broker_transport_options


def test_celery_on_the_embedded_broker_ignores_priorities() -> None:
    app = create_celery(Settings(broker_url="sqla+sqlite:///unused.db"))
    assert app.polar_broker_kind is BrokerKind.OTHER
    assert app.conf.broker_transport_options == {}
    assert app.conf.task_queue_max_priority is None


# --- every hop keeps the job's priority -----------------------------------------------------


def _submit(factory: sessionmaker[Session], priority: int, samples: int = 1) -> list[uuid.UUID]:
    spec = {"tasks": [{"instruction": "x"}], "samples_per_task": samples, "priority": priority}
    with unit_of_work(factory) as session:
        return create_job(session, JobCreate.model_validate(spec), "p").rollout_ids


def _claim(
    factory: sessionmaker[Session], rid: uuid.UUID, stage: Stage, lease_s: float = 60
) -> Claimed:
    with unit_of_work(factory) as session:
        claimed = claim(session, stage, rid, "w1", lease_s)
    assert isinstance(claimed, Claimed), claimed
    return claimed


def _ctx(factory: sessionmaker[Session]) -> WorkerContext:
    """Just what the message-building paths of the runner read from a worker context."""
    settings = Settings(pool="p", retry_backoff_s=0.5)
    return cast(WorkerContext, SimpleNamespace(settings=settings, session_factory=factory))


def test_submit_publishes_prepare_with_the_job_priority(
    db_session_factory: sessionmaker[Session], published: list[StageMessage]
) -> None:
    _submit(db_session_factory, 7, samples=3)
    _submit(db_session_factory, 0)
    assert [(m.stage, m.priority) for m in published] == [(Stage.PREPARE, 7)] * 3 + [
        (Stage.PREPARE, 0)
    ]


def test_next_stage_and_in_place_retry_keep_the_priority(
    db_session_factory: sessionmaker[Session], published: list[StageMessage]
) -> None:
    (rid,) = _submit(db_session_factory, 6)
    claimed = _claim(db_session_factory, rid, Stage.PREPARE)
    prepared = Prepared(node="n1", runtime_id="rt", runtime={})
    nxt = _next_message(_ctx(db_session_factory), claimed, prepared)
    assert nxt is not None and (nxt.stage, nxt.node, nxt.priority) == (Stage.RUN_AGENT, "n1", 6)

    published.clear()
    assert _unexpected(_ctx(db_session_factory), claimed, 0, "boom") == RunResult.retry(1)
    (retry,) = published
    assert (retry.stage, retry.retries, retry.priority) == (Stage.PREPARE, 1, 6)


def test_restart_from_prepare_keeps_the_priority(
    db_session_factory: sessionmaker[Session], published: list[StageMessage]
) -> None:
    (rid,) = _submit(db_session_factory, 8)
    claimed = _claim(db_session_factory, rid, Stage.PREPARE)
    published.clear()
    with unit_of_work(db_session_factory) as session:
        assert restart_claimed(session, claimed, "p", "runtime_error", "boom") == "requeued"
    (message,) = published
    assert (message.stage, message.attempt, message.priority) == (Stage.PREPARE, 2, 8)


def test_sweeper_restarts_and_republishes_with_the_priority(
    db_session_factory: sessionmaker[Session], published: list[StageMessage]
) -> None:
    lost, waiting = _submit(db_session_factory, 5, samples=2)
    _claim(db_session_factory, lost, Stage.PREPARE, lease_s=0.001)  # its worker "dies"
    published.clear()
    sweeper = Sweeper(Settings(pool="p"), db_session_factory, lambda _queue: 0)
    report = sweeper.sweep_once(now=utcnow() + timedelta(hours=1))
    # The sweep's clock is an hour ahead, so the restarted rollout looks unpublished too.
    assert report.requeued == 1 and report.republished >= 1
    assert {(m.rollout_id, m.attempt, m.priority) for m in published} >= {
        (lost, 2, 5),
        (waiting, 1, 5),
    }
    assert {m.priority for m in published} == {5}
