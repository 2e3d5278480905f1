"""From a job's typed `runtime` spec (`polar_mq.spec.RuntimeSpec`) to a runtime handle; which
options each kind understands.

Kept apart from the runtime modules so the API can validate a job without importing the docker SDK.
Options a kind would silently ignore are refused: a job asking for `network: none` on the `local`
runtime must fail at submit time, not run with the node's network.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polar_mq.runtimes.base import ResourceLimits, Runtime
from polar_mq.runtimes.registry import get_runtime
from polar_mq.spec.model import RuntimeSpec

KIND_OPTIONS: dict[str, tuple[str, ...]] = {
    "local": (),
    "bwrap": ("network", "pids"),
    "docker": ("image", "network", "cpus", "pids", "python"),
}
"""The `RuntimeSpec` options each kind understands (the limits are every kind's)."""
DEFAULT_NETWORK = "host"
"""What every kind does without a network option (`RuntimeSpec.network`'s default)."""
# network policies each kind can enforce (proxy_only needs its own network namespace and a relay
# into it: `local` has neither)
NETWORKS: dict[str, tuple[str, ...]] = {
    "bwrap": ("host", "none", "proxy_only"),
    "docker": ("host", "none", "proxy_only"),
}
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
    return DEFAULT_NETWORK


def _options_of(spec: RuntimeSpec) -> dict[str, object]:
    """The kind-specific options the spec sets, by `RuntimeSpec` field (None: not set)."""
    return {
        "image": spec.image,
        "network": None if spec.network == DEFAULT_NETWORK else spec.network,
        "cpus": spec.cpus,
        "pids": spec.pids,
        "python": spec.python,
    }


def check_runtime_options(spec: RuntimeSpec) -> None:
    """Raise ValueError when `spec` asks a kind for something it cannot do."""
    allowed = KIND_OPTIONS[spec.kind]
    for key, value in _options_of(spec).items():
        if value is None or key in allowed:
            continue
        takers = [k for k, opts in KIND_OPTIONS.items() if key in opts]
        if key == "network":
            takers = [k for k, values in NETWORKS.items() if value in values]
        raise ValueError(f"runtime option {key}={value!r} needs kind {' or '.join(takers)}")
    if spec.kind == "docker" and not spec.image:
        raise ValueError("runtime kind docker needs an image (e.g. polar-mq-runtime:test)")


def _limits(spec: RuntimeSpec) -> ResourceLimits | None:
    limits = ResourceLimits(
        memory_mb=spec.memory_mb,
        cpu_seconds=spec.cpu_seconds,
        max_open_files=spec.max_open_files,
        file_size_mb=spec.file_size_mb,
    )
    return None if limits == ResourceLimits() else limits


def _kind_keywords(spec: RuntimeSpec, ro_binds: Sequence[str]) -> dict[str, Any]:
    """The constructor keywords of the spec's kind (unset options keep the kind's defaults)."""
    if ro_binds and spec.kind != "bwrap":
        raise ValueError(f"extra read-only binds need kind bwrap, not {spec.kind}")
    if spec.kind == "bwrap":
        keywords: dict[str, Any] = {
            "network": spec.network, "pids_limit": spec.pids, "ro_binds": tuple(ro_binds),
        }  # fmt: skip
    elif spec.kind == "docker":
        keywords = {
            "image": spec.image, "network": spec.network, "cpus": spec.cpus,
            "pids_limit": spec.pids, "python": spec.python,
        }  # fmt: skip
    else:
        keywords = {}
    return {key: value for key, value in keywords.items() if value is not None}


def runtime_from_spec(
    spec: RuntimeSpec, runtime_id: str, root: Path, ro_binds: Sequence[str] = ()
) -> Runtime:
    """The handle every stage builds from the job's runtime spec (creates nothing).

    `ro_binds`: node paths a `bwrap` sandbox also mounts read-only (a preset's install, see
    `polar_mq.harnesses.presets.setup.sandbox_binds`); they take effect at `start()`.
    """
    check_runtime_options(spec)
    return get_runtime(spec.kind, runtime_id, root, _limits(spec), **_kind_keywords(spec, ro_binds))
