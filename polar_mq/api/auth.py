"""Bearer API keys: only their SHA-256 hashes are stored, in the `api_keys` table.

With no active key in the table, authentication is off: that is the local, single-user setup, and
the CLI refuses to bind such an API to anything but localhost. The "are there any keys?" lookup is
cached for a few seconds so open mode costs no query per request, and once this process has seen a
key, authentication stays on until it restarts: revoking the last key must never open the API.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from polar_mq.api.errors import ApiError
from polar_mq.models import ApiKey
from polar_mq.models.base import utcnow

KEY_PREFIX = "pmq_"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who made a request: the name of its API key, or `anonymous` while authentication is off."""

    name: str
    key_id: int | None


ANONYMOUS = Principal("anonymous", None)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_api_key(session: Session, name: str) -> str:
    """Store a new key and return it in plain text: the only time it is ever visible."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiKey(name=name, key_hash=hash_key(key)))
    session.flush()
    return key


def revoke_api_key(session: Session, name: str) -> int:
    """Revoke every active key called `name`; returns how many were revoked."""
    result = session.execute(
        update(ApiKey)
        .where(ApiKey.name == name, ApiKey.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
    return int(getattr(result, "rowcount", 0) or 0)


def has_active_keys(session: Session) -> bool:
    return session.scalar(select(ApiKey.id).where(ApiKey.revoked_at.is_(None)).limit(1)) is not None


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
        row = session.execute(
            select(ApiKey.id, ApiKey.name).where(
                ApiKey.key_hash == hash_key(token), ApiKey.revoked_at.is_(None)
            )
        ).first()
        if row is None:
            raise _unauthorized("invalid or revoked API key")
        key_id, name = row
        return Principal(name, key_id)
