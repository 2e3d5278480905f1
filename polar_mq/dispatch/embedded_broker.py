"""The embedded broker for the one-command demo: kombu's SQLAlchemy transport on SQLite, polled
every 0.1 s instead of every second (kombu forwards transport options to `create_engine`, so the
interval cannot be passed as one), with its queue creation made safe across processes.

kombu (5.7) creates a queue's row on the first publish to it, under a lock that holds only within
one process. When two processes publish to a new queue at once (the demo's prepare worker and the
run-agent consumer declaring its own queue, at start), the loser's INSERT fails with an
`IntegrityError`, which kombu does not catch: that publish fails, and the channel's session stays
in a failed transaction, so every later publish through it fails too (`PendingRollbackError`).
Three processes publishing to 300 new queues: 8 integrity errors with kombu's channel, then every
publish of the process failed; none with this one. A stage message lost that way waits for the
sweeper's republish (minutes), so the demo seemed to hang.
"""

from __future__ import annotations

from typing import Any

from kombu.transport.sqlalchemy import Channel as SqlAlchemyChannel
from kombu.transport.sqlalchemy import Transport as SqlAlchemyTransport
from sqlalchemy.exc import IntegrityError, SQLAlchemyError


class Channel(SqlAlchemyChannel):
    """kombu's channel, whose session survives a failed statement and whose queue creation takes
    the row another process has just created."""

    def _get_or_create(self, queue: str) -> Any:
        try:
            return super()._get_or_create(queue)  # type: ignore[no-untyped-call]
        except IntegrityError:
            # Another process inserted the queue's row between our look and our insert: use it.
            self.session.rollback()
            return super()._get_or_create(queue)  # type: ignore[no-untyped-call]
        except SQLAlchemyError:
            self.session.rollback()  # the next publish starts from a clean session
            raise

    def _put(self, *args: Any, **kwargs: Any) -> None:  # kombu's two bases name them apart
        try:
            super()._put(*args, **kwargs)  # type: ignore[no-untyped-call]
        except SQLAlchemyError:
            self.session.rollback()  # kombu rolls back only an OperationalError
            raise


class Transport(SqlAlchemyTransport):
    Channel = Channel
    polling_interval = 0.1
