"""Rollout authentication: which rollout a call belongs to, decided from headers alone.

The capability token reaches us as the agent's API key (`Authorization: Bearer`, `x-api-key`
for Anthropic-style clients, `x-goog-api-key` or `?key=` for Gemini-style ones) or inside its
base URL (`/r/{token}/v1/...`, for harnesses whose API
key we cannot set). Verification is an HMAC, no database round trip; verified tokens are cached
(their expiry is still checked on every call) so the hot path does not re-hash on each request.
The claim also carries the token's signed purpose (`agent` or `judge`), which the proxy stamps on
the call it logs so judge calls never reach the training samples.
"""

from __future__ import annotations

import hmac
import time

from starlette.requests import Request

from polar_mq.capability.tokens import InvalidToken, RolloutClaim, verify_rollout_token
from polar_mq.config import is_loopback

CACHE_MAX = 65_536


class RolloutAuth:
    """Verifies rollout tokens under one secret, with a bounded cache of verified tokens."""

    def __init__(self, secret: str, cache_max: int = CACHE_MAX) -> None:
        self._secret = secret
        self._cache: dict[str, RolloutClaim] = {}
        self._cache_max = cache_max

    def verify(self, token: str) -> RolloutClaim:
        """The claim of a valid token; raises `InvalidToken` when forged, malformed or expired."""
        claim = self._cache.get(token)
        if claim is None:
            claim = verify_rollout_token(self._secret, token)
            if len(self._cache) >= self._cache_max:
                self._cache.clear()
            self._cache[token] = claim
        elif claim.expires_at < time.time():
            del self._cache[token]
            raise InvalidToken("rollout token expired")
        return claim

    def authenticate(self, request: Request) -> RolloutClaim | str:
        """The caller's claim, or the reason (a message for the 401) why there is none.

        Candidates are tried in order: path token, bearer token, `x-api-key`; the first valid one
        wins, so a placeholder API key next to a path token does not lock the agent out.
        """
        reason = "missing rollout token (use it as the API key or in the /r/{token}/v1 path)"
        for token in _candidates(request):
            try:
                return self.verify(token)
            except InvalidToken as exc:
                reason = f"invalid rollout token: {exc}"
        return reason


LOCAL_KEY = "polar_mq.local"
"""Set in the ASGI scope of calls that came over a `--workers` child's control socket: a sibling
process fanning out an admin call (`fanout`); that socket sits in the supervisor's 0700 run
directory."""


def _candidates(request: Request) -> list[str]:
    found: list[str] = []
    path_token = request.path_params.get("token")
    if path_token:
        found.append(path_token)
    headers = request.headers
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            found.append(value.strip())
    for name in ("x-api-key", "x-goog-api-key"):  # Anthropic- and Gemini-style clients
        api_key = headers.get(name)
        if api_key:
            found.append(api_key.strip())
    # Gemini's `?key=`; the query is parsed only when there is one (most calls have none)
    query_key = request.query_params.get("key") if request.scope["query_string"] else None
    if query_key:
        found.append(query_key.strip())
    return found


def admin_allowed(request: Request, admin_token: str | None) -> bool:
    """Admin calls need `Authorization: Bearer <proxy_admin_token>` once that token is set.

    Without one (development only: production refuses to start without it) they are taken from
    this machine only, so a proxy whose settings were bypassed still never opens `/admin/*` to
    the network.
    """
    if request.scope.get(LOCAL_KEY):  # a sibling process, over its private control socket
        return True
    if not admin_token:
        client = request.client
        return client is not None and is_loopback(client.host)
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip(), admin_token)
