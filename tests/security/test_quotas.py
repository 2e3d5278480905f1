"""Quotas against a real API process: per request (422), in flight (429), tokens per rollout (422),
each from Settings, per tenant and per key, and nothing created by a refused submission.

The live API's limits (see conftest and security_support.TENANT_QUOTAS): every tenant may ask for
500 rollouts per request; `quota-q` for 6 per request, 10 in flight and sampling.max_tokens <= 256;
`quota-race` for 10 in flight.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from security_support import SETTINGS_MAX_ROLLOUTS_PER_REQUEST, LiveApi, make_key
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import QuotaLimits
from polar_mq.infra.tls import client_ssl_context
from polar_mq.models import Job, JobTask, Rollout
from polar_mq.tenants.quotas import rollouts_in_flight

pytestmark = pytest.mark.e2e


def job(n_tasks: int, samples: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "tasks": [{"instruction": f"task {i}"} for i in range(n_tasks)],
        "samples_per_task": samples,
        **extra,
    }


@pytest.fixture(scope="module")
def http(live_api: LiveApi) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_api.base, timeout=30, verify=client_ssl_context()) as client:
        yield client


class Tenant:
    """A tenant of its own for one test (limits from TENANT_QUOTAS when its name is there)."""

    def __init__(
        self,
        http: httpx.Client,
        factory: sessionmaker[Session],
        name: str,
        quota: QuotaLimits | None = None,
    ) -> None:
        self.http, self.factory, self.name = http, factory, name
        scopes = "jobs:read,jobs:write"
        key = make_key(
            factory, f"{name}-{uuid.uuid4().hex[:6]}", name, scopes, quota or QuotaLimits()
        )
        self.headers = {"Authorization": f"Bearer {key}"}

    def submit(self, body: dict[str, Any]) -> httpx.Response:
        return self.http.post("/v1/jobs", json=body, headers=self.headers)

    def rows(self) -> tuple[int, int, int]:
        """(jobs, tasks, rollouts) of this tenant."""
        with self.factory() as session:
            jobs = select(Job.id).where(Job.tenant == self.name)
            return (
                session.scalar(select(func.count()).select_from(jobs.subquery())) or 0,
                session.scalar(select(func.count()).where(JobTask.job_id.in_(jobs))) or 0,
                session.scalar(select(func.count()).where(Rollout.job_id.in_(jobs))) or 0,
            )

    def in_flight(self) -> int:
        with self.factory() as session:
            return rollouts_in_flight(session, self.name)


def refused(response: httpx.Response, status: int, limit: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == "quota_exceeded"
    assert limit in error["message"], error["message"]
    return str(error["message"])


def _fresh(base: str) -> str:
    return f"{base}-{uuid.uuid4().hex[:6]}"


def test_max_rollouts_per_request_from_settings(
    http: httpx.Client, factory: sessionmaker[Session]
) -> None:
    tenant = Tenant(http, factory, _fresh("plain"))
    limit = SETTINGS_MAX_ROLLOUTS_PER_REQUEST
    message = refused(tenant.submit(job(1, limit + 1)), 422, "max_rollouts_per_request")
    assert f"= {limit}" in message and f"{limit + 1} rollouts" in message
    assert tenant.rows() == (0, 0, 0)
    assert tenant.submit(job(1, limit)).status_code == 201


def test_max_rollouts_per_request_per_tenant_and_per_key(
    http: httpx.Client, factory: sessionmaker[Session]
) -> None:
    q = Tenant(http, factory, "quota-q")
    before = q.rows()
    refused(q.submit(job(7)), 422, "max_rollouts_per_request = 6")
    refused(q.submit(job(4, 2)), 422, "max_rollouts_per_request = 6")
    assert q.rows() == before
    narrow = Tenant(http, factory, "quota-q", QuotaLimits(max_rollouts_per_request=2))
    refused(narrow.submit(job(3)), 422, "max_rollouts_per_request = 2")
    assert q.rows() == before


def test_max_rollouts_in_flight(http: httpx.Client, factory: sessionmaker[Session]) -> None:
    name = _fresh("flight")
    tenant = Tenant(http, factory, name, QuotaLimits(max_rollouts_in_flight=10))
    first = tenant.submit(job(3, 2))
    assert first.status_code == 201
    rows = tenant.rows()
    response = tenant.submit(job(5))
    message = refused(response, 429, "max_rollouts_in_flight = 10")
    assert "has 6 rollouts queued or running" in message
    assert response.headers["retry-after"]
    assert tenant.rows() == rows
    # one request that could never fit is a 422, not a retry-later
    refused(tenant.submit(job(11)), 422, "max_rollouts_in_flight = 10")
    assert tenant.submit(job(4)).status_code == 201
    assert tenant.in_flight() == 10
    refused(tenant.submit(job(1)), 429, "max_rollouts_in_flight")
    # other tenants are not affected by this one's queue
    assert Tenant(http, factory, _fresh("bystander")).submit(job(1)).status_code == 201
    # terminal rollouts free the room
    cancelled = http.post(f"/v1/jobs/{first.json()['job_id']}/cancel", headers=tenant.headers)
    assert cancelled.status_code == 200
    assert tenant.in_flight() == 4
    assert tenant.submit(job(6)).status_code == 201


def test_an_idempotent_resubmission_is_never_refused(
    http: httpx.Client, factory: sessionmaker[Session]
) -> None:
    tenant = Tenant(http, factory, _fresh("idem"), QuotaLimits(max_rollouts_in_flight=4))
    body = job(4, idempotency_key="step-1")
    first = tenant.submit(body)
    assert first.status_code == 201
    again = tenant.submit(body)  # the tenant is at its limit, but nothing new is created
    assert again.status_code == 200 and again.json()["job_id"] == first.json()["job_id"]
    refused(tenant.submit(job(4, idempotency_key="step-2")), 429, "max_rollouts_in_flight")


def test_concurrent_submissions_never_exceed_in_flight(
    http: httpx.Client, factory: sessionmaker[Session], live_api: LiveApi
) -> None:
    tenant = Tenant(http, factory, "quota-race")
    statuses: list[int] = []
    lock = threading.Lock()

    def submit() -> None:
        with httpx.Client(base_url=live_api.base, timeout=30, verify=client_ssl_context()) as own:
            status = own.post("/v1/jobs", json=job(3), headers=tenant.headers).status_code
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [201] * 3 + [429] * 5, statuses
    assert tenant.in_flight() == 9
    assert tenant.rows() == (3, 9, 9)


def test_max_tokens_per_rollout(http: httpx.Client, factory: sessionmaker[Session]) -> None:
    q = Tenant(http, factory, "quota-q")
    before = q.rows()
    refused(q.submit(job(1, sampling={"max_tokens": 257})), 422, "max_tokens_per_rollout = 256")
    # a budget the proxy would not enforce is no budget
    unenforced = job(1, sampling={"max_tokens": 64, "enforce": {"max_tokens": "off"}})
    refused(q.submit(unenforced), 422, "max_tokens_per_rollout = 256")
    # the whole rollout's budget is bounded by the same quota
    over = {**job(1), "max_tokens_per_rollout": 257}
    refused(q.submit(over), 422, "max_tokens_per_rollout = 257 is over the tenant's")
    assert q.rows() == before
    # a job without a budget gets the limit; a smaller one is kept
    filled = q.submit(job(1))
    kept = q.submit(job(1, sampling={"max_tokens": 32, "temperature": 0.5}))
    assert filled.status_code == kept.status_code == 201
    spec = http.get(f"/v1/jobs/{filled.json()['job_id']}", headers=q.headers).json()["spec"]
    assert spec["sampling"] == {"max_tokens": 256}
    assert spec["max_tokens_per_rollout"] == 256
    spec = http.get(f"/v1/jobs/{kept.json()['job_id']}", headers=q.headers).json()["spec"]
    assert spec["sampling"] == {"max_tokens": 32, "temperature": 0.5}
    smaller = q.submit({**job(1), "max_tokens_per_rollout": 100})
    assert smaller.status_code == 201, smaller.text
    spec = http.get(f"/v1/jobs/{smaller.json()['job_id']}", headers=q.headers).json()["spec"]
    assert spec["max_tokens_per_rollout"] == 100
    # a key can raise its tenant's limit
    wide = Tenant(http, factory, "quota-q", QuotaLimits(max_tokens_per_rollout=1024))
    assert wide.submit(job(1, sampling={"max_tokens": 1000})).status_code == 201
