"""Per-process resources of a worker: settings, database sessions, an HTTP client for the proxy
and a Redis client for its call receipts.

Built lazily in the process that runs tasks (after a prefork fork), never at import time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from typing import cast

import httpx
import redis
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.capability import receipts as call_receipts
from polar_mq.config import Settings
from polar_mq.infra.db import create_db_engine, make_session_factory
from polar_mq.infra.tls import client_ssl_context
from polar_mq.lifecycle.outbox import Publisher, attach_publisher
from polar_mq.runtimes.warm_pool import WarmPool
from polar_mq.workers.leases import LeaseKeeper
from polar_mq.workers.spec_cache import SpecCache

POOL_WAIT_S = 600.0
"""How long a stage thread waits for a connection of its process's pool (4 + 8 overflow, whatever
the concurrency: a node's PostgreSQL connections do not grow with its sessions). A live session
holds none while its agent runs, but a thousand of them start and end in bursts, and on a busy
machine the queue for the pool moves slowly: SQLAlchemy's 30 s default failed, and restarted,
sessions that only had to wait (docs/multihost.md, "Live sessions"). Their leases stay renewed
meanwhile: the keeper has a connection of its own."""


@dataclass
class WorkerContext:
    settings: Settings
    publisher: Publisher

    @cached_property
    def _engine(self) -> Engine:
        """This process's one pool. On PostgreSQL its connections are in autocommit: most of a
        stage's statements are one-statement writes and reads (`autocommit_factory`), which then
        check a connection out as it is; `session_factory`'s transactions switch theirs to READ
        COMMITTED for the checkout (SQLAlchemy sets the level on each checkout and resets it on
        checkin, a visible share of the stages' in-process profile when the claims and finishes
        paid it, docs/benchmarks.md: the rarer transactions pay it now)."""
        url = self.settings.database_url
        if url.startswith("sqlite"):
            return create_db_engine(url)
        # No pre-ping: a stage is two short transactions, and the runner retries one whose
        # connection dropped; a SELECT 1 before each would add a round trip to every one.
        return create_db_engine(
            url, pool_size=4, max_overflow=8, pool_pre_ping=False, isolation_level="AUTOCOMMIT",
            pool_timeout=POOL_WAIT_S,
        )  # fmt: skip

    @cached_property
    def _lease_engine(self) -> Engine:
        """The lease keeper's own connection, out of the stages' pool: a burst of hundreds of
        sessions starting or ending at once queues for that pool, and renewals queued behind
        them would let the leases of every live session expire."""
        url = self.settings.database_url
        if url.startswith("sqlite"):
            return self._engine
        return create_db_engine(url, pool_size=1, max_overflow=0, pool_pre_ping=False)

    @cached_property
    def session_factory(self) -> sessionmaker[Session]:
        engine = self._engine
        if engine.dialect.name == "postgresql":
            engine = engine.execution_options(isolation_level="READ COMMITTED")
        factory = make_session_factory(engine)
        attach_publisher(factory, self.publisher)
        return factory

    @cached_property
    def autocommit_factory(self) -> sessionmaker[Session]:
        """Sessions for writes that are one statement (a claim, a row-less finish, an event):
        on PostgreSQL in autocommit mode, which saves the BEGIN and COMMIT round trips; the
        same pool as `session_factory`, the same publish after commit."""
        if self._engine.dialect.name != "postgresql":
            return self.session_factory
        factory = make_session_factory(self._engine)
        attach_publisher(factory, self.publisher)
        return factory

    @cached_property
    def autocommit_engine(self) -> Engine:
        """The engine of `autocommit_factory`, for a one-statement write that publishes nothing
        (a claim): a bare connection spares the session's bookkeeping."""
        return cast(Engine, self.autocommit_factory.kw["bind"])

    @cached_property
    def leases(self) -> LeaseKeeper:
        return LeaseKeeper(make_session_factory(self._lease_engine), self.settings.lease_s)

    @cached_property
    def spec_cache(self) -> SpecCache:
        return SpecCache()

    @cached_property
    def warm_pool(self) -> WarmPool:
        s = self.settings
        return WarmPool(s.runtime_root, s.warm_pool_max_per_node)

    @cached_property
    def receipts(self) -> redis.Redis | None:
        """Redis of the proxy's call receipts (`call_receipts`); None: they are off."""
        url = self.settings.call_receipts_redis_url
        return call_receipts.connect(url) if url else None

    @cached_property
    def http(self) -> httpx.Client:
        return httpx.Client(timeout=httpx.Timeout(30.0, connect=5.0), verify=client_ssl_context())

    def lease_owner(self, task_id: str | None) -> str:
        return f"{self.settings.node_name}/{os.getpid()}/{task_id or '-'}"
