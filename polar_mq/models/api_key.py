"""API keys for the REST API; only a SHA-256 hash of each key is stored.

Each key belongs to a tenant and holds scopes (comma-separated, see `polar_mq.tenants.scopes`);
its quota columns override the tenant's limits from Settings when set (NULL: inherit).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from polar_mq.models.base import Base, utcnow


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    tenant: Mapped[str] = mapped_column(String(64), default="admin", server_default="admin")
    scopes: Mapped[str] = mapped_column(String(200))
    """Comma-separated, e.g. `jobs:read,jobs:write`."""
    max_rollouts_per_request: Mapped[int | None] = mapped_column(Integer)
    max_rollouts_in_flight: Mapped[int | None] = mapped_column(Integer)
    max_tokens_per_rollout: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None]
