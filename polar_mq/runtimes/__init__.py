"""Runtimes: the sandboxes agents run in, re-attachable by id from any worker process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from polar_mq.runtimes.base import ExecResult, ResourceLimits, Runtime, validate_runtime_id
from polar_mq.runtimes.local import LocalRuntime

RuntimeFactory = Callable[[str, Path, ResourceLimits | None], Runtime]
RUNTIME_KINDS: dict[str, RuntimeFactory] = {"local": LocalRuntime}


def get_runtime(
    kind: str, runtime_id: str, root: Path, limits: ResourceLimits | None = None
) -> Runtime:
    """A handle on runtime `runtime_id` of `kind`; the sandbox itself is created by `start()`.

    Every stage calls this with the ids stored on the rollout, so it must not create anything.
    """
    factory = RUNTIME_KINDS.get(kind)
    if factory is None:
        known = ", ".join(sorted(RUNTIME_KINDS))
        raise ValueError(f"unknown runtime kind {kind!r}; known kinds: {known}")
    return factory(runtime_id, root, limits)


__all__ = [
    "RUNTIME_KINDS",
    "ExecResult",
    "LocalRuntime",
    "ResourceLimits",
    "Runtime",
    "get_runtime",
    "validate_runtime_id",
]
