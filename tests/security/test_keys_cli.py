"""`polar-mq keys create | list | revoke` as an operator runs them, against the real API process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import httpx
import pytest
from security_support import JOB, LiveApi
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import ApiKey, Job

pytestmark = pytest.mark.e2e


def keys(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "POLAR_MQ_DATABASE_URL": url}
    return subprocess.run(
        [sys.executable, "-m", "polar_mq.cli", "keys", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def listed(url: str, *extra: str) -> dict[str, dict[str, Any]]:
    done = keys(url, "list", "--json", *extra)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    return {row["name"]: row for row in rows}


def test_create_list_use_and_revoke(
    security_db_url: str, live_api: LiveApi, factory: sessionmaker[Session]
) -> None:
    url = security_db_url
    done = keys(url, "create", "cli-trainer", "--tenant", "cli-team",
                "--scopes", "jobs:write,jobs:read", "--max-rollouts-in-flight", "50")  # fmt: skip
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    assert key.startswith("pmq_") and len(key.splitlines()) == 1  # stdout is the key alone
    reader = keys(url, "create", "cli-reader", "--tenant", "cli-team", "--scopes", "jobs:read")
    assert reader.returncode == 0, reader.stderr

    rows = listed(url)
    assert rows["cli-trainer"]["tenant"] == "cli-team"
    assert rows["cli-trainer"]["scopes"] == ["jobs:read", "jobs:write"]
    assert rows["cli-trainer"]["quota"] == {"max_rollouts_in_flight": 50}
    assert rows["cli-reader"]["scopes"] == ["jobs:read"]
    table = keys(url, "list")
    assert table.returncode == 0 and "cli-trainer" in table.stdout
    assert key not in table.stdout and key not in json.dumps(rows)  # only hashes are stored

    with httpx.Client(base_url=live_api.base, timeout=30) as http:
        headers = {"Authorization": f"Bearer {key}"}
        submitted = http.post("/v1/jobs", json=JOB, headers=headers)
        assert submitted.status_code == 201, submitted.text
        with factory() as session:
            tenant = session.scalar(select(Job.tenant).where(Job.id == submitted.json()["job_id"]))
        assert tenant == "cli-team"
        read_only = {"Authorization": f"Bearer {reader.stdout.strip()}"}
        assert http.post("/v1/jobs", json=JOB, headers=read_only).status_code == 403

        revoked = keys(url, "revoke", str(rows["cli-trainer"]["id"]))  # by id
        assert revoked.returncode == 0, revoked.stderr
        assert http.get("/v1/jobs", headers=headers).status_code == 401
        assert keys(url, "revoke", "cli-reader").returncode == 0  # by name
        assert http.get("/v1/jobs", headers=read_only).status_code == 401

    assert {"cli-trainer", "cli-reader"}.isdisjoint(listed(url))
    assert listed(url, "--all")["cli-trainer"]["revoked_at"] is not None
    again = keys(url, "revoke", "cli-reader")
    assert again.returncode == 1 and "no active key" in again.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tenant", "t", "--scopes", "jobs:read,root"], "unknown scope 'root'"),
        (["--tenant", "t", "--scopes", ","], "at least one scope"),
        (["--tenant", "bad tenant", "--scopes", "jobs:read"], "invalid tenant"),
        (["--scopes", "jobs:read"], "--tenant"),
        (["--tenant", "t"], "--scopes"),
        (
            ["--tenant", "t", "--scopes", "jobs:read", "--max-rollouts-in-flight", "0"],
            "max-rollouts-in-flight",
        ),
    ],
)
def test_bad_create_is_a_clear_message(
    security_db_url: str, factory: sessionmaker[Session], args: list[str], message: str
) -> None:
    with factory() as session:
        before = session.scalars(select(ApiKey.id)).all()
    done = keys(security_db_url, "create", "bad", *args)
    assert done.returncode == 2
    assert message in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    with factory() as session:
        assert session.scalars(select(ApiKey.id)).all() == before
