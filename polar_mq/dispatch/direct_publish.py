"""The one bypass of Celery on the publish path: a stage message due now, sent straight through
kombu as the task protocol 2 message Celery's `send_task` would send.

Why it exists: `send_task` spends more CPU on options, routing and signals than on the publish
itself, and none of that applies to a stage message (a named queue, due now, no result, no links,
no ETA); it runs on every stage of every rollout (docs/benchmarks.md has the measurement).

What it must stay: byte for byte the message `send_task` sends for the same call, headers (a
worker's task events, which Flower shows, read `argsrepr`), body, properties and delivery info,
on Celery's own queue object (`app.amqp.queues`, declared with the arguments the broker needs,
e.g. `x-max-priority`), through the default exchange as Celery publishes to a direct queue, with
Celery's publish retry policy. tests/dispatch/test_direct_publish.py compares the two as the broker
stores them; a Celery upgrade that changes its message fails there, not in production.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from kombu.entity import Queue
from kombu.messaging import Producer

from polar_mq.dispatch.priority import BrokerKind


class PublishingApp(Protocol):
    """What the publish reads of the Celery app (`celery_app.PolarCelery`, which imports this
    module: a protocol keeps the import one way)."""

    @property
    def amqp(self) -> Any: ...
    @property
    def thread_oid(self) -> Any: ...
    @property
    def polar_publish_conf(self) -> tuple[bool, dict[str, Any], Any]: ...
    @property
    def polar_broker_kind(self) -> BrokerKind: ...


def publish_now(
    app: PublishingApp,
    producer: Producer,
    *,
    task_name: str,
    task_id: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    queue: str,
    headers: Mapping[str, Any],
    priority: int | None,
) -> None:
    """Publish what `app.send_task(task_name, args, kwargs, task_id=, queue=, headers=,
    priority=, producer=)` publishes, without its option processing."""
    args = list(args)
    kwargs = dict(kwargs)
    target = app.amqp.queues[queue]
    message_headers = {
        "lang": "py",
        "task": task_name,
        "id": task_id,
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": repr(args),
        "kwargsrepr": repr(kwargs),
        "origin": _origin(os.getpid()),
        "ignore_result": None,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
        **headers,
    }
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    retry, retry_policy, delivery_mode = app.polar_publish_conf
    producer.publish(
        (args, kwargs, embed),
        exchange="",
        routing_key=target.name,
        serializer="json",
        headers=message_headers,
        declare=[] if declared(app, producer, target) else [target],
        delivery_mode=target.exchange.delivery_mode or delivery_mode,
        retry=retry,
        retry_policy=retry_policy,
        correlation_id=task_id,
        reply_to=app.thread_oid,  # as send_task: where a result backend would reply
        **({} if priority is None else {"priority": priority}),
    )


def declared(app: PublishingApp, producer: Producer, queue: Queue) -> bool:
    """Whether `queue` needs no declaring with this message: on Redis, once kombu declared it
    on the current connection (its own cache, emptied on every reconnect). `publish(declare=)`
    asks the same, but binds a copy of the queue to the channel first, on every message. Other
    brokers keep kombu's check inside the publish, which a reconnect retried there repeats (a
    queue an AMQP broker lost must be declared again on the new connection)."""
    if app.polar_broker_kind is not BrokerKind.REDIS:
        return False
    connection = getattr(producer.channel, "connection", None)
    client = getattr(connection, "client", None)
    known = getattr(client, "declared_entities", None)
    return known is not None and queue.can_cache_declaration and hash(queue) in known


@functools.cache
def _origin(pid: int) -> str:
    """The `origin` header: this process, as Celery names a publisher that is not a worker."""
    return f"gen{pid}@{socket.gethostname()}"
