"""The proxy's asyncio Redis clients (shared call order, call receipts): one pool shape for both.

redis-py's pool refuses a connection past `max_connections` at once (`MaxConnectionsError`, and
its default cap is 100), so a proxy process with more calls in flight than that answered the
excess with a 503: 1,609 of them in 8 s at 256 clients on `--workers 2`. A blocking pool makes a
call wait for a free connection instead, up to the same timeout as a slow Redis; each call holds
one for a single pipelined round trip (well under a millisecond), so a few dozen serve thousands
of calls a second.
"""

from __future__ import annotations

import redis.asyncio as redis

from polar_mq.capability.receipts import REDIS_TIMEOUT_S

POOL_CONNECTIONS = 64
"""Connections per client and process."""


def async_redis(url: str) -> redis.Redis:
    """A client whose calls queue for a pooled connection rather than fail when all are busy;
    connecting, reading and waiting for a connection each give up after `REDIS_TIMEOUT_S` (the
    call is then refused with a 503)."""
    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=POOL_CONNECTIONS,
        timeout=REDIS_TIMEOUT_S,
        socket_timeout=REDIS_TIMEOUT_S,
        socket_connect_timeout=REDIS_TIMEOUT_S,
    )
    return redis.Redis.from_pool(pool)
