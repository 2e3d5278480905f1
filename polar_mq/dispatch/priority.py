"""Job priorities on the broker: the scale of `lifecycle.priority`, mapped to what each transport
understands.

The transports disagree on the direction, hence the mapping kept in this one place:

- **Redis** (kombu's transport): one list per `priority_steps` value, popped in step order, so a
  *lower* number is served first; with ten steps every job priority gets its own list.
  Priority 9 maps to step 0 (the queue's plain list), priority 0 to step 9.
- **RabbitMQ** (AMQP): priority queues (`x-max-priority`) serve a *higher* number first; the
  priority is sent as is and the queues are declared with `x-max-priority` 9.
- **Anything else** (the embedded SQLAlchemy transport of the demo, kombu's memory transport):
  a plain FIFO without priorities; no priority is sent and a job's priority has no effect there.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from polar_mq.lifecycle.priority import MAX_PRIORITY, MIN_PRIORITY

REDIS_PRIORITY_STEPS = list(range(MIN_PRIORITY, MAX_PRIORITY + 1))
"""One Redis list per priority; every process (publishers and workers) must use the same steps,
or a worker never polls the lists it does not know about."""

_REDIS_SCHEMES = frozenset({"redis", "rediss", "redis+socket", "sentinel"})
_AMQP_SCHEMES = frozenset({"amqp", "amqps", "pyamqp", "librabbitmq"})


class BrokerKind(StrEnum):
    REDIS = "redis"
    AMQP = "amqp"
    OTHER = "other"
    """No message priorities: the embedded SQLAlchemy transport, memory, filesystem."""


def broker_kind(broker_url: str) -> BrokerKind:
    """The family of a Celery broker URL (the first one of a `;`-separated failover list)."""
    first = broker_url.split(";", 1)[0].strip()
    scheme = first.split("://", 1)[0].lower() if "://" in first else ""
    if scheme in _REDIS_SCHEMES:
        return BrokerKind.REDIS
    if scheme in _AMQP_SCHEMES:
        return BrokerKind.AMQP
    return BrokerKind.OTHER


def broker_priority(priority: int, kind: BrokerKind) -> int | None:
    """The message priority to publish for a job priority, or None when the broker has none."""
    bounded = min(MAX_PRIORITY, max(MIN_PRIORITY, priority))
    if kind is BrokerKind.REDIS:
        return MAX_PRIORITY - bounded
    if kind is BrokerKind.AMQP:
        return bounded
    return None


def redis_priority_options() -> dict[str, Any]:
    """Redis transport options for ten priority lists per queue.

    The separator between a queue name and its step and the queue order strategy keep kombu's
    defaults: each stage worker consumes a single queue, so ordering between queues never matters,
    and the default separator keeps the names of the lists already in Redis.
    """
    return {"priority_steps": list(REDIS_PRIORITY_STEPS)}
