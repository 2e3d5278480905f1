"""Managing API keys: create (printed once, stored hashed), list, revoke.

Used by the `polar-mq keys` commands and by tests; the API only reads keys (`polar_mq.api.auth`).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from polar_mq.config import UNLIMITED, QuotaLimits
from polar_mq.models import ApiKey
from polar_mq.models.base import utcnow
from polar_mq.tenants.scopes import check_tenant, parse_scopes

KEY_PREFIX = "pmq_"
MAX_NAME = 200


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_api_key(
    session: Session,
    name: str,
    *,
    tenant: str,
    scopes: str | Iterable[str],
    quota: QuotaLimits = UNLIMITED,
) -> str:
    """Store a new key and return it in plain text: the only time it is ever visible.

    Raises ValueError for an empty or long name, an invalid tenant or an unknown scope.
    """
    if not name.strip() or len(name) > MAX_NAME or "\x00" in name:
        raise ValueError(f"a key name needs 1-{MAX_NAME} characters")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    session.add(
        ApiKey(
            name=name,
            key_hash=hash_key(key),
            tenant=check_tenant(tenant),
            scopes=",".join(parse_scopes(scopes)),
            max_rollouts_per_request=quota.max_rollouts_per_request,
            max_rollouts_in_flight=quota.max_rollouts_in_flight,
            max_tokens_per_rollout=quota.max_tokens_per_rollout,
        )
    )
    session.flush()
    return key


def revoke_api_key(session: Session, name_or_id: str) -> int:
    """Revoke the active key with this id (all digits) or every active key with this name.

    Returns how many were revoked. An all-digit argument that is no key's id is tried as a name.
    """
    active = ApiKey.revoked_at.is_(None)
    if name_or_id.isdigit() and int(name_or_id) < 2**31:
        by_id = session.execute(
            update(ApiKey).where(ApiKey.id == int(name_or_id), active).values(revoked_at=utcnow())
        )
        if getattr(by_id, "rowcount", 0):
            return 1
    result = session.execute(
        update(ApiKey).where(ApiKey.name == name_or_id, active).values(revoked_at=utcnow())
    )
    return int(getattr(result, "rowcount", 0) or 0)


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """A key as `keys list` shows it (never the key itself, which is not stored)."""

    id: int
    name: str
    tenant: str
    scopes: tuple[str, ...]
    quota: QuotaLimits
    created_at: datetime
    revoked_at: datetime | None


def list_api_keys(session: Session, *, include_revoked: bool = False) -> list[KeyInfo]:
    query = select(ApiKey).order_by(ApiKey.id)
    if not include_revoked:
        query = query.where(ApiKey.revoked_at.is_(None))
    return [
        KeyInfo(
            id=key.id,
            name=key.name,
            tenant=key.tenant,
            scopes=tuple(key.scopes.split(",")),
            quota=key_quota(key),
            created_at=key.created_at,
            revoked_at=key.revoked_at,
        )
        for key in session.scalars(query)
    ]


def key_quota(key: ApiKey) -> QuotaLimits:
    return QuotaLimits(
        max_rollouts_per_request=key.max_rollouts_per_request,
        max_rollouts_in_flight=key.max_rollouts_in_flight,
        max_tokens_per_rollout=key.max_tokens_per_rollout,
    )


def has_active_keys(session: Session) -> bool:
    found = session.scalar(select(ApiKey.id).where(ApiKey.revoked_at.is_(None)).limit(1))
    return found is not None
