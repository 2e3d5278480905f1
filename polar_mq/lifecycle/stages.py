"""The stages of a rollout and the rollout states each one moves between.

Every stage has a ready state (its message may be waiting), a busy state (a worker holds the
rollout under a lease) and a done state (the next stage's ready state, or `completed`). Everything
that reads or writes a rollout's position in the pipeline derives it from `STAGE_STATES`.
"""

from __future__ import annotations

from enum import StrEnum

from polar_mq.models import RolloutStatus


class Stage(StrEnum):
    PREPARE = "prepare"
    RUN_AGENT = "run_agent"
    BUILD = "build"
    EVALUATE = "evaluate"

    @property
    def task_name(self) -> str:
        return f"polar_mq.{self.value}"

    @property
    def node_local(self) -> bool:
        """Whether the stage touches the runtime, which lives on one node: its messages go to
        that node's queue (`messages.queue_name`), the others' to the pool's."""
        return self in (Stage.RUN_AGENT, Stage.EVALUATE)


NEXT_STAGE: dict[Stage, Stage | None] = {
    Stage.PREPARE: Stage.RUN_AGENT,
    Stage.RUN_AGENT: Stage.BUILD,
    Stage.BUILD: Stage.EVALUATE,
    Stage.EVALUATE: None,
}

S = RolloutStatus
STAGE_STATES: dict[Stage, tuple[str, str, str]] = {
    Stage.PREPARE: (S.QUEUED, S.PREPARING, S.PREPARED),
    Stage.RUN_AGENT: (S.PREPARED, S.RUNNING, S.RAN),
    Stage.BUILD: (S.RAN, S.BUILDING, S.BUILT),
    Stage.EVALUATE: (S.BUILT, S.EVALUATING, S.COMPLETED),
}
"""Stage → (ready, busy, done) rollout status."""

STAGE_OF_STATUS: dict[str, tuple[str, str]] = {}
"""Non-terminal rollout status → (stage, "queued" | "running")."""
for _stage, (_ready, _busy, _) in STAGE_STATES.items():
    STAGE_OF_STATUS[_ready] = (_stage.value, "queued")
    STAGE_OF_STATUS[_busy] = (_stage.value, "running")

BUSY: dict[str, Stage] = {busy: stage for stage, (_, busy, _) in STAGE_STATES.items()}
"""Busy status → its stage (a worker holds the rollout under a lease)."""
READY: dict[str, Stage] = {ready: stage for stage, (ready, _, _) in STAGE_STATES.items()}
"""Ready status → its stage (the stage's message is, or should be, waiting in its queue)."""
