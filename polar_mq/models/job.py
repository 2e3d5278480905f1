"""Jobs and their tasks: what a trainer submitted."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from polar_mq.models.base import Base, JsonDoc, utcnow


class Job(Base):
    """One submission: tasks x samples_per_task, with the specs every rollout of it follows."""

    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("tenant", "idempotency_key", name="uq_jobs_tenant_idempotency_key"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    tenant: Mapped[str] = mapped_column(
        String(64), default="admin", server_default="admin", index=True
    )
    """Whose job it is: the tenant of the API key that submitted it (`admin` without keys)."""
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    """Unique per tenant: two tenants using the same key get two jobs and never see each other's."""
    status: Mapped[str] = mapped_column(String(20), default="active")
    samples_per_task: Mapped[int] = mapped_column(Integer)
    n_tasks: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any]] = mapped_column(JsonDoc)
    """harness, runtime, evaluator, builder, sampling, timeouts (the validated JobSpec)."""
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JsonDoc, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    cancelled_at: Mapped[datetime | None]


class JobTask(Base):
    """One task instance of a job; kept apart from the job so a stage loads only its own task."""

    __tablename__ = "job_tasks"
    __table_args__ = (UniqueConstraint("job_id", "task_index"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    task_index: Mapped[int] = mapped_column(Integer)
    instance: Mapped[dict[str, Any]] = mapped_column(JsonDoc)
