"""Bearer API keys: only their SHA-256 hashes are stored, in the `api_keys` table.

With no active key in the table, authentication is off: that is the local, single-user setup, and
the CLI refuses to bind such an API to anything but localhost. The "are there any keys?" lookup is
cached for a few seconds so open mode costs no query per request, and once this process has seen a
key, authentication stays on until it restarts: revoking the last key must never open the API.

A request's `Principal` carries its key's tenant, scopes and quota overrides; while authentication
is off it is `ANONYMOUS`, an admin of the `admin` tenant, so development works as before tenants.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from polar_mq.api.errors import ApiError
from polar_mq.config import UNLIMITED, QuotaLimits
from polar_mq.models import ApiKey
from polar_mq.tenants.keys import (
    KEY_PREFIX,
    create_api_key,
    has_active_keys,
    hash_key,
    key_quota,
    revoke_api_key,
)
from polar_mq.tenants.scopes import ADMIN, ADMIN_TENANT, ALL_SCOPES

__all__ = [
    "ANONYMOUS",
    "KEY_PREFIX",
    "Authenticator",
    "Principal",
    "create_api_key",
    "has_active_keys",
    "hash_key",
    "revoke_api_key",
]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who made a request: its API key's name, tenant, scopes and quota overrides."""

    name: str
    key_id: int | None
    tenant: str = ADMIN_TENANT
    scopes: frozenset[str] = field(default=frozenset(ALL_SCOPES))
    quota: QuotaLimits = UNLIMITED
    """The key's own limits; unset ones come from Settings (`tenants.quotas.tenant_quota`)."""

    @property
    def is_admin(self) -> bool:
        return ADMIN in self.scopes

    def can(self, scope: str) -> bool:
        return self.is_admin or scope in self.scopes

    @property
    def visible_tenant(self) -> str | None:
        """The only tenant whose jobs this principal sees, or None for every tenant (admin)."""
        return None if self.is_admin else self.tenant


ANONYMOUS = Principal("anonymous", None)


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


class Authenticator:
    """Checks bearer tokens; one per app, shared by the request threads."""

    def __init__(self, ttl_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._enabled = False
        self._checked_at: float | None = None

    def enabled(self, session: Session) -> bool:
        with self._lock:
            if self._enabled:
                return True
            now = self._clock()
            if self._checked_at is not None and now - self._checked_at < self.ttl_s:
                return False
        found = has_active_keys(session)
        with self._lock:
            self._enabled = self._enabled or found
            self._checked_at = self._clock()
            return self._enabled

    def authenticate(self, session: Session, token: str | None) -> Principal:
        """The principal of a request, or a 401 ApiError."""
        if not self.enabled(session):
            return ANONYMOUS
        if not token:
            raise _unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        key = session.scalar(
            select(ApiKey).where(ApiKey.key_hash == hash_key(token), ApiKey.revoked_at.is_(None))
        )
        if key is None:
            raise _unauthorized("invalid or revoked API key")
        return Principal(
            name=key.name,
            key_id=key.id,
            tenant=key.tenant,
            scopes=frozenset(key.scopes.split(",")),
            quota=key_quota(key),
        )
