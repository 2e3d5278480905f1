"""Submitting jobs: the one code path shared by the REST API and in-cluster Python callers.

`submit_job` runs inside a caller's unit of work and adds what `create_job` leaves to its callers:
a resubmission with the same idempotency key but a different body is refused (it is almost always a
reused key, and silently returning the old job would hand a trainer the wrong rollouts), and two
concurrent submissions racing on one key both get the single job that won.

`enqueue_job` is the low-level path for code running next to the database and broker (a trainer
inside the cluster, the CLI): it writes the job and publishes its messages directly, no HTTP.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from functools import partial
from types import TracebackType
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.infra.db import create_db_engine, make_session_factory, unit_of_work
from polar_mq.infra.errors import PolarError
from polar_mq.jobs.queries import same_submission
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import SubmittedJob, create_job
from polar_mq.lifecycle.outbox import Publisher, attach_publisher
from polar_mq.tenants.floors import floor_of, with_floor
from polar_mq.tenants.quotas import Owner, tenant_quota, with_token_limit
from polar_mq.tenants.scopes import ADMIN_TENANT


class IdempotencyConflict(PolarError):
    """The idempotency key already names a job with a different body (the API answers 409)."""

    status = 409
    type = "idempotency_conflict"

    def __init__(self, key: str, job_id: uuid.UUID) -> None:
        super().__init__(
            f"idempotency_key {key!r} already names job {job_id} with a different body; "
            "use a new key for a new job"
        )
        self.job_id = job_id


class UnstorableValue(PolarError, ValueError):
    """A value JSON allows but the database cannot store (the API answers 422)."""

    status = 422
    type = "validation_error"

    def __init__(self, path: str, problem: str) -> None:
        message = f"{path}: {problem}" if path else problem
        super().__init__(message, details=[{"path": path, "message": problem}])
        self.path = path
        self.problem = problem


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _check_storable(value: Any, path: str) -> None:
    """Refuse NaN/Infinity, NUL characters, lone surrogates and integers past 64 bits anywhere in
    a submitted value.

    Python's JSON parser accepts all four, PostgreSQL rejects the first three (JSONB has no NaN,
    text has no NUL, UTF-8 has no surrogates); caught here they are a 422 naming the field, not a
    failed INSERT. JSONB stores a 100-digit integer, but every reader (orjson in the API's
    answers, trainers in other languages) stops at 64 bits: stored, it made `GET /v1/jobs` a 500.
    """
    if isinstance(value, str):
        if "\x00" in value:
            raise UnstorableValue(path, "NUL characters (\\u0000) cannot be stored")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise UnstorableValue(path, "lone UTF-16 surrogates cannot be stored") from None
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise UnstorableValue(path, "NaN and infinite numbers cannot be stored")
        if abs(value) > INT64_MAX:  # JSONB prints 1e300 as 301 digits: read back, an int
            raise UnstorableValue(path, "numbers must be smaller than 2**63 in magnitude")
    elif isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
        raise UnstorableValue(path, "integers must fit in 64 bits (signed)")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_storable(key, path)
            _check_storable(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_storable(item, f"{path}.{i}")
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            _check_storable(getattr(value, name), f"{path}.{name}" if path else name)


def submit_job(
    session: Session, spec: JobCreate, default_pool: str, owner: Owner | None = None
) -> SubmittedJob:
    """Create the job (or find it by idempotency key) inside the caller's transaction.

    `owner`: tenant, quota and isolation floor (default: the `admin` tenant without limits). A
    job without `sampling.max_tokens` gets the owner's max_tokens_per_rollout, if any, and one
    without runtime limits the floor's defaults. Raises QuotaExceeded, FloorViolation,
    IdempotencyConflict or UnstorableValue with nothing written.
    """
    owner = owner or Owner()
    spec = with_token_limit(spec, owner.quota.max_tokens_per_rollout)
    spec = with_floor(spec, owner.floor, spec.job_spec(default_pool).runtime.network)
    _check_storable(spec, "")
    try:
        submitted = create_job(session, spec, default_pool, owner)
    except IntegrityError:
        if spec.idempotency_key is None:
            raise
        # A concurrent request inserted the same key first; its job is the answer.
        session.rollback()
        submitted = create_job(session, spec, default_pool, owner)
    if not submitted.created:
        assert spec.idempotency_key is not None
        if not same_submission(session, submitted.job_id, spec, spec.pool or default_pool):
            raise IdempotencyConflict(spec.idempotency_key, submitted.job_id)
    return submitted


class Enqueuer:
    """Reusable database engine + broker publisher for submitting many jobs from one process."""

    def __init__(
        self,
        settings: Settings,
        *,
        session_factory: sessionmaker[Session] | None = None,
        publisher: Publisher | None = None,
        tenant: str = ADMIN_TENANT,
    ) -> None:
        """A given `session_factory` must have a publisher attached already, or get `publisher`.

        Jobs belong to `tenant` and count against its quota from Settings; a tenant other than
        `admin` is bound by the isolation floor like an API key without the admin scope.
        """
        self.settings = settings
        floor = floor_of(settings, bound=tenant != ADMIN_TENANT)
        self.owner = Owner(tenant, tenant_quota(settings, tenant), floor)
        self._engine: Engine | None = None
        self._celery: Any = None
        if session_factory is None:
            self._engine = create_db_engine(settings.database_url)
            session_factory = make_session_factory(self._engine)
            if publisher is None:
                publisher = self._celery_publisher()
        if publisher is not None:
            attach_publisher(session_factory, publisher)
        self.session_factory = session_factory

    def _celery_publisher(self) -> Publisher:
        from polar_mq.dispatch.celery_app import create_celery, publish_messages

        self._celery = create_celery(self.settings)
        return partial(publish_messages, self._celery)

    def enqueue(self, spec: JobCreate | Mapping[str, Any]) -> SubmittedJob:
        """Validate, write and publish one job; raises pydantic.ValidationError on a bad spec."""
        job = spec if isinstance(spec, JobCreate) else JobCreate.model_validate(spec)
        with unit_of_work(self.session_factory) as session:
            return submit_job(session, job, self.settings.pool, self.owner)

    def close(self) -> None:
        if self._celery is not None:
            self._celery.close()
        if self._engine is not None:
            self._engine.dispose()

    def __enter__(self) -> Enqueuer:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def enqueue_job(
    settings: Settings, spec: JobCreate | Mapping[str, Any], *, publisher: Publisher | None = None
) -> SubmittedJob:
    """Submit one job straight to the database and broker (opens and closes its own connections)."""
    with Enqueuer(settings, publisher=publisher) as enqueuer:
        return enqueuer.enqueue(spec)
