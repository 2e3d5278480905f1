"""Passwords on the database and the broker: what a production process warns about at start.

An agent on the node's network (a `local` runtime, a sandbox on `host`) or a neighbour that
reaches a PostgreSQL or Redis open without a password can write rows as the database owner, an
admin API key included (issue 32). docs/hardening.md shows a deployment where both require one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit

if TYPE_CHECKING:
    from polar_mq.config import Settings


def url_has_password(url: str) -> bool:
    """Whether a database or broker URL carries a password (in its user part or, for libpq,
    as a `password=` query parameter). The embedded SQLite URLs need none."""
    parts = urlsplit(url)
    if parts.scheme.startswith("sqlite") or parts.scheme.startswith("sqla+sqlite"):
        return True
    if parts.password:
        return True
    return any(key == "password" and value for key, value in parse_qsl(parts.query))


def credential_warnings(settings: Settings) -> list[str]:
    """What a production process warns about at start: a PostgreSQL or Redis/RabbitMQ reachable
    without a password. Whoever reaches them (an agent on the node's network, a neighbour) can
    write rows as the database owner, an admin API key included. Warnings, not refusals: a
    password may come from outside the URL (~/.pgpass, a Unix socket with peer authentication).
    See docs/hardening.md for a deployment where both require one."""
    if not settings.is_production:
        return []
    urls = {
        "POLAR_MQ_DATABASE_URL": settings.database_url,
        "POLAR_MQ_BROKER_URL": settings.broker_url,
        "POLAR_MQ_PROXY_REDIS_URL": settings.proxy_redis_url,
    }
    return [
        f"{name} carries no password: anyone who reaches that server (an agent on the node's "
        "network included) can use it; require one (docs/hardening.md) unless it comes from "
        "~/.pgpass or peer authentication"
        for name, url in urls.items()
        if url and not url_has_password(url)
    ]
