"""The direct publish (`workers.direct_publish`) against the plain path: for the same call (task
id, args, kwargs, queue, priority, headers) the message it leaves in the broker is the one
Celery's `send_task` leaves there, to the byte where the broker keeps it.

On Redis the test reads the stored JSON payload of each list kombu pushed to (one per priority
step); on RabbitMQ it takes the message back with `basic_get`. Only what is per delivery may
differ: the delivery tag (on Redis a fresh uuid kombu draws per publish) and, on RabbitMQ, the
count of messages still queued behind the one taken.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import redis

from polar_mq.dispatch.celery_app import PolarCelery
from polar_mq.dispatch.direct_publish import publish_now
from polar_mq.dispatch.priority import broker_priority
from polar_mq.lifecycle.messages import queue_name
from polar_mq.lifecycle.stages import Stage
from polar_mq.observability.stage_metrics import DUE_HEADER
from tests.dispatch.conftest import REDIS_URL

CALLS = [
    ({"attempt": 2, "retries": 1}, 7),
    ({"attempt": 1}, 0),
    ({}, 9),
]
"""Keyword arguments and job priority of the calls compared (priority steps at both ends)."""


def _send_both(app: PolarCelery, queue: str, kwargs: dict[str, Any], job_priority: int) -> str:
    """One message through `publish_now`, then the same through `send_task`; their task id."""
    task_id = str(uuid.uuid4())
    args = [str(uuid.uuid4())]
    headers = {DUE_HEADER: 1234.5}
    priority = broker_priority(job_priority, app.polar_broker_kind)
    with app.producer_or_acquire() as producer:
        publish_now(
            app, producer, task_name=Stage.BUILD.task_name, task_id=task_id, args=args,
            kwargs=kwargs, queue=queue, headers=headers, priority=priority,
        )  # fmt: skip
        app.send_task(
            Stage.BUILD.task_name,
            args=args,
            kwargs=kwargs,
            task_id=task_id,
            queue=queue,
            producer=producer,
            headers=headers,
            **({} if priority is None else {"priority": priority}),
        )
    return task_id


@pytest.mark.parametrize(("kwargs", "job_priority"), CALLS)
def test_on_redis_the_stored_message_is_send_tasks(
    redis_app: PolarCelery, kwargs: dict[str, Any], job_priority: int
) -> None:
    queue = queue_name(redis_app.polar_settings.queue_prefix, Stage.BUILD, "p", "n1")
    task_id = _send_both(redis_app, queue, kwargs, job_priority)
    client = redis.Redis.from_url(f"{REDIS_URL}/0")
    try:
        lists = [k for k in client.scan_iter(f"{queue}*") if client.type(k) == b"list"]
        assert len(lists) == 1, f"the two messages went to different lists: {lists}"
        stored = [json.loads(raw) for raw in client.lrange(lists[0], 0, -1)]
    finally:
        client.close()
    assert len(stored) == 2
    for payload in stored:
        assert payload["headers"]["id"] == task_id  # the call compared is the same call
        payload["properties"].pop("delivery_tag")
    celery, direct = stored  # LPUSH: the newest first
    assert direct == celery


def _as_stored(message: Any) -> dict[str, Any]:
    """What RabbitMQ hands back of a message: body, properties (headers among them) and the
    delivery info that is not per delivery."""
    per_delivery = {"delivery_tag", "message_count"}  # the get's place in the queue
    info = {k: v for k, v in message.delivery_info.items() if k not in per_delivery}
    return {"body": message.body, "properties": message.properties, "delivery": info}


@pytest.mark.parametrize(("kwargs", "job_priority"), CALLS)
def test_on_rabbitmq_the_delivered_message_is_send_tasks(
    amqp_app: PolarCelery, kwargs: dict[str, Any], job_priority: int
) -> None:
    queue = queue_name(amqp_app.polar_settings.queue_prefix, Stage.BUILD, "p", "n1")
    task_id = _send_both(amqp_app, queue, kwargs, job_priority)
    with amqp_app.connection_for_read() as conn:
        channel = conn.default_channel
        direct = channel.basic_get(queue=queue, no_ack=True)
        celery = channel.basic_get(queue=queue, no_ack=True)
    assert direct is not None and celery is not None
    assert direct.headers["id"] == task_id
    assert _as_stored(direct) == _as_stored(celery)
