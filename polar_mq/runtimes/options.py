"""From a job's `runtime` spec to a runtime handle; which options each kind understands.

Kept apart from the runtime modules so the API can validate a job without importing the docker SDK.
Options a kind would silently ignore are refused: a job asking for `network: none` on the `local`
runtime must fail at submit time, not run with the node's network.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polar_mq.runtimes.base import ResourceLimits, Runtime

# spec key -> constructor keyword, per kind
KIND_OPTIONS: dict[str, dict[str, str]] = {
    "local": {},
    "bwrap": {"network": "network", "pids": "pids_limit", "ro": "ro_binds"},
    "docker": {
        "image": "image",
        "network": "network",
        "cpus": "cpus",
        "pids": "pids_limit",
        "python": "python",
    },
}
_DEFAULTS: dict[str, Any] = {"network": "host"}  # what every kind does without the option
# network policies each kind can enforce (proxy_only needs its own network namespace and a relay
# into it: `local` has neither)
NETWORKS: dict[str, tuple[str, ...]] = {
    "bwrap": ("host", "none", "proxy_only"),
    "docker": ("host", "none", "proxy_only"),
}
_LIMIT_KEYS = ("memory_mb", "cpu_seconds", "max_open_files")
UNTRUSTED_DEFAULT_NETWORK = "proxy_only"
"""The network of an untrusted harness (a third-party preset) when the job names none."""


def effective_network(kind: str, network: str | None, *, trusted: bool) -> str:
    """The network policy a job's runtime gets: the job's own choice when it made one.

    Unset, a harness we do not vouch for (a third-party preset) gets `proxy_only` where the kind
    can enforce it (bwrap, docker): it reaches the proxy and nothing else, so it cannot call home,
    download code or reach PostgreSQL and Redis. An explicit `host` or `none` is the operator's
    choice and kept (a harness that must download packages). `local` has no network policy at
    all and stays `host`; bwrap or docker is how third-party harnesses are contained.
    Trusted harnesses (the `command` harness, the reference agent: the user's or our own code)
    keep the old default, `host`.
    """
    if network is not None:
        return network
    if not trusted and UNTRUSTED_DEFAULT_NETWORK in NETWORKS.get(kind, ()):
        return UNTRUSTED_DEFAULT_NETWORK
    return str(_DEFAULTS["network"])


def check_runtime_options(spec: Mapping[str, Any]) -> None:
    """Raise ValueError when `spec` asks a kind for something it cannot do."""
    kind = spec.get("kind", "local")
    allowed = KIND_OPTIONS.get(kind)
    if allowed is None:
        raise ValueError(f"unknown runtime kind {kind!r}; known: {', '.join(KIND_OPTIONS)}")
    for key in ("image", "network", "cpus", "pids", "python"):
        value = spec.get(key)
        if value is None or key in allowed or _DEFAULTS.get(key) == value:
            continue
        takers = [k for k, opts in KIND_OPTIONS.items() if key in opts]
        if key == "network":
            takers = [k for k, values in NETWORKS.items() if value in values]
        raise ValueError(f"runtime option {key}={value!r} needs kind {' or '.join(takers)}")
    network = spec.get("network")
    if network is not None and network not in NETWORKS.get(kind, (network,)):
        takers = [k for k, values in NETWORKS.items() if network in values]
        raise ValueError(f"runtime option network={network!r} needs kind {' or '.join(takers)}")
    if kind == "docker" and not spec.get("image"):
        raise ValueError("runtime kind docker needs an image (e.g. polar-mq-runtime:test)")


def runtime_from_spec(spec: Mapping[str, Any], runtime_id: str, root: Path) -> Runtime:
    """The handle every stage builds from the stored job spec (creates nothing)."""
    from polar_mq.runtimes import get_runtime  # the registry imports this module's users

    check_runtime_options(spec)
    kind = spec.get("kind", "local")
    values = {key: spec.get(key) for key in _LIMIT_KEYS}
    limits = ResourceLimits(**values) if any(v is not None for v in values.values()) else None
    options = {
        keyword: spec[key]
        for key, keyword in KIND_OPTIONS[kind].items()
        if spec.get(key) is not None
    }
    return get_runtime(kind, runtime_id, root, limits, **options)
