"""The access matrix: every principal x every /v1 route x a job of its tenant, of another tenant,
and a missing one, against a real `polar-mq api` process.

A route missing from `MATRIX` (or a rule for a route that no longer exists) fails
`test_every_v1_route_has_an_access_rule`, so a new route cannot ship without an access rule. A
refused request must leave the database as it was; another tenant's job or rollout must be
answered exactly like one that does not exist.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from security_support import (
    HOME,
    JOB,
    MATRIX,
    OTHER,
    PRINCIPALS,
    LiveApi,
    Rule,
    Target,
    expected_status,
    make_job,
    make_key,
    path_of,
    snapshot,
    v1_routes,
)
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.infra.db import unit_of_work
from polar_mq.models import Job
from polar_mq.tenants.keys import revoke_api_key
from polar_mq.ui.app import create_app

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def keys(factory: sessionmaker[Session], live_api: LiveApi) -> dict[str, str | None]:
    """The bearer key of every principal of the matrix (None: no Authorization header)."""
    made: dict[str, str | None] = {"no_key": None, "wrong_key": "pmq_" + "x" * 43}
    revoked = make_key(factory, "matrix-revoked", HOME, "jobs:read,jobs:write,policy:write")
    with unit_of_work(factory) as session:
        assert revoke_api_key(session, "matrix-revoked") == 1
    made["revoked_key"] = revoked
    for name, who in PRINCIPALS.items():
        if who.tenant is not None:
            made[name] = make_key(factory, f"matrix-{name}", who.tenant, ",".join(who.scopes))
    return made


@pytest.fixture(scope="module")
def http(live_api: LiveApi) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_api.base, timeout=30) as client:
        yield client


def test_every_v1_route_has_an_access_rule(http: httpx.Client) -> None:
    in_app = v1_routes(create_app(Settings()))
    assert len(in_app) >= 18, f"the route walker found too few routes: {sorted(in_app)}"
    missing = sorted(in_app - MATRIX.keys())
    assert not missing, f"routes without an access rule in tests/security MATRIX: {missing}"
    stale = sorted(MATRIX.keys() - in_app)
    assert not stale, f"MATRIX rules for routes that no longer exist: {stale}"
    # the live process serves the same routes (seen through its OpenAPI document)
    served = {
        (method.upper(), path)
        for path, item in http.get("/openapi.json").json()["paths"].items()
        if path.startswith("/v1")
        for method in item
    }
    assert served == set(MATRIX)


def _call(
    http: httpx.Client, method: str, path: str, rule: Rule, key: str | None
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    request = http.build_request(method, path, json=rule.body, params=rule.params, headers=headers)
    response = http.send(request, stream=True)  # the group stream never ends by itself
    try:
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return response  # status and headers are all this test needs
        response.read()
        return response
    finally:
        response.close()


@pytest.mark.parametrize("principal", list(PRINCIPALS))
@pytest.mark.parametrize(("method", "template"), list(MATRIX), ids=lambda v: str(v))
def test_access(
    method: str,
    template: str,
    principal: str,
    keys: dict[str, str | None],
    http: httpx.Client,
    factory: sessionmaker[Session],
) -> None:
    rule, who = MATRIX[(method, template)], PRINCIPALS[principal]
    key = keys[principal]
    targets: list[tuple[str | None, Target]] = [(None, Target(uuid.uuid4(), uuid.uuid4()))]
    if rule.names is not None:
        for owner in (HOME, OTHER):
            targets.append((owner, Target(*make_job(factory, owner))))
    for owner, target in targets:
        path = path_of(template, rule, target)
        expected = expected_status(who, rule, owner)
        before = snapshot(factory)
        response = _call(http, method, path, rule, key)
        where = f"{principal} {method} {path} (owner {owner})"
        assert response.status_code == expected, f"{where}: {response.status_code} {response.text}"
        if expected == rule.ok:
            continue
        assert response.headers["content-type"].startswith("application/json"), where
        error = response.json()["error"]
        assert set(error) >= {"type", "message"}, where
        assert error["type"] == {401: "unauthorized", 403: "forbidden", 404: "not_found"}[expected]
        if expected == 404:  # another tenant's: word for word what a missing id gets
            kind = rule.names
            ident = target.job_id if kind == "job" else target.rollout_id
            assert error["message"] == f"{kind} {ident} not found", where
        if expected == 403:
            assert rule.scope in error["message"], where
        assert snapshot(factory) == before, f"{where}: a refused request changed the database"


def test_a_submitted_job_belongs_to_the_key_tenant_and_lists_show_only_it(
    keys: dict[str, str | None], http: httpx.Client, factory: sessionmaker[Session]
) -> None:
    def auth(name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {keys[name]}"}

    mine = http.post("/v1/jobs", json=JOB, headers=auth("trainer"))
    assert mine.status_code == 201, mine.text
    admins = http.post("/v1/jobs", json=JOB, headers=auth("admin"))
    theirs, _ = make_job(factory, OTHER)
    with factory() as session:
        tenants = dict(session.execute(select(Job.id, Job.tenant)).tuples().all())
    assert tenants[uuid.UUID(mine.json()["job_id"])] == HOME
    assert tenants[uuid.UUID(admins.json()["job_id"])] == "ops"

    def listed(name: str) -> set[uuid.UUID]:
        seen: set[uuid.UUID] = set()
        cursor = None
        while True:
            params = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
            page = http.get("/v1/jobs", params=params, headers=auth(name)).json()
            seen |= {uuid.UUID(j["job_id"]) for j in page["jobs"]}
            cursor = page["next_cursor"]
            if cursor is None:
                return seen

    assert listed("reader") == {j for j, t in tenants.items() if t == HOME}
    assert theirs not in listed("reader")
    assert listed("admin") == set(tenants)


def test_idempotency_keys_are_per_tenant(keys: dict[str, str | None], http: httpx.Client) -> None:
    """Another tenant reusing a key gets its own job: neither a 409 naming ours nor our job."""
    body = {**JOB, "idempotency_key": f"shared-{uuid.uuid4().hex[:8]}"}
    home = http.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {keys['trainer']}"})
    again = http.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {keys['trainer']}"})
    other = http.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {keys['admin']}"})
    assert (home.status_code, again.status_code, other.status_code) == (201, 200, 201)
    assert again.json()["job_id"] == home.json()["job_id"]
    assert other.json()["job_id"] != home.json()["job_id"]
