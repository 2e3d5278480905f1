"""Ownership checks: a job or rollout of another tenant is answered exactly like a missing one.

A 404 rather than a 403, with the same message as for an id that does not exist, so a key cannot
even learn that another tenant's job exists. `visible_tenant` None means every tenant (admin).
"""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from polar_mq.infra.errors import NotFound
from polar_mq.models import Job, Rollout


def authorize_job(session: Session, job_id: uuid.UUID, visible_tenant: str | None) -> None:
    """Raise NotFound unless the job exists and belongs to `visible_tenant` (None: any)."""
    tenant = session.scalar(select(Job.tenant).where(Job.id == job_id))
    if tenant is None or (visible_tenant is not None and tenant != visible_tenant):
        raise NotFound("job", job_id)


def authorize_rollout(session: Session, rollout_id: uuid.UUID, visible_tenant: str | None) -> None:
    """Raise NotFound unless the rollout exists and its job belongs to `visible_tenant`."""
    tenant = session.scalar(
        select(Job.tenant).join(Rollout, Rollout.job_id == Job.id).where(Rollout.id == rollout_id)
    )
    if tenant is None or (visible_tenant is not None and tenant != visible_tenant):
        raise NotFound("rollout", rollout_id)
