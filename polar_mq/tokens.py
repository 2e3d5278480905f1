"""Per-rollout capability tokens handed to agents (and judges) as their API key.

A token names exactly one rollout, an expiry and a purpose, signed with HMAC-SHA256 under the shared
secret, so the proxy can authenticate a call without a database round trip and an agent cannot
speak for another rollout. The purpose tells the proxy how to mark the calls it logs: `agent` calls
feed training samples, `judge` calls (an `llm_judge` evaluator scoring the rollout) are stored for
audit but never trained on.

A token may also name the rollout's attempt, so the proxy logs every call under the attempt
that made it: when a lost attempt is restarted, a straggling process of the old attempt (killed
moments later by the node janitor) cannot slip calls into the new attempt's trajectory.

Formats (purpose and attempt are inside the signed payload, so they cannot be swapped):
- agent: `pmq_<rollout uuid hex>_<expiry unix seconds>_<signature hex>` (the original format,
  so tokens issued before purposes existed keep working and agent tokens stay as short);
- other purposes: `pmq_<rollout uuid hex>_<expiry>_<purpose>_<signature hex>`;
- with an attempt: `pmq_<rollout uuid hex>_<expiry>_<purpose>_<attempt>_<signature hex>`.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from dataclasses import dataclass
from typing import Final

PREFIX = "pmq"
AGENT: Final = "agent"
JUDGE: Final = "judge"
PURPOSES = frozenset({AGENT, JUDGE})
"""Every purpose a token may carry; also the values of `llm_calls.purpose`."""


class InvalidToken(ValueError):
    """The token is malformed, forged or expired."""


@dataclass(frozen=True, slots=True)
class RolloutClaim:
    rollout_id: uuid.UUID
    expires_at: int
    purpose: str = AGENT
    attempt: int | None = None
    """The rollout attempt the token was issued for (None: tokens issued without one)."""


def _sign(secret: str, payload: str) -> str:
    return hmac.new(secret.encode(), payload.encode(), hashlib.sha256).hexdigest()[:32]


def issue_rollout_token(
    secret: str,
    rollout_id: uuid.UUID,
    ttl_s: int,
    purpose: str = AGENT,
    attempt: int | None = None,
) -> str:
    """A token for `rollout_id` valid for `ttl_s` seconds, for calls made with `purpose`."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown token purpose {purpose!r}; known: {', '.join(sorted(PURPOSES))}")
    if attempt is not None and attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    payload = f"{PREFIX}_{rollout_id.hex}_{int(time.time()) + ttl_s}"
    if attempt is not None:
        payload = f"{payload}_{purpose}_{attempt}"
    elif purpose != AGENT:
        payload = f"{payload}_{purpose}"
    return f"{payload}_{_sign(secret, payload)}"


def verify_rollout_token(secret: str, token: str, now: float | None = None) -> RolloutClaim:
    """The claim a genuine, unexpired token carries; raises `InvalidToken` otherwise."""
    parts = token.split("_")
    if len(parts) not in (4, 5, 6) or parts[0] != PREFIX:
        raise InvalidToken("malformed rollout token")
    payload = "_".join(parts[:-1])
    if not hmac.compare_digest(_sign(secret, payload), parts[-1]):
        raise InvalidToken("bad rollout token signature")
    purpose = parts[3] if len(parts) >= 5 else AGENT
    if purpose not in PURPOSES or (len(parts) == 5 and purpose == AGENT):
        raise InvalidToken("malformed rollout token")  # signed, but by a newer or odd issuer
    try:
        rollout_id = uuid.UUID(hex=parts[1])
        expires_at = int(parts[2])
        attempt = int(parts[4]) if len(parts) == 6 else None
    except ValueError as exc:
        raise InvalidToken("malformed rollout token") from exc
    if expires_at < (time.time() if now is None else now):
        raise InvalidToken("rollout token expired")
    if attempt is not None and attempt < 1:
        raise InvalidToken("malformed rollout token")
    return RolloutClaim(rollout_id, expires_at, purpose, attempt)
