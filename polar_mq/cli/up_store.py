"""Where `polar-mq up` keeps its data and who may use it: the store (embedded or services) and
the stack's API key.

The embedded store (SQLite database, kombu's SQLAlchemy transport on SQLite as the broker) needs
nothing installed; a PostgreSQL database and a Redis broker, named by `--database-url` /
`--broker-url` or `POLAR_MQ_DATABASE_URL` / `POLAR_MQ_BROKER_URL`, are used instead when given,
after a check that they answer (a stack that starts and then fails its first request is worse
than a refusal naming the URL).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from polar_mq.tenants.scopes import ADMIN, ADMIN_TENANT

KEY_NAME = "polar-mq-up"
"""The name of the key `up` creates (`polar-mq keys list` shows it)."""
DEFAULT_PORTS = {"postgresql": 5432, "redis": 6379, "rediss": 6379, "amqp": 5672}
REACH_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Store:
    database_url: str
    broker_url: str
    embedded: bool

    @property
    def flower_ready(self) -> bool:
        """Flower reads a broker's events: Redis and RabbitMQ send them, the SQLite one cannot."""
        return self.broker_url.startswith(("redis://", "rediss://", "amqp://"))


def embedded_store(root: Path) -> Store:
    return Store(
        database_url=f"sqlite:///{(root / 'polar_mq.db').resolve()}",
        broker_url=f"sqla+sqlite:///{(root / 'broker.db').resolve()}",
        embedded=True,
    )


def _unreachable(url: str) -> str | None:
    """Why `url`'s server does not accept a connection, or None when it does."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+")[0]
    host, port = parts.hostname or "127.0.0.1", parts.port or DEFAULT_PORTS.get(scheme)
    if port is None:
        return f"no port in {url!r}"
    try:
        with socket.create_connection((host, port), timeout=REACH_TIMEOUT_S):
            return None
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or exc}"


def services_store(database_url: str | None, broker_url: str | None, root: Path) -> Store:
    """The store the flags name: embedded when neither is given, else the given servers, each
    checked to answer. Raises ValueError with a message naming the URL and what to do."""
    if database_url is None and broker_url is None:
        return embedded_store(root)
    embedded = embedded_store(root)
    chosen = Store(database_url or embedded.database_url, broker_url or embedded.broker_url, False)
    for label, url, flag in (
        ("database", database_url, "--database-url / POLAR_MQ_DATABASE_URL"),
        ("broker", broker_url, "--broker-url / POLAR_MQ_BROKER_URL"),
    ):
        if url is None or url.startswith("sqlite") or url.startswith("sqla+sqlite"):
            continue
        why = _unreachable(url)
        if why is not None:
            raise ValueError(
                f"the {label} at {url} does not answer ({why}); start it, or unset {flag} "
                "to run on the embedded SQLite defaults"
            )
    return chosen


def stack_key(database_url: str, key_file: Path) -> str:
    """The stack's admin key: the one saved in `key_file` while it is still active, else a new
    one (saved, readable by this user only), so restarting `up` keeps the key a trainer uses."""
    from sqlalchemy import select

    from polar_mq.infra.db import create_db_engine, make_session_factory, unit_of_work
    from polar_mq.models import ApiKey
    from polar_mq.tenants.keys import create_api_key, hash_key

    saved = key_file.read_text().strip() if key_file.exists() else None
    engine = create_db_engine(database_url)
    try:
        with unit_of_work(make_session_factory(engine)) as session:
            if saved:
                active = session.scalar(
                    select(ApiKey.id).where(
                        ApiKey.key_hash == hash_key(saved), ApiKey.revoked_at.is_(None)
                    )
                )
                if active is not None:
                    return saved
            key = create_api_key(session, KEY_NAME, tenant=ADMIN_TENANT, scopes=ADMIN)
    finally:
        engine.dispose()
    key_file.touch(mode=0o600)
    key_file.write_text(key + "\n")
    return key
