"""The embedded broker for the one-command demo: kombu's SQLAlchemy transport on SQLite, polled
every 0.1 s instead of every second (kombu forwards transport options to `create_engine`, so the
interval cannot be passed as one)."""

from __future__ import annotations

from kombu.transport.sqlalchemy import Transport as SqlAlchemyTransport


class Transport(SqlAlchemyTransport):
    polling_interval = 0.1
