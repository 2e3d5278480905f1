"""Runtimes: the sandboxes agents run in, re-attachable by id from any worker process.

Kinds: `local` (a directory and tagged processes), `bwrap` (bubblewrap namespaces around each
command) and `docker` (a container per runtime). The bwrap and docker modules are imported on
first use, so processes that never use them (the API) do not load the docker SDK.
"""

from __future__ import annotations

from polar_mq.runtimes.base import ExecResult, ResourceLimits, Runtime, validate_runtime_id
from polar_mq.runtimes.local import LocalRuntime
from polar_mq.runtimes.options import check_runtime_options, runtime_from_spec
from polar_mq.runtimes.registry import RUNTIME_KINDS, RuntimeFactory, get_runtime

__all__ = [
    "RUNTIME_KINDS",
    "ExecResult",
    "LocalRuntime",
    "ResourceLimits",
    "Runtime",
    "RuntimeFactory",
    "check_runtime_options",
    "get_runtime",
    "runtime_from_spec",
    "validate_runtime_id",
]
