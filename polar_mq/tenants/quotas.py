"""Quotas: how much one tenant may put in the queue, checked when a job is created.

Three limits, each `None` for "no limit":

- `max_rollouts_per_request`: tasks x samples_per_task of one job (over it: 422, the request can
  never succeed as it is);
- `max_rollouts_in_flight`: rollouts of the tenant not yet terminal (held, queued or in any stage),
  counting the new job's (over it: 429, retry once some finish);
- `max_tokens_per_rollout`: the completion tokens one rollout attempt may generate over all its
  calls (the job's `max_tokens_per_rollout`, enforced by the proxy: `polar_mq.proxy.token_budget`)
  and so also any one call (`sampling.max_tokens`). At submit a job without them gets the limit;
  a larger value, or a per-call limit the proxy would not enforce (`enforce` off), is a 422.

Limits come from Settings (`quota_*` for every tenant, `tenant_quotas` per tenant) and can be
overridden per API key. The checks run inside the job's own transaction, after the idempotency
lookup (a resubmission of an existing job is never refused) and under a per-tenant advisory lock
on PostgreSQL, so two concurrent submissions cannot both squeeze under the in-flight limit: either
the job and all its rollouts are created, or nothing is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Self, TypeVar

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from polar_mq.capability.sampling import sampling_policy
from polar_mq.config import UNLIMITED, QuotaLimits, Settings
from polar_mq.infra.errors import PolarError
from polar_mq.models import Job, Rollout, RolloutStatus
from polar_mq.tenants.floors import OPEN_FLOOR, IsolationFloor
from polar_mq.tenants.scopes import ADMIN_TENANT

LOCK_NAMESPACE = 0x504D51
"""First key of the per-tenant advisory lock (`PMQ`), so it never meets another lock's keys."""
NOT_TERMINAL = [s for s in RolloutStatus.ALL if s not in RolloutStatus.TERMINAL]
QUOTA_EXCEEDED = "quota_exceeded"
RETRY_AFTER_S = "30"
"""What a 429 tells the client to wait before submitting again: some rollouts in flight will
have finished by then."""


class JobRequest(Protocol):
    """What the quota checks read of a submitted job (`jobs.schemas.JobCreate`): the tenants
    package sits below the jobs package, so it names the fields, not the class."""

    @property
    def tasks(self) -> Sequence[Any]: ...
    @property
    def samples_per_task(self) -> int: ...
    @property
    def sampling(self) -> Mapping[str, Any]: ...
    @property
    def max_tokens_per_rollout(self) -> int | None: ...
    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> Self: ...


Request = TypeVar("Request", bound=JobRequest)


@dataclass(frozen=True, slots=True)
class Owner:
    """Who a new job belongs to and the limits it is checked against."""

    tenant: str = ADMIN_TENANT
    quota: QuotaLimits = field(default=UNLIMITED)
    floor: IsolationFloor = field(default=OPEN_FLOOR)
    """The runtimes, networks and resource limits it may ask for (`tenants.floors`)."""


class QuotaExceeded(PolarError):
    """A job over one of its tenant's limits; `limit` names it, `status` is 422 (never
    acceptable) or 429 (over the in-flight limit now: retry after `Retry-After` seconds)."""

    type = QUOTA_EXCEEDED

    def __init__(self, status: int, limit: str, message: str) -> None:
        headers = {"Retry-After": RETRY_AFTER_S} if status == 429 else None
        super().__init__(message, status=status, headers=headers)
        self.limit = limit


def tenant_quota(settings: Settings, tenant: str, key: QuotaLimits | None = None) -> QuotaLimits:
    """The effective limits of a tenant: Settings defaults < `tenant_quotas[tenant]` < the key."""
    defaults = QuotaLimits(
        max_rollouts_per_request=settings.quota_max_rollouts_per_request,
        max_rollouts_in_flight=settings.quota_max_rollouts_in_flight,
        max_tokens_per_rollout=settings.quota_max_tokens_per_rollout,
    )
    return defaults.overridden_by(settings.tenant_quotas.get(tenant)).overridden_by(key)


def with_token_limit(spec: Request, limit: int | None) -> Request:
    """`spec` with `sampling.max_tokens` (per call) and `max_tokens_per_rollout` (the whole
    rollout's budget, `polar_mq.proxy.token_budget`) set to `limit` where it has none.

    Deterministic, so an idempotent resubmission compares equal to the stored job.
    """
    if limit is None:
        return spec
    update: dict[str, object] = {}
    if "max_tokens" not in spec.sampling:
        update["sampling"] = {**spec.sampling, "max_tokens": limit}
    if spec.max_tokens_per_rollout is None:
        update["max_tokens_per_rollout"] = limit
    return spec.model_copy(update=update) if update else spec


def check_quota(session: Session, owner: Owner, spec: JobRequest) -> None:
    """Raise QuotaExceeded when `spec` would take `owner` over a limit; call inside the job's
    transaction, right before inserting it (it takes the tenant's lock until the commit)."""
    quota, tenant = owner.quota, owner.tenant
    _check_tokens(spec, quota.max_tokens_per_rollout)
    asked = len(spec.tasks) * spec.samples_per_task
    per_request = quota.max_rollouts_per_request
    if per_request is not None and asked > per_request:
        raise QuotaExceeded(
            422,
            "max_rollouts_per_request",
            f"this job asks for {asked} rollouts (tasks x samples_per_task); tenant {tenant!r} "
            f"may ask for at most max_rollouts_per_request = {per_request} in one request",
        )
    in_flight_limit = quota.max_rollouts_in_flight
    if in_flight_limit is None:
        return
    if asked > in_flight_limit:
        raise QuotaExceeded(
            422,
            "max_rollouts_in_flight",
            f"this job asks for {asked} rollouts, more than tenant {tenant!r} may ever have "
            f"queued or running (max_rollouts_in_flight = {in_flight_limit})",
        )
    _lock_tenant(session, tenant)
    in_flight = rollouts_in_flight(session, tenant)
    if in_flight + asked > in_flight_limit:
        raise QuotaExceeded(
            429,
            "max_rollouts_in_flight",
            f"tenant {tenant!r} has {in_flight} rollouts queued or running and this job adds "
            f"{asked}: over max_rollouts_in_flight = {in_flight_limit}; retry when some finish",
        )


def rollouts_in_flight(session: Session, tenant: str) -> int:
    """Rollouts of `tenant` that are not terminal (held, queued, or in a stage)."""
    count = session.scalar(
        select(func.count())
        .select_from(Rollout)
        .join(Job, Job.id == Rollout.job_id)
        .where(Job.tenant == tenant, Rollout.status.in_(NOT_TERMINAL))
    )
    return int(count or 0)


def _check_tokens(spec: JobRequest, limit: int | None) -> None:
    if limit is None:
        return
    budget = spec.max_tokens_per_rollout
    if budget is not None and budget > limit:
        raise QuotaExceeded(
            422,
            "max_tokens_per_rollout",
            f"max_tokens_per_rollout = {budget} is over the tenant's max_tokens_per_rollout = "
            f"{limit}",
        )
    rule = sampling_policy(spec.sampling).get("max_tokens")
    if rule is None:
        raise QuotaExceeded(
            422,
            "max_tokens_per_rollout",
            "sampling.max_tokens must be enforced by the proxy (enforce clamp or override) "
            f"under max_tokens_per_rollout = {limit}",
        )
    if rule.value > limit:
        raise QuotaExceeded(
            422,
            "max_tokens_per_rollout",
            f"sampling.max_tokens = {rule.value} is over max_tokens_per_rollout = {limit}",
        )


def _lock_tenant(session: Session, tenant: str) -> None:
    """Serialize the in-flight check of one tenant's submissions until the transaction ends."""
    if session.get_bind().dialect.name != "postgresql":
        return  # the embedded SQLite setup has one writer at a time anyway
    session.execute(
        text("SELECT pg_advisory_xact_lock(:ns, hashtext(:tenant))"),
        {"ns": LOCK_NAMESPACE, "tenant": tenant},
    )
