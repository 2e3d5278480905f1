"""Per-rollout capability tokens handed to agents as their API key.

A token names exactly one rollout and an expiry, signed with HMAC-SHA256 under the shared secret, so
the proxy can authenticate a call without a database round trip and an agent cannot speak for
another rollout. Format: `pmq_<rollout uuid hex>_<expiry unix seconds>_<signature hex>`.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from dataclasses import dataclass

PREFIX = "pmq"


class InvalidToken(ValueError):
    """The token is malformed, forged or expired."""


@dataclass(frozen=True, slots=True)
class RolloutClaim:
    rollout_id: uuid.UUID
    expires_at: int


def _sign(secret: str, payload: str) -> str:
    return hmac.new(secret.encode(), payload.encode(), hashlib.sha256).hexdigest()[:32]


def issue_rollout_token(secret: str, rollout_id: uuid.UUID, ttl_s: int) -> str:
    payload = f"{PREFIX}_{rollout_id.hex}_{int(time.time()) + ttl_s}"
    return f"{payload}_{_sign(secret, payload)}"


def verify_rollout_token(secret: str, token: str, now: float | None = None) -> RolloutClaim:
    parts = token.split("_")
    if len(parts) != 4 or parts[0] != PREFIX:
        raise InvalidToken("malformed rollout token")
    payload = "_".join(parts[:3])
    if not hmac.compare_digest(_sign(secret, payload), parts[3]):
        raise InvalidToken("bad rollout token signature")
    try:
        rollout_id = uuid.UUID(hex=parts[1])
        expires_at = int(parts[2])
    except ValueError as exc:
        raise InvalidToken("malformed rollout token") from exc
    if expires_at < (time.time() if now is None else now):
        raise InvalidToken("rollout token expired")
    return RolloutClaim(rollout_id, expires_at)
