"""The `polar-mq` CLI as an operator uses it: submit, wait, status, keys, against real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.devstack import LocalStack
from polar_mq.models import ApiKey

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def polar_mq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polar_mq.cli", *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_submit_wait_and_status(fake_stack: LocalStack) -> None:
    url = f"http://{fake_stack.settings.api_host}:{fake_stack.settings.api_port}"
    done = polar_mq("submit", str(REPO / "examples/arithmetic.json"), "--samples", "2", "--wait",
                    "--url", url)  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split()[1].rstrip(":")
    status = json.loads(polar_mq("status", job_id, "--url", url).stdout)
    assert status["state"] == "completed"
    assert status["by_status"] == {"completed": 6}
    assert status["mean_reward"] == 1.0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"tasks": [{"answer": "1"}]}', "instruction"),
        ('{"tasks": [{"instruction": "x"}], "samples_per_task": 0}', "samples_per_task"),
        ('{"tasks": [{"instruction": "x"}], "harness": {"type": "nope"}}', "unknown harness"),
    ],
)
def test_submit_bad_file_is_a_clear_message(
    fake_stack: LocalStack, tmp_path: Path, content: str, message: str
) -> None:
    url = f"http://{fake_stack.settings.api_host}:{fake_stack.settings.api_port}"
    path = tmp_path / "job.json"
    path.write_text(content)
    done = polar_mq("submit", str(path), "--url", url)
    assert done.returncode != 0
    assert message in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_keys_create_stores_only_a_hash(
    pg_url: str, db_session_factory: sessionmaker[Session]
) -> None:
    done = polar_mq("keys", "create", "trainer", env={"POLAR_MQ_DATABASE_URL": pg_url})
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    assert len(key) >= 32
    with db_session_factory() as session:
        rows = session.scalars(select(ApiKey)).all()
    assert [r.name for r in rows] == ["trainer"]
    assert key not in rows[0].key_hash


def test_api_refuses_public_bind_without_keys(
    pg_url: str, db_session_factory: sessionmaker[Session]
) -> None:
    with db_session_factory.begin() as session:
        session.execute(delete(ApiKey))
    done = polar_mq("api", "--host", "0.0.0.0", env={"POLAR_MQ_DATABASE_URL": pg_url})
    assert done.returncode == 1
    assert "refusing to listen on 0.0.0.0 without API keys" in done.stdout
