"""Several inference backends behind one proxy: routing, stickiness, health, weight updates.

`pool` decides where each call goes (sticky per rollout, least-loaded for new rollouts, waiting
out pauses); `send` forwards it, retrying on another backend only before the first byte; each
backend has a `breaker`; `health` checks them in the background; `admin` exposes it all.
"""

from polar_mq.proxy.backends.backend import UPSTREAM_LIMITS, UPSTREAM_TIMEOUT, Backend
from polar_mq.proxy.backends.health import HealthChecker
from polar_mq.proxy.backends.pool import BackendPool, BackendUnavailable
from polar_mq.proxy.backends.send import send_call

__all__ = [
    "UPSTREAM_LIMITS",
    "UPSTREAM_TIMEOUT",
    "Backend",
    "BackendPool",
    "BackendUnavailable",
    "HealthChecker",
    "send_call",
]
