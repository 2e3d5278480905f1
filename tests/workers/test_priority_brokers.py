"""Job priorities on real brokers: what `publish_messages` sends comes back highest priority first.

The mapping is only right if the broker agrees with it, so this publishes stage messages of mixed
priorities through the production path and takes them back the way a worker does (kombu's
`basic_get` on the app's own connection, with the app's transport options).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis

from polar_mq.config import Settings
from polar_mq.lifecycle.messages import StageMessage, queue_name
from polar_mq.lifecycle.stages import Stage
from polar_mq.workers.celery_app import PolarCelery, create_celery, publish_messages

REDIS_URL = os.environ.get("POLAR_MQ_TEST_REDIS", "redis://127.0.0.1:6379")
AMQP_URL = os.environ.get("POLAR_MQ_TEST_AMQP", "amqp://127.0.0.1:5672//")
PRIORITIES = [0, 5, 9, 0, 3, 9, 5, 0]


def _publish_and_drain(app: PolarCelery, pool: str) -> list[tuple[int, str]]:
    """Publish one prepare message per entry of PRIORITIES, then pop them all in broker order."""
    ids = [uuid.uuid4() for _ in PRIORITIES]
    messages = [
        StageMessage(Stage.PREPARE, rid, pool, attempt=1, priority=p)
        for rid, p in zip(ids, PRIORITIES, strict=True)
    ]
    publish_messages(app, messages)
    priority_of = {str(m.rollout_id): m.priority for m in messages}
    queue = queue_name(app.polar_settings.queue_prefix, Stage.PREPARE, pool, None)
    order: list[tuple[int, str]] = []
    with app.connection_for_read() as conn:
        channel = conn.default_channel
        for _ in PRIORITIES:
            raw = channel.basic_get(queue=queue, no_ack=True)
            assert raw is not None, f"only {len(order)} of {len(PRIORITIES)} came back"
            # py-amqp hands back its own message type; kombu's virtual transports a kombu one.
            message = raw if hasattr(raw, "decode") else channel.message_to_python(raw)
            args, _kwargs, _embed = message.decode()
            order.append((priority_of[args[0]], args[0]))
        assert channel.basic_get(queue=queue, no_ack=True) is None
    expected = sorted(
        ((m.priority, str(m.rollout_id)) for m in messages),
        key=lambda item: -item[0],  # stable: publish order within one priority
    )
    assert order == expected
    return order


@pytest.fixture()
def redis_app() -> Iterator[PolarCelery]:
    prefix = f"prio-{uuid.uuid4().hex[:8]}"
    yield create_celery(Settings(broker_url=f"{REDIS_URL}/0", queue_prefix=prefix))
    conn = redis.Redis.from_url(f"{REDIS_URL}/0")
    for key in conn.scan_iter(f"{prefix}.*"):
        conn.delete(key)
    conn.close()


def test_redis_hands_out_higher_job_priorities_first(redis_app: PolarCelery) -> None:
    _publish_and_drain(redis_app, "cpu")


@pytest.fixture()
def amqp_app() -> Iterator[PolarCelery]:
    prefix = f"prio-{uuid.uuid4().hex[:8]}"
    app = create_celery(Settings(broker_url=AMQP_URL, queue_prefix=prefix))
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:  # no RabbitMQ on this machine: nothing to check against
        pytest.skip(f"RabbitMQ not reachable at {AMQP_URL}: {exc}")
    yield app
    with app.connection_for_write() as conn:
        queue = queue_name(prefix, Stage.PREPARE, "cpu", None)
        conn.default_channel.queue_delete(queue=queue)


def test_rabbitmq_hands_out_higher_job_priorities_first(amqp_app: PolarCelery) -> None:
    _publish_and_drain(amqp_app, "cpu")
