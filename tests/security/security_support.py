"""The access matrix and the helpers of the security tests.

`MATRIX` is the specification: for every `/v1` route of the API, the scope it needs and what it
names (a job, a rollout, or nothing), plus one valid request. `test_access_matrix.py` checks that
the API's routes and the matrix are the same set (a new route without a rule fails), then calls
every route as every principal on a job of its own tenant, of another tenant and a missing one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import UNLIMITED, QuotaLimits
from polar_mq.infra.db import unit_of_work
from polar_mq.infra.processes import ManagedProcess
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.models import GroupDelivery, Job, Rollout
from polar_mq.models.artifact import RolloutArtifact
from polar_mq.models.policy import PolicyState
from polar_mq.tenants.keys import create_api_key
from polar_mq.tenants.quotas import Owner

JOBS_READ, JOBS_WRITE, POLICY_WRITE, ADMIN = "jobs:read", "jobs:write", "policy:write", "admin"
HOME, OTHER = "team-a", "team-b"
"""Every scoped principal of the matrix belongs to HOME (admins to a third tenant, `ops`)."""

TENANT_QUOTAS: dict[str, dict[str, int]] = {
    "quota-q": {
        "max_rollouts_per_request": 6,
        "max_rollouts_in_flight": 10,
        "max_tokens_per_rollout": 256,
    },
    "quota-race": {"max_rollouts_in_flight": 10},
}
"""`POLAR_MQ_TENANT_QUOTAS` of the live API."""

SETTINGS_MAX_ROLLOUTS_PER_REQUEST = 500
"""`POLAR_MQ_QUOTA_MAX_ROLLOUTS_PER_REQUEST` of the live API: tenants without an override get it."""

JOB = {"tasks": [{"instruction": "say hi"}, {"instruction": "say bye"}], "samples_per_task": 2}


@dataclass(frozen=True)
class LiveApi:
    base: str
    process: ManagedProcess
    log_dir: Path


def make_key(
    factory: sessionmaker[Session],
    name: str,
    tenant: str,
    scopes: str,
    quota: QuotaLimits = UNLIMITED,
) -> str:
    with unit_of_work(factory) as session:
        return create_api_key(session, name, tenant=tenant, scopes=scopes, quota=quota)


def make_job(factory: sessionmaker[Session], tenant: str) -> tuple[uuid.UUID, uuid.UUID]:
    """(job id, first rollout id) of a new 2x2 job of `tenant`, written by the job service; the
    first rollout has an `agent.log` artifact."""
    with unit_of_work(factory) as session:
        job = create_job(session, JobCreate.model_validate(JOB), "security", Owner(tenant))
        session.add(
            RolloutArtifact(rollout_id=job.rollout_ids[0], name="agent.log", size=2, content=b"hi")
        )
    return job.job_id, job.rollout_ids[0]


# --------------------------------------------------------------------------------------------
# The matrix


@dataclass(frozen=True)
class Target:
    """What a request is about: a job and one of its rollouts (ids that may not exist)."""

    job_id: uuid.UUID
    rollout_id: uuid.UUID


@dataclass(frozen=True)
class Rule:
    scope: str
    names: Literal["job", "rollout"] | None
    """What the path names: its owner must be the caller's tenant (404 otherwise)."""
    ok: int
    """The status of an allowed request."""
    body: dict[str, Any] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    path_args: dict[str, str] = field(default_factory=dict)
    """Values of the path's other parameters."""


CONSUMER = {"consumer": "trainer-1"}
MATRIX: dict[tuple[str, str], Rule] = {
    ("POST", "/v1/jobs"): Rule(JOBS_WRITE, None, 201, body=JOB),
    ("GET", "/v1/jobs"): Rule(JOBS_READ, None, 200),
    ("GET", "/v1/jobs/{job_id}"): Rule(JOBS_READ, "job", 200),
    ("GET", "/v1/jobs/{job_id}/results"): Rule(JOBS_READ, "job", 200),
    ("POST", "/v1/jobs/{job_id}/cancel"): Rule(JOBS_WRITE, "job", 200),
    ("POST", "/v1/jobs/{job_id}/groups/lease"): Rule(JOBS_READ, "job", 200, body=CONSUMER),
    ("POST", "/v1/jobs/{job_id}/groups/ack"): Rule(
        JOBS_READ, "job", 200, body={**CONSUMER, "delivery_ids": []}
    ),
    ("POST", "/v1/jobs/{job_id}/groups/extend"): Rule(
        JOBS_READ, "job", 200, body={**CONSUMER, "delivery_ids": []}
    ),
    ("GET", "/v1/jobs/{job_id}/groups/stream"): Rule(JOBS_READ, "job", 200, params=CONSUMER),
    ("GET", "/v1/rollouts/{rollout_id}"): Rule(JOBS_READ, "rollout", 200),
    ("GET", "/v1/rollouts/{rollout_id}/trajectory"): Rule(JOBS_READ, "rollout", 200),
    ("GET", "/v1/rollouts/{rollout_id}/calls"): Rule(JOBS_READ, "rollout", 200),
    ("GET", "/v1/rollouts/{rollout_id}/artifacts"): Rule(JOBS_READ, "rollout", 200),
    ("GET", "/v1/rollouts/{rollout_id}/artifacts/{name}"): Rule(
        JOBS_READ, "rollout", 200, path_args={"name": "agent.log"}
    ),
    ("POST", "/v1/rollouts/{rollout_id}/cancel"): Rule(JOBS_WRITE, "rollout", 200),
    ("GET", "/v1/policy"): Rule(POLICY_WRITE, None, 200),
    ("POST", "/v1/policy"): Rule(POLICY_WRITE, None, 200, body={"version": 0}),
    ("POST", "/v1/policy/resume"): Rule(POLICY_WRITE, None, 200),
}


@dataclass(frozen=True)
class Who:
    """A principal of the matrix: its key's tenant and scopes (None: a key that does not work)."""

    tenant: str | None
    scopes: frozenset[str]

    def can(self, scope: str) -> bool:
        return ADMIN in self.scopes or scope in self.scopes


PRINCIPALS: dict[str, Who] = {
    "no_key": Who(None, frozenset()),
    "wrong_key": Who(None, frozenset()),
    "revoked_key": Who(None, frozenset()),
    "reader": Who(HOME, frozenset({JOBS_READ})),
    "writer": Who(HOME, frozenset({JOBS_WRITE})),
    "policy": Who(HOME, frozenset({POLICY_WRITE})),
    "trainer": Who(HOME, frozenset({JOBS_READ, JOBS_WRITE, POLICY_WRITE})),
    "admin": Who("ops", frozenset({ADMIN})),
}


def expected_status(who: Who, rule: Rule, owner: str | None) -> int:
    """What `who` must get from a route with `rule` about a target of `owner` (None: missing)."""
    if who.tenant is None:
        return 401
    if not who.can(rule.scope):
        return 403
    if rule.names is not None and (
        owner is None or (owner != who.tenant and ADMIN not in who.scopes)
    ):
        return 404
    return rule.ok


def path_of(template: str, rule: Rule, target: Target) -> str:
    return template.format(job_id=target.job_id, rollout_id=target.rollout_id, **rule.path_args)


# --------------------------------------------------------------------------------------------
# Routes of an app, and what a refused request must not change


def v1_routes(app: FastAPI) -> set[tuple[str, str]]:
    """(method, path) of every route under /v1, HEAD and OPTIONS aside.

    Walks included routers too (FastAPI keeps them as `_IncludedRouter` entries whose effective
    candidates carry the full path), so a route cannot hide from the matrix in a sub-router.
    """
    found: set[tuple[str, str]] = set()
    for path, methods in _walk(app.routes):
        if path == "/v1" or path.startswith("/v1/"):
            found.update((m, path) for m in methods if m not in ("HEAD", "OPTIONS"))
    return found


def _walk(routes: Any) -> Iterator[tuple[str, set[str]]]:
    for route in routes:
        path, methods = getattr(route, "path", None), getattr(route, "methods", None)
        if isinstance(path, str):
            yield path, set(methods or ())
        candidates = getattr(route, "effective_candidates", None)
        if callable(candidates):
            yield from _walk(candidates())
        sub = getattr(getattr(route, "original_router", None), "routes", None)
        if sub is not None and not callable(candidates):
            yield from _walk(sub)


def snapshot(factory: sessionmaker[Session]) -> dict[str, Any]:
    """Everything a refused request could have changed: jobs, rollout states, leases, policy."""
    with factory() as session:
        return {
            "jobs": session.scalar(select(func.count()).select_from(Job)),
            "rollouts": sorted(
                (str(i), s) for i, s in session.execute(select(Rollout.id, Rollout.status))
            ),
            "deliveries": session.scalar(select(func.count()).select_from(GroupDelivery)),
            "policy": [
                (p.version, p.paused, p.updated_at) for p in session.scalars(select(PolicyState))
            ],
        }
