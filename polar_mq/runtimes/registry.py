"""The runtime kinds by name, and the handle on a runtime of a kind (`get_runtime`).

The bwrap and docker modules are imported on first use, so processes that never use them (the
API) do not load the docker SDK. Kept apart from the package's `__init__` so that `options`
(a job's runtime spec to a handle) builds on it without importing its own importer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from polar_mq.runtimes.base import ResourceLimits, Runtime
from polar_mq.runtimes.local import LocalRuntime

RuntimeFactory = Callable[..., Runtime]


def _local(runtime_id: str, root: Path, limits: ResourceLimits | None, **options: Any) -> Runtime:
    return LocalRuntime(runtime_id, root, limits, **options)


def _bwrap(runtime_id: str, root: Path, limits: ResourceLimits | None, **options: Any) -> Runtime:
    from polar_mq.runtimes.bwrap import BwrapRuntime

    return BwrapRuntime(runtime_id, root, limits, **options)


def _docker(runtime_id: str, root: Path, limits: ResourceLimits | None, **options: Any) -> Runtime:
    from polar_mq.runtimes.docker import DockerRuntime

    return DockerRuntime(runtime_id, root, limits, **options)


RUNTIME_KINDS: dict[str, RuntimeFactory] = {"local": _local, "bwrap": _bwrap, "docker": _docker}


def get_runtime(
    kind: str,
    runtime_id: str,
    root: Path,
    limits: ResourceLimits | None = None,
    **options: Any,
) -> Runtime:
    """A handle on runtime `runtime_id` of `kind`; the sandbox itself is created by `start()`.

    Every stage calls this with the ids stored on the rollout, so it must not create anything.
    `options` are the kind's own keywords (e.g. `image`, `network`, `pids_limit`).
    """
    factory = RUNTIME_KINDS.get(kind)
    if factory is None:
        known = ", ".join(sorted(RUNTIME_KINDS))
        raise ValueError(f"unknown runtime kind {kind!r}; known kinds: {known}")
    return factory(runtime_id, root, limits, **options)
