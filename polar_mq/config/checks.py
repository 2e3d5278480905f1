"""What makes settings unsafe to serve with: a forgeable or guessable secret, an open admin API.

`Settings` runs `security_problems` when it is built (a process refuses to start, naming each
setting to fix); kept apart from `config` so that the settings module stays a list of settings.
"""

from __future__ import annotations

import ipaddress
from typing import Protocol

from polar_mq.config.secret_strength import weakness


class ServedSettings(Protocol):
    """What the checks read of `config.Settings` (a protocol: `config` imports this module)."""

    @property
    def is_production(self) -> bool: ...

    secret_key: str
    proxy_admin_token: str | None
    proxy_host: str


DEFAULT_SECRET = "polar-mq-dev-secret-change-me"
MIN_SECRET_BYTES = 32
"""A shorter HMAC secret makes every rollout token guessable offline; production refuses it."""
MIN_ADMIN_TOKEN_CHARS = 24
"""The proxy admin token's floor in production (it guards `/admin/*`: backends, flushes)."""


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps a server reachable from this machine only."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def security_problems(settings: ServedSettings) -> list[str]:
    """What makes `settings` unsafe to serve with: every token forgeable, the admin API open.

    Production needs a real secret (>= 32 bytes) and a proxy admin token (>= 24 characters; the
    API and the workers send it, the proxy requires it), both unguessable (`secret_strength`: no
    `aaaa...`, no `abcabc...`). Any mode refuses a proxy bound beyond loopback without an admin
    token: whoever reaches `/admin/*` could add a backend and receive the agents' calls.
    """
    problems: list[str] = []
    admin_token = (settings.proxy_admin_token or "").strip()
    if settings.is_production:
        if settings.secret_key == DEFAULT_SECRET:
            problems.append("POLAR_MQ_SECRET_KEY must be set in production")
        elif len(settings.secret_key.encode()) < MIN_SECRET_BYTES:
            problems.append(
                f"POLAR_MQ_SECRET_KEY must be at least {MIN_SECRET_BYTES} bytes in production "
                f"(got {len(settings.secret_key.encode())}; e.g. openssl rand -hex 32)"
            )
        elif weak := weakness(settings.secret_key, MIN_SECRET_BYTES):
            problems.append(f"POLAR_MQ_SECRET_KEY {weak} in production")
        if not admin_token:
            problems.append(
                "POLAR_MQ_PROXY_ADMIN_TOKEN must be set in production (it guards the proxy's "
                "/admin/* endpoints)"
            )
        elif weak := weakness(admin_token, MIN_ADMIN_TOKEN_CHARS):
            problems.append(f"POLAR_MQ_PROXY_ADMIN_TOKEN {weak} in production")
    if not admin_token and not is_loopback(settings.proxy_host):
        problems.append(
            f"POLAR_MQ_PROXY_HOST={settings.proxy_host} is not a loopback address: set "
            "POLAR_MQ_PROXY_ADMIN_TOKEN, or bind 127.0.0.1"
        )
    return problems
