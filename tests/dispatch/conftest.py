"""Real brokers for the publish tests: a Celery app per test on a queue prefix of its own, whose
queues are gone after it. RabbitMQ is skipped where none runs; Redis is always there."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis

from polar_mq.config import Settings
from polar_mq.dispatch.celery_app import PolarCelery, create_celery

REDIS_URL = os.environ.get("POLAR_MQ_TEST_REDIS", "redis://127.0.0.1:6379")
AMQP_URL = os.environ.get("POLAR_MQ_TEST_AMQP", "amqp://127.0.0.1:5672//")


def _prefix() -> str:
    return f"broker-{uuid.uuid4().hex[:8]}"


@pytest.fixture()
def redis_app() -> Iterator[PolarCelery]:
    prefix = _prefix()
    app = create_celery(Settings(broker_url=f"{REDIS_URL}/0", queue_prefix=prefix))
    yield app
    app.close()
    client = redis.Redis.from_url(f"{REDIS_URL}/0")
    for key in client.scan_iter(f"{prefix}.*"):
        client.delete(key)
    client.close()


@pytest.fixture()
def amqp_app() -> Iterator[PolarCelery]:
    prefix = _prefix()
    app = create_celery(Settings(broker_url=AMQP_URL, queue_prefix=prefix))
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:  # no RabbitMQ on this machine: nothing to check against
        pytest.skip(f"RabbitMQ not reachable at {AMQP_URL}: {exc}")
    yield app
    with app.connection_for_write() as conn:
        for name in [q for q in app.amqp.queues if q.startswith(prefix)]:
            conn.default_channel.queue_delete(queue=name)
    app.close()
