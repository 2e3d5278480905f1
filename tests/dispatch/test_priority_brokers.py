"""Job priorities on real brokers: what `publish_messages` sends comes back highest priority first.

The mapping is only right if the broker agrees with it, so this publishes stage messages of mixed
priorities through the production path and takes them back the way a worker does (kombu's
`basic_get` on the app's own connection, with the app's transport options).
"""

from __future__ import annotations

import uuid

from polar_mq.dispatch.celery_app import PolarCelery, publish_messages
from polar_mq.lifecycle.messages import StageMessage, queue_name
from polar_mq.lifecycle.stages import Stage

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


def test_redis_hands_out_higher_job_priorities_first(redis_app: PolarCelery) -> None:
    _publish_and_drain(redis_app, "cpu")


def test_rabbitmq_hands_out_higher_job_priorities_first(amqp_app: PolarCelery) -> None:
    _publish_and_drain(amqp_app, "cpu")
