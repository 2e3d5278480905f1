"""Stage messages published straight through kombu are the messages Celery's `send_task` sends:
the same task protocol headers (a worker's task events, which Flower shows, read `argsrepr`), body
and properties, on the same queue."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest

from polar_mq.config import Settings
from polar_mq.dispatch.celery_app import PolarCelery, create_celery, publish_messages
from polar_mq.dispatch.direct_publish import declared
from polar_mq.dispatch.priority import BrokerKind, broker_priority
from polar_mq.lifecycle.messages import StageMessage, queue_name
from polar_mq.lifecycle.stages import Stage
from polar_mq.observability.stage_metrics import DUE_HEADER

REDIS_URL = os.environ.get("POLAR_MQ_TEST_REDIS", "redis://127.0.0.1:6379")
PER_MESSAGE = {"id", "root_id", "correlation_id", "origin", DUE_HEADER}
"""What differs between any two messages (ids, the publisher's name, when it is due)."""


def _take(app: PolarCelery, queue: str) -> Any:
    with app.connection_for_read() as conn:
        channel = conn.default_channel
        raw = channel.basic_get(queue=queue, no_ack=True)
        assert raw is not None
        return channel.message_to_python(raw)


def _shape(message: Any) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    headers = {k: v for k, v in message.headers.items() if k not in PER_MESSAGE}
    properties = {
        k: v for k, v in message.properties.items() if k not in PER_MESSAGE | {"delivery_tag"}
    }
    return headers, message.decode(), properties


@pytest.mark.parametrize("broker", ["memory://", f"{REDIS_URL}/0"])
def test_a_direct_publish_is_the_message_send_task_sends(broker: str) -> None:
    app = create_celery(Settings(broker_url=broker, queue_prefix=f"pub{uuid.uuid4().hex[:6]}"))
    kind = app.polar_broker_kind
    priority = broker_priority(7, kind)
    try:
        rid = uuid.uuid4()
        msg = StageMessage(Stage.BUILD, rid, "p", "n1", attempt=2, retries=1, priority=7)
        queue = queue_name(app.polar_settings.queue_prefix, Stage.BUILD, "p", "n1")
        with app.producer_or_acquire() as producer:
            assert not declared(app, producer, app.amqp.queues[queue])
        publish_messages(app, [msg])
        with app.producer_or_acquire() as producer:  # declared once per connection on Redis
            assert declared(app, producer, app.amqp.queues[queue]) is (kind is BrokerKind.REDIS)
        direct = _take(app, queue)
        app.send_task(
            Stage.BUILD.task_name,
            args=[str(rid)],
            kwargs={"attempt": 2, "retries": 1},
            queue=queue,
            headers={DUE_HEADER: 0.0},
            **({} if priority is None else {"priority": priority}),
        )
        celery = _take(app, queue)  # the same message, priority included
        assert _shape(direct) == _shape(celery)
        assert direct.headers["argsrepr"] == repr([str(rid)])
        assert direct.headers["id"] == direct.properties["correlation_id"]
        assert direct.headers[DUE_HEADER] > 0
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
        app.close()


def test_a_message_with_a_countdown_still_gets_its_eta() -> None:
    app = create_celery(Settings(broker_url="memory://", queue_prefix=f"pub{uuid.uuid4().hex[:6]}"))
    try:
        msg = StageMessage(Stage.BUILD, uuid.uuid4(), "p", "n1", attempt=1, countdown=30.0)
        publish_messages(app, [msg])
        taken = _take(app, queue_name(app.polar_settings.queue_prefix, Stage.BUILD, "p", "n1"))
        assert taken.headers["eta"] is not None
    finally:
        app.close()
