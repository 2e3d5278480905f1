"""Queue names and stage messages: the routing of SPEC §3.

prepare is taken from a pool-wide queue by whichever node has room; run agent and evaluate touch the
runtime, which lives on one node, so they go to that node's own queues; build only reads the
database and runs anywhere.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from polar_mq.lifecycle.priority import DEFAULT_PRIORITY
from polar_mq.lifecycle.stages import Stage


@dataclass(frozen=True, slots=True)
class StageMessage:
    """What goes on the broker: a stage, a rollout id and where it must run. Never a payload."""

    stage: Stage
    rollout_id: uuid.UUID
    pool: str
    node: str | None = None
    attempt: int | None = None
    """The rollout attempt the message is for: a stale message of an earlier attempt is a no-op."""
    retries: int = 0
    """In-place retries of this stage so far (bounded by the job's `retries.stage_retries`)."""
    countdown: float | None = None
    """Seconds to wait before the stage runs (retry backoff)."""
    priority: int = DEFAULT_PRIORITY
    """The job's priority, 0..9, higher served sooner (workers.priority maps it per broker).
    Every message built for a rollout must carry it, or the rollout falls back to the lowest."""


def queue_name(prefix: str, stage: Stage, pool: str, node: str | None) -> str:
    """The pool's queue of a stage, or the node's for one that touches the runtime
    (`Stage.node_local`)."""
    if not stage.node_local:
        return f"{prefix}.{stage.value}.{pool}"
    if node is None:
        raise ValueError(f"stage {stage} runs on the node holding the runtime; node is required")
    return f"{prefix}.{stage.value}.{node}"
