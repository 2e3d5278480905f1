"""The scopes an API key can hold, and what each one allows.

Scopes are coarse on purpose: a trainer needs `jobs:write` + `jobs:read`, a dashboard `jobs:read`,
and the process that loads new weights `policy:write` (the policy version is global: moving it
pauses every proxy and changes the capacity of every tenant's staleness-bound jobs, which is why it
is a scope of its own). `admin` implies every other scope and sees every tenant's jobs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

JOBS_READ: Final = "jobs:read"
JOBS_WRITE: Final = "jobs:write"
POLICY_WRITE: Final = "policy:write"
ADMIN: Final = "admin"

ALL_SCOPES: Final = (JOBS_READ, JOBS_WRITE, POLICY_WRITE, ADMIN)
"""Every scope, in the order they are listed."""

ADMIN_TENANT: Final = "admin"
"""The tenant of keys that existed before tenants (migration 0008) and of development mode."""

TENANT_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def parse_scopes(value: str | Iterable[str]) -> tuple[str, ...]:
    """Scopes from `jobs:read,jobs:write` or a list, deduplicated in canonical order.

    Raises ValueError naming an unknown scope, or when none is given (a key that can do nothing
    is always a mistake).
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    wanted = {item.strip() for item in items if item.strip()}
    unknown = sorted(wanted - set(ALL_SCOPES))
    if unknown:
        raise ValueError(f"unknown scope {unknown[0]!r}; scopes: {', '.join(ALL_SCOPES)}")
    if not wanted:
        raise ValueError(f"at least one scope is needed: {', '.join(ALL_SCOPES)}")
    return tuple(scope for scope in ALL_SCOPES if scope in wanted)


def check_tenant(tenant: str) -> str:
    """The tenant name, or ValueError: 1-64 letters, digits, `_`, `.`, `-` (no spaces, no NUL)."""
    if not TENANT_PATTERN.match(tenant):
        raise ValueError(
            f"invalid tenant {tenant!r}: 1-64 characters from letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )
    return tenant
