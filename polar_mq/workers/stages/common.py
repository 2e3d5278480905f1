"""What the stage modules share: their result type, their failure type and the runtime handle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Table

from polar_mq.config import Settings
from polar_mq.runtimes import Runtime
from polar_mq.runtimes.options import runtime_from_spec
from polar_mq.workers.transitions import RolloutRef


@dataclass
class StageOutcome:
    """Columns to set on the rollout, rows to insert per table, and the `finished` event detail."""

    values: dict[str, Any] = field(default_factory=dict)
    rows: dict[Table, list[dict[str, Any]]] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)


class StageFailure(Exception):
    """An infrastructure failure with its termination reason; the rollout fails unscored."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def runtime_id_for(rollout: RolloutRef) -> str:
    """Deterministic per attempt, so any process on the node can re-attach or clean it up."""
    return f"{rollout.id.hex}-{rollout.attempt}"


def open_runtime(settings: Settings, runtime_spec: dict[str, Any], rollout: RolloutRef) -> Runtime:
    """A handle on the rollout's runtime (any kind), built from the stored job spec."""
    return runtime_from_spec(runtime_spec, runtime_id_for(rollout), settings.runtime_root)
