"""What the stage modules share: their result type, their failure type and the runtime handle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polar_mq.config import Settings
from polar_mq.models import Rollout
from polar_mq.runtimes import ResourceLimits, Runtime, get_runtime


@dataclass
class StageOutcome:
    """Columns to set on the rollout, rows to insert, and the detail of the `finished` event."""

    values: dict[str, Any] = field(default_factory=dict)
    rows: list[Any] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)


class StageFailure(Exception):
    """An infrastructure failure with its termination reason; the rollout fails unscored."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def runtime_id_for(rollout: Rollout) -> str:
    """Deterministic per attempt, so any process on the node can re-attach or clean it up."""
    return f"{rollout.id.hex}-{rollout.attempt}"


def open_runtime(settings: Settings, runtime_spec: dict[str, Any], rollout: Rollout) -> Runtime:
    limits = ResourceLimits(
        memory_mb=runtime_spec.get("memory_mb"),
        cpu_seconds=runtime_spec.get("cpu_seconds"),
        max_open_files=runtime_spec.get("max_open_files"),
    )
    return get_runtime(
        runtime_spec.get("kind", "local"), runtime_id_for(rollout), settings.runtime_root, limits
    )
