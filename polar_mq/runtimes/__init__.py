"""Runtimes: the sandboxes agents run in, re-attachable by id from any worker process.

Kinds: `local` (a directory and tagged processes), `bwrap` (bubblewrap namespaces around each
command) and `docker` (a container per runtime). The bwrap and docker modules are imported on
first use, so processes that never use them (the API) do not load the docker SDK.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from polar_mq.runtimes.base import ExecResult, ResourceLimits, Runtime, validate_runtime_id
from polar_mq.runtimes.local import LocalRuntime
from polar_mq.runtimes.options import check_runtime_options, runtime_from_spec

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


__all__ = [
    "RUNTIME_KINDS",
    "ExecResult",
    "LocalRuntime",
    "ResourceLimits",
    "Runtime",
    "check_runtime_options",
    "get_runtime",
    "runtime_from_spec",
    "validate_runtime_id",
]
