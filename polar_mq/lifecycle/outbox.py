"""Enqueue after commit: stage messages are published only once the rows they name are committed.

A service calls `defer_publish(session, message)` inside its transaction; the messages are sent by
the publisher attached to the session factory right after COMMIT and dropped on ROLLBACK, so a
worker never receives a message for a rollout it cannot see, and a rolled-back job sends nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.lifecycle.messages import StageMessage

log = logging.getLogger(__name__)

Publisher = Callable[[Sequence[StageMessage]], None]
_KEY = "polar_mq.pending_publishes"


def defer_publish(session: Session, message: StageMessage) -> None:
    session.info.setdefault(_KEY, []).append(message)


def publish_committed(publish: Publisher, messages: Sequence[StageMessage]) -> None:
    """Send `messages`, whose rows are committed (by a session's commit, or a statement in
    autocommit that returned); a failure is logged, never raised."""
    if not messages:
        return
    try:
        publish(messages)
    except Exception:
        # The rows are committed; a sweeper republishes rollouts left without a message.
        log.exception("publishing %d stage messages failed after commit", len(messages))


def attach_publisher(factory: sessionmaker[Session], publish: Publisher) -> None:
    """Send the deferred messages of every session of `factory` after its commit."""

    def _after_commit(session: Session) -> None:
        publish_committed(publish, session.info.pop(_KEY, []))

    def _after_rollback(session: Session) -> None:
        session.info.pop(_KEY, None)

    event.listen(factory, "after_commit", _after_commit)
    event.listen(factory, "after_soft_rollback", lambda s, _t: _after_rollback(s))
