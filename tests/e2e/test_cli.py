"""The `polar-mq` CLI as an operator uses it: submit, wait, status, keys, against real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.ports import free_port
from polar_mq.jobs.failures import PLATFORM_STOP_AFTER
from polar_mq.models import ApiKey, Rollout, TrajectorySample
from polar_mq.stack.devstack import LocalStack, settings_env
from tests.e2e.stack import e2e_settings

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
GROUPS = 4  # tasks of the tasks-file job


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
    status = json.loads(polar_mq("status", job_id, "--json", "--url", url).stdout)
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
    done = polar_mq("keys", "create", "trainer", "--tenant", "team-a", "--scopes",
                    "jobs:write,jobs:read", env={"POLAR_MQ_DATABASE_URL": pg_url})  # fmt: skip
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    assert len(key) >= 32
    with db_session_factory() as session:
        rows = session.scalars(select(ApiKey)).all()
    assert [(r.name, r.tenant, r.scopes) for r in rows] == [
        ("trainer", "team-a", "jobs:read,jobs:write")
    ]
    assert key not in rows[0].key_hash


def test_api_refuses_public_bind_without_keys(
    pg_url: str, db_session_factory: sessionmaker[Session]
) -> None:
    with db_session_factory.begin() as session:
        session.execute(delete(ApiKey))
    done = polar_mq("api", "--host", "0.0.0.0", env={"POLAR_MQ_DATABASE_URL": pg_url})
    assert done.returncode == 1
    assert "refusing to listen on 0.0.0.0 without API keys" in done.stdout


def test_submit_tasks_file_then_export_both_formats(
    fake_stack: LocalStack, db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    import datasets

    url = f"http://{fake_stack.settings.api_host}:{fake_stack.settings.api_port}"
    # The shipped tasks file's first lines: every line of it is checked to make a valid job in
    # tests/jobs/test_tasks_file.py; running all 20 tasks here cost 40 agent runs (~50 CPU-s).
    tasks_file = tmp_path / "math_small.jsonl"
    lines = (REPO / "examples/tasks/math_small.jsonl").read_text().splitlines(keepends=True)
    tasks_file.write_text("".join(lines[:GROUPS]))
    done = polar_mq("submit", str(tasks_file), "--samples", "2", "--max-tokens", "64", "--wait",
                    "--url", url)  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split()[1].rstrip(":")
    status = json.loads(polar_mq("status", job_id, "--json", "--url", url).stdout)
    assert status["total"] == 2 * GROUPS and status["state"] == "completed"
    assert status["spec"]["evaluator"] == "exact_match"  # every task has an answer
    assert status["spec"]["sampling"] == {"max_tokens": 64}

    with db_session_factory() as session:
        stored = {
            (str(s.rollout_id), s.sample_index): s
            for s in session.scalars(
                select(TrajectorySample)
                .join(Rollout, Rollout.id == TrajectorySample.rollout_id)
                .where(Rollout.job_id == uuid.UUID(job_id))
            )
        }
    assert stored
    jsonl, parquet = tmp_path / "out.jsonl", tmp_path / "out.parquet"
    exported = polar_mq("export", job_id, "--out", str(jsonl), "--advantages", "grpo",
                        "--url", url)  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    assert f"{len(stored)} samples of {GROUPS} groups" in exported.stdout
    exported = polar_mq("export", job_id, "--format", "parquet", "--out", str(parquet),
                        "--url", url)  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    for kind, path in (("json", jsonl), ("parquet", parquet)):
        rows = datasets.load_dataset(kind, data_files=str(path), split="train")
        assert rows.num_rows == len(stored)
        for row in rows:
            piece = stored[(row["rollout_id"], row["trajectory_index"])]
            assert row["prompt_ids"] == piece.prompt_ids
            assert row["response_ids"] == piece.response_ids
            assert row["loss_mask"] == piece.loss_mask
            assert row["logprobs"] == piece.logprobs
    assert "advantage" in datasets.load_dataset("json", data_files=str(jsonl))["train"].features


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("t.jsonl", '{"instruction": "a"}\n{"answer": "2"}\n', "t.jsonl line 2: 'instruction'"),
        ("t.yaml", "tasks:\n  - instruction: a\n  - 5\n", "t.yaml line 3 (tasks[1])"),
        ("t.txt", "x", "unknown file type .txt"),
    ],
)
def test_submit_bad_tasks_file_names_the_line(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    done = polar_mq("submit", str(path), "--url", "http://127.0.0.1:9")
    assert done.returncode == 2
    assert message in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_export_errors_are_clear_messages(fake_stack: LocalStack, tmp_path: Path) -> None:
    url = f"http://{fake_stack.settings.api_host}:{fake_stack.settings.api_port}"
    missing = polar_mq("export", str(uuid.uuid4()), "--out", str(tmp_path / "x.jsonl"),
                       "--url", url)  # fmt: skip
    assert missing.returncode == 1 and "404 not_found" in missing.stdout
    assert not list(tmp_path.iterdir())
    bad = polar_mq("export", str(uuid.uuid4()), "--format", "csv", "--url", url)
    assert bad.returncode == 2 and "unknown export format 'csv'" in bad.stdout
    for output in (missing, bad):
        assert "Traceback" not in output.stdout + output.stderr


def test_policy_show_set_pause_resume_and_refuse_going_back(
    fake_stack: LocalStack, fresh_policy: None
) -> None:
    env = settings_env(fake_stack.settings)
    shown = polar_mq("policy", env=env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["version"] == 0
    paused = polar_mq("policy", "3", "--pause", "--drain-timeout", "5", env=env)
    assert paused.returncode == 0, paused.stderr
    answer = json.loads(paused.stdout)
    assert (answer["version"], answer["paused"], answer["drained"]) == (3, True, True)
    assert [p["ok"] for p in answer["proxies"]] == [True]  # the stack's proxy was paused
    resumed = polar_mq("policy", "--resume", env=env)
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["paused"] is False
    back = polar_mq("policy", "2", env=env)
    said = " ".join((back.stdout + back.stderr).split())  # the console wraps long lines
    assert back.returncode == 1 and "older than the current version 3" in said
    assert "Traceback" not in said


def test_a_job_on_an_engine_that_is_down_stops_early_with_the_reason(
    pg_url: str, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> None:
    """Before: every rollout was blamed on the harness ("the harness ended before any LLM call
    reached the proxy") and retried three times. Now the engine is named, and the job stops once
    `PLATFORM_STOP_AFTER` attempts in a row failed the same way, far short of 3 x 8 attempts."""
    engine = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    settings = e2e_settings(pg_url, tmp_path, upstream_url=engine)
    with LocalStack(settings, tmp_path / "logs") as stack:
        stack.proxy(wait=False)
        stack.workers(one_supervisor=True)
        stack.api(wait=False)
        stack.wait_ready()
        url = f"http://{settings.api_host}:{settings.api_port}"
        done = polar_mq("submit", str(REPO / "examples/arithmetic.json"), "--samples", "3",
                        "--wait", "--url", url, env={"COLUMNS": "300"})  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        job_id = done.stdout.split()[1].rstrip(":")
        status = json.loads(polar_mq("status", job_id, "--json", "--url", url).stdout)
        table = polar_mq("status", job_id, "--url", url, env={"COLUMNS": "300"}).stdout
    assert status["state"] == "failed"
    assert status["by_status"] == {"failed": 9}
    down = f"no engine answers the proxy at {settings.proxy_base_url} (0 of 1 engines usable)"
    assert any(e["error"].startswith(down) for e in status["errors"]), status["errors"]
    named = (down, f"job stopped early: its last {PLATFORM_STOP_AFTER} attempts")
    assert all(e["error"].startswith(named) for e in status["errors"]), status["errors"]
    assert "errors (every attempt, retried ones included)" in table and down in table, table
    with db_session_factory() as session:
        rows = session.scalars(select(Rollout).where(Rollout.job_id == uuid.UUID(job_id))).all()
        attempts = sum(r.attempt for r in rows)
    assert attempts < 3 * len(rows)  # stopped: not every rollout used its three attempts
    assert all("harness ended" not in (r.error or "") for r in rows)
    assert any(
        (r.error or "").startswith(f"job stopped early: its last {PLATFORM_STOP_AFTER} attempts")
        for r in rows
    )
