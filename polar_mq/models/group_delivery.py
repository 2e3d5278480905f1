"""Group deliveries: which complete group was handed to which trainer, until when, and whether the
trainer acknowledged it.

One row per (job, task) group, written the first time the group is leased and updated in place on
each redelivery. A lease is claimed with a single `INSERT ... ON CONFLICT DO UPDATE ... WHERE lease
expired and not acked`, so the row lock PostgreSQL takes on conflict is what keeps two consumers
from ever holding the same group (see `polar_mq.jobs.deliveries`). The table grows with the number
of groups, never with polls or heartbeats: a long-poll that finds nothing writes nothing.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from polar_mq.models.base import Base


class GroupDelivery(Base):
    __tablename__ = "group_deliveries"

    job_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    task_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    consumer: Mapped[str] = mapped_column(String(200))
    """The consumer holding (or, once acked, the one that acknowledged) the current delivery."""
    delivery_count: Mapped[int] = mapped_column(Integer, default=1)
    """1 for the first hand-out, +1 each time an expired lease is handed out again."""
    leased_at: Mapped[datetime]
    lease_expires_at: Mapped[datetime]
    acked_at: Mapped[datetime | None]
    """Set once; an acknowledged group is never handed out again."""
