"""Rollouts: one sample of one task, walked through the four stages."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from polar_mq.models.base import Base, utcnow


class RolloutStatus:
    """The rollout state machine. Each stage moves `<ready>` → `<busy>` → `<next ready>`.

    Transitions are compare-and-set UPDATEs (`WHERE status = expected`), which is what makes a
    redelivered or duplicated stage message a no-op.
    """

    HELD = "held"
    """Created, but not admitted yet: the job's staleness capacity is full (no message sent)."""
    QUEUED = "queued"
    PREPARING = "preparing"
    PREPARED = "prepared"
    RUNNING = "running"
    RAN = "ran"
    BUILDING = "building"
    BUILT = "built"
    EVALUATING = "evaluating"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED})
    ALL = (
        HELD, QUEUED, PREPARING, PREPARED, RUNNING, RAN, BUILDING, BUILT, EVALUATING,
        COMPLETED, FAILED, CANCELLED,
    )  # fmt: skip


class TerminationReason:
    """Why a rollout ended. Agent outcomes are scored; infrastructure failures never are."""

    COMPLETED = "completed"
    AGENT_ERROR = "agent_error"
    TIMEOUT = "timeout"
    MAX_TURNS = "max_turns"
    TOKEN_BUDGET = "token_budget"
    """The agent spent the job's max_tokens_per_rollout; like max_turns, a truncated but usable
    trajectory, scored by the evaluator."""
    RUNTIME_ERROR = "runtime_error"
    BACKEND_ERROR = "backend_error"
    WORKER_LOST = "worker_lost"
    CANCELLED = "cancelled"
    STALE = "stale"
    """Cancelled because its tokens had become too old for the trainer (on_stale: drop)."""

    AGENT = frozenset({COMPLETED, AGENT_ERROR, TIMEOUT, MAX_TURNS, TOKEN_BUDGET})
    INFRASTRUCTURE = frozenset({RUNTIME_ERROR, BACKEND_ERROR, WORKER_LOST, CANCELLED, STALE})


class Rollout(Base):
    __tablename__ = "rollouts"
    __table_args__ = (
        Index("ix_rollouts_job_status", "job_id", "status"),
        Index("ix_rollouts_job_task", "job_id", "task_index", "sample_index"),
        Index("ix_rollouts_status_lease", "status", "lease_expires_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    task_id: Mapped[int] = mapped_column(ForeignKey("job_tasks.id", ondelete="CASCADE"))
    task_index: Mapped[int] = mapped_column(Integer)
    sample_index: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(20), default=RolloutStatus.QUEUED)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    node: Mapped[str | None] = mapped_column(String(200))
    runtime_id: Mapped[str | None] = mapped_column(String(100))
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None]
    termination_reason: Mapped[str | None] = mapped_column(String(30))
    agent_exit_code: Mapped[int | None] = mapped_column(Integer)
    reward: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    n_llm_calls: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    """When prepare first claimed it: the rollout's timeout clock starts here, not in the queue."""
    finished_at: Mapped[datetime | None]
