"""Loading a stored `jobs.spec` of any version into today's `JobSpec`.

Each step turns version n into n+1; `load_spec` runs the steps a row needs, then validates. A row
newer than this code (written by a newer release during a rolling upgrade) is refused rather than
read with fields silently ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from polar_mq.spec.model import SPEC_VERSION, JobSpec


class SpecVersionError(ValueError):
    """A stored spec this code cannot read (a newer version, or not a version at all)."""


def _v1_to_v2(stored: dict[str, Any]) -> dict[str, Any]:
    """Version 1 wrote no `spec_version` and left some defaults out (`priority`, and `pool`,
    `retries`, `stop.stragglers` on the oldest rows); the model fills them in, so only the stamp
    changes."""
    return {**stored, "spec_version": 2}


_STEPS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}
"""version n -> the step to n+1; one entry per version below SPEC_VERSION."""


def upgrade(stored: Mapping[str, Any]) -> dict[str, Any]:
    """The stored dict rewritten to the current `SPEC_VERSION` (a copy; `stored` is untouched)."""
    spec = dict(stored)
    version = spec.get("spec_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise SpecVersionError(f"spec_version {version!r} is not a version")
    if version > SPEC_VERSION:
        raise SpecVersionError(
            f"spec_version {version} is newer than this release reads ({SPEC_VERSION})"
        )
    while version < SPEC_VERSION:
        spec = _STEPS[version](spec)
        version = spec["spec_version"]
    return spec


def load_spec(stored: Mapping[str, Any] | JobSpec) -> JobSpec:
    """The typed spec of a stored row (a `JobSpec` passes through)."""
    if isinstance(stored, JobSpec):
        return stored
    return JobSpec.model_validate(upgrade(stored))
