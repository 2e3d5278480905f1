"""The Celery application: delivery guarantees configured once, from Settings.

Late acks with reject-on-worker-lost make delivery at-least-once (a message is only acked after its
stage ran, and a killed pool child requeues it); prefetch 1 keeps short stages from queueing behind
long ones, and keeps waiting messages in the broker, where job priorities order them (a message a
worker has already reserved could not be overtaken). Effects are made exactly-once by the
compare-and-set transitions of the stages.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

from celery import Celery
from kombu.exceptions import ChannelError

from polar_mq.config import Settings
from polar_mq.dispatch.direct_publish import publish_now
from polar_mq.dispatch.priority import (
    BrokerKind,
    broker_kind,
    broker_priority,
    redis_priority_options,
)
from polar_mq.lifecycle.messages import StageMessage, queue_name
from polar_mq.lifecycle.priority import MAX_PRIORITY
from polar_mq.observability.celery_hooks import install_celery_hooks
from polar_mq.observability.stage_metrics import DUE_HEADER

log = logging.getLogger(__name__)
EMBEDDED_PREFIX = "sqla+"


class PolarCelery(Celery):  # type: ignore[misc]  # celery ships no types
    """A Celery app that carries the polar_mq Settings it was built from."""

    polar_settings: Settings
    polar_broker_kind: BrokerKind
    """Decides how job priorities are published (see workers.priority)."""

    @functools.cached_property
    def polar_publish_conf(self) -> tuple[bool, dict[str, Any], Any]:
        """Celery's publish retry, retry policy and delivery mode, read once (a lookup in
        Celery's layered configuration costs more than the rest of a stage message)."""
        conf = self.conf
        return (
            bool(conf.task_publish_retry),
            dict(conf.task_publish_retry_policy or {}),
            conf.task_default_delivery_mode,
        )


def redis_restore_options(visibility_timeout_s: float) -> dict[str, Any]:
    """When kombu's Redis transport gives an unacked message back to its queue.

    kombu scans for messages unacked past the visibility timeout only on every 10th restore call
    by default (every ~100 s with the prefork event loop), and a process killed mid-scan holds the
    scan's mutex for 5 minutes. A message of a dead worker would then wait minutes beyond the
    visibility timeout; a scan per call (one ZRANGE) and a 30 s mutex bound that wait to ~10 s.
    """
    return {
        "visibility_timeout": visibility_timeout_s,
        "unacked_restore_throttle": 1,
        "unacked_restore_interval": 10,
        "unacked_mutex_expire": 30,
    }


def create_celery(settings: Settings) -> PolarCelery:
    broker_url = settings.broker_url
    transport_options: dict[str, Any] = redis_restore_options(settings.visibility_timeout_s)
    embedded = broker_url.startswith(EMBEDDED_PREFIX)
    kind = BrokerKind.OTHER if embedded else broker_kind(broker_url)
    if kind is BrokerKind.REDIS:
        transport_options.update(redis_priority_options())
    if embedded:
        # kombu hands SQLAlchemy transport options to create_engine: configure by class instead.
        broker_url = broker_url.removeprefix(EMBEDDED_PREFIX)
        transport_options = {}
    app = PolarCelery("polar_mq", broker=broker_url, backend=settings.result_backend)
    app.polar_settings = settings
    app.polar_broker_kind = kind
    if embedded:
        app.conf.broker_transport = "polar_mq.dispatch.embedded_broker:Transport"
    if kind is BrokerKind.AMQP:
        # RabbitMQ orders by priority only in queues declared with x-max-priority.
        app.conf.task_queue_max_priority = MAX_PRIORITY
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=settings.result_backend is None,
        task_serializer="json",
        accept_content=["json"],
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        # Task events cost a broker publish per transition; Flower switches them on while it runs.
        worker_send_task_events=False,
        task_send_sent_event=False,
        task_always_eager=settings.task_always_eager,
        worker_hijack_root_logger=False,
        task_default_queue=f"{settings.queue_prefix}.default",
    )
    app.conf.include = ["polar_mq.workers.tasks"]
    install_celery_hooks(settings)  # logging, stage metrics and log context (signals)
    return app


def publish_messages(app: PolarCelery, messages: Sequence[StageMessage]) -> None:
    """Send stage messages to their queues (called after commit), with their job's priority.

    A message due now goes straight through kombu (`direct_publish`, the message `send_task`
    would send); one with a countdown (a retry's backoff) through Celery's `send_task`, which
    turns it into an ETA."""
    prefix = app.polar_settings.queue_prefix
    kind = app.polar_broker_kind
    with app.producer_or_acquire() as producer:
        for msg in messages:
            kwargs: dict[str, Any] = {}
            if msg.attempt is not None:
                kwargs["attempt"] = msg.attempt
            if msg.retries:
                kwargs["retries"] = msg.retries
            options: dict[str, Any] = {}
            priority = broker_priority(msg.priority, kind)
            if priority is not None:
                options["priority"] = priority
            queue = queue_name(prefix, msg.stage, msg.pool, msg.node)
            headers = {DUE_HEADER: time.time() + (msg.countdown or 0.0)}  # queue-wait metric
            if not msg.countdown:
                publish_now(
                    app,
                    producer,
                    task_name=msg.stage.task_name,
                    task_id=str(uuid.uuid4()),
                    args=[str(msg.rollout_id)],
                    kwargs=kwargs,
                    queue=queue,
                    headers=headers,
                    priority=priority,
                )
                continue
            app.send_task(
                msg.stage.task_name,
                args=[str(msg.rollout_id)],
                kwargs=kwargs,
                queue=queue,
                producer=producer,
                countdown=msg.countdown,
                headers=headers,
                **options,
            )


def queue_depth(app: PolarCelery, queue: str) -> int | None:
    """Messages waiting in `queue` (0 if it does not exist); None if the broker is unreachable."""
    try:
        with app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1)
            channel = conn.default_channel
            try:
                return int(channel.queue_declare(queue=queue, passive=True).message_count)
            except ChannelError:
                return 0
    except Exception:
        log.warning("cannot read the depth of queue %s", queue, exc_info=True)
        return None
