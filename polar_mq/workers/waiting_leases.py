"""Leases for rollouts waiting in a node's own queue, so that a dead node does not strand them.

A rollout prepared on node X waits (`prepared`) for X's run-agent queue, and one built waits
(`built`) for X's evaluate queue: its runtime lives on X, no other node can take it. Those states
hold no lease (nobody is working on them), so when X's host dies they used to wait for X to come
back, forever if it never does (found on the namespace test bed, tests/multihost).

The Celery worker that consumes a node-local queue therefore keeps a lease on the rollouts
waiting for it: every `lease_s / 3` one UPDATE stamps `lease_expires_at = now + lease_s` on the
node's rollouts in that ready state with no owner. While the consumer lives, the stamp stays
fresh; when the node dies, it expires, and the sweeper (`Sweeper._stranded`) starts those
rollouts over from prepare with attempt+1, on any node. The stage that leaves a rollout waiting
gives it its first lease (`runner._with_waiting_lease`), so a node that dies before its
keeper's first renewal strands nothing either (the host-kill test met that gap). Only rows
from before that change carry no lease (NULL) and are never swept this way.

Races are settled by the rows' compare-and-set: a claim moves the rollout out of the ready
state (the sweeper's restart then matches nothing), a restart moves it to `queued` with
attempt+1 (the stale message, if the node returns, is skipped by the claim's attempt check).
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.lifecycle.messages import queue_name
from polar_mq.lifecycle.stages import STAGE_STATES, Stage
from polar_mq.models import Rollout
from polar_mq.models.base import utcnow

log = logging.getLogger(__name__)

NODE_LOCAL = tuple(stage for stage in Stage if stage.node_local)


def waiting_states(settings: Settings, queues: set[str]) -> list[str]:
    """The ready states this worker's queues serve for its node (e.g. `prepared` for the
    node's run-agent queue)."""
    node, prefix = settings.node_name, settings.queue_prefix
    return [
        STAGE_STATES[stage][0]
        for stage in NODE_LOCAL
        if queue_name(prefix, stage, settings.pool, node) in queues
    ]


def stamp_waiting(session: Session, node: str, states: list[str], lease_s: float) -> int:
    """Extend the lease of `node`'s ownerless rollouts in `states`; how many rows."""
    result = session.execute(
        update(Rollout)
        .where(Rollout.node == node, Rollout.status.in_(states), Rollout.lease_owner.is_(None))
        .values(lease_expires_at=utcnow() + timedelta(seconds=lease_s))
        .execution_options(synchronize_session=False)
    )
    return int(getattr(result, "rowcount", 0) or 0)


class WaitingLeaseKeeper:
    """One daemon thread per consuming worker process, stamping every `lease_s / 3`."""

    def __init__(
        self, factory: sessionmaker[Session], node: str, states: list[str], lease_s: float
    ) -> None:
        self.factory, self.node, self.states, self.lease_s = factory, node, states, lease_s
        self.stop = threading.Event()

    def stamp_once(self) -> int:
        with self.factory() as session, session.begin():
            return stamp_waiting(session, self.node, self.states, self.lease_s)

    def run(self) -> None:
        while not self.stop.wait(max(0.2, self.lease_s / 3)):
            try:
                self.stamp_once()
            except Exception:  # a database blip: the stamp has 2/3 of its length left
                log.warning("stamping the leases of waiting rollouts failed", exc_info=True)

    def start(self) -> WaitingLeaseKeeper:
        threading.Thread(target=self.run, name="polar-waiting-leases", daemon=True).start()
        return self


def install_waiting_leases() -> None:
    """Start the keeper when a Celery worker of this node is ready, if it consumes a node-local
    queue (Celery's `worker_ready` signal; its sender is the consumer, which knows its queues and
    its app, which carries the Settings). Installed by `workers.tasks`, which every stage worker
    imports, so the publisher's app (`dispatch.celery_app`) needs nothing of the workers."""
    from celery import signals

    def ready(sender: Any = None, **_: Any) -> None:
        try:
            queues = {q.name for q in sender.task_consumer.queues}
            settings: Settings = sender.app.polar_settings
        except AttributeError:
            return
        states = waiting_states(settings, queues)
        if not states:
            return
        from polar_mq.infra.db import create_db_engine, make_session_factory

        small = {} if settings.database_url.startswith("sqlite") else {"pool_size": 1}
        engine = create_db_engine(settings.database_url, **small)
        factory = make_session_factory(engine)
        WaitingLeaseKeeper(factory, settings.node_name, states, settings.lease_s).start()

    signals.worker_ready.connect(ready, weak=False, dispatch_uid="polar_mq.waiting_leases")
