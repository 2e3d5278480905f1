"""Draining: how a node leaves a worker pool while jobs run, losing no work.

A node owns the rollouts it prepared (`rollouts.node`): their runtimes live on it, so their run
agent and evaluate stages come through its own queues. Leaving the pool is therefore two steps,
both driven by `polar-mq worker` on SIGTERM (see `launcher.Supervisor`):

1. stop taking new rollouts: the prepare workers get SIGTERM at once (Celery's warm shutdown: no
   more messages from the pool-wide prepare queue; the prepares in flight finish);
2. keep the node-local run agent and evaluate workers (and build) consuming until PostgreSQL says
   no unfinished rollout is left on this node, then stop them.

The database, not the broker, decides when the node is empty. A drain that outlasts its timeout
stops what is left; those rollouts' leases expire and the sweeper re-runs them on another node.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import func, select

from polar_mq.config import Settings
from polar_mq.infra.db import create_db_engine, make_session_factory
from polar_mq.models import Rollout, RolloutStatus


def unfinished_on_node(settings: Settings) -> Callable[[], int]:
    """A counter of the rollouts that are on this node and not yet in a terminal state."""
    factory = make_session_factory(create_db_engine(settings.database_url))
    node = settings.node_name
    query = select(func.count()).where(
        Rollout.node == node, Rollout.status.not_in(RolloutStatus.TERMINAL)
    )

    def count() -> int:
        with factory() as session:
            return int(session.scalar(query) or 0)

    return count
