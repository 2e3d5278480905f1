"""The `polar-mq` command without a running system: its commands are all registered, and a bad
job file or an unreachable API is a clear message, never a traceback (the live commands are
covered end to end in tests/e2e/test_cli.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from polar_mq.cli import app

COMMANDS = [
    "api", "proxy", "worker", "warm-pool", "janitor", "sweeper", "cancel", "flower", "submit",
    "export", "status", "results", "groups", "demo", "up", "policy", "db", "keys", "harness",
]  # fmt: skip


def test_help_lists_every_command() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    listed = {line.split()[1] for line in result.output.splitlines() if line.startswith("│ ")}
    assert set(COMMANDS) <= listed, sorted(set(COMMANDS) - listed)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"tasks": [{"instruction": "x"}]}', "Connection refused"),  # good file, no server
    ],
)
def test_a_bad_job_file_is_a_clear_message(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "job.json"
    path.write_text(content)
    # a closed port: a bad file is refused before any request is made
    result = CliRunner().invoke(app, ["submit", str(path), "--url", "http://127.0.0.1:9"])
    assert result.exit_code != 0
    assert message in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


MIXED = '{"instruction": "6*7?", "answer": "42"}\n{"instruction": "Say hi."}\n'
BARE = '{"instruction": "Say hi."}\n'


@pytest.mark.parametrize(
    ("content", "options", "message"),
    [
        (MIXED, [], "tasks.jsonl: no evaluator named and only some tasks have 'answer': tasks[1]"),
        (MIXED, [], "or pass --evaluator"),
        (
            BARE,
            ["--evaluator", "exact_match"],
            "evaluator 'exact_match' reads each task's 'answer'",
        ),
        (BARE, ["--evaluator", '{"name": "tests"}'], "reads each task's 'tests', which tasks[0]"),
    ],
)
def test_an_evaluator_the_tasks_cannot_feed_is_refused_before_any_request(
    tmp_path: Path, content: str, options: list[str], message: str
) -> None:
    """Before, the mixed file was scored by `completed` and the other two ended every rollout
    unscored: the CLI now refuses them with the API's rule, without a request (a closed port)."""
    path = tmp_path / "tasks.jsonl"
    path.write_text(content)
    url = ["--url", "http://127.0.0.1:9"]
    result = CliRunner().invoke(app, ["submit", str(path), *options, *url])
    assert result.exit_code == 2, result.output
    output = " ".join(result.output.split())  # the console wraps long lines
    assert message in output
    assert "Connection refused" not in output


def test_a_mixed_file_is_accepted_once_the_evaluator_is_named(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(MIXED)
    args = ["submit", str(path), "--evaluator", "completed", "--url", "http://127.0.0.1:9"]
    result = CliRunner().invoke(app, args)
    assert "Connection refused" in result.output  # past the checks, on to the (absent) API


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--start", "spawn"], "unknown start method 'spawn'; one of forkserver, exec"),
        (["--concurrency", "run_agent=0"], "bad concurrency 'run_agent=0'"),
    ],
)
def test_a_bad_worker_option_is_a_clear_message(args: list[str], message: str) -> None:
    """Refused before any stage worker, thread or port is started."""
    worker = [sys.executable, "-m", "polar_mq.cli", "worker", "--no-janitor", "--no-warm-pool"]
    result = subprocess.run([*worker, *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [["status"], ["status", "JOB"], ["results", "JOB"], ["cancel", "JOB"], ["export", "JOB"]],
)
def test_an_unreachable_api_names_the_url_and_what_to_do(args: list[str]) -> None:
    """Before: `error: 0 connection_error: ConnectError: [Errno 111] Connection refused`."""
    result = CliRunner().invoke(app, [*args, "--url", "http://127.0.0.1:9"])
    output = " ".join(result.output.split())
    assert result.exit_code == 1, output
    assert output.startswith("error: cannot reach the API at http://127.0.0.1:9/v1/"), output
    assert "Connection refused" in output and "`polar-mq up` starts one locally" in output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_up_refuses_a_database_that_does_not_answer(tmp_path: Path) -> None:
    """A named PostgreSQL that is not there is refused before anything starts (no process, no
    migration), with the URL and the way back to the embedded defaults."""
    closed = "postgresql://postgres@127.0.0.1:9/polar_mq"
    args = ["up", "--fake", "--dir", str(tmp_path / "up"), "--database-url", closed]
    result = CliRunner().invoke(app, args)
    output = " ".join(result.output.split())
    assert result.exit_code == 2, output
    assert f"error: the database at {closed} does not answer (127.0.0.1:9:" in output
    assert "unset --database-url / POLAR_MQ_DATABASE_URL to run on the embedded SQLite" in output
    assert not (tmp_path / "up" / "api_key").exists()


def test_up_refuses_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["up", "--fake", "--dir", str(tmp_path / "up"), "--port", str(port)]
        result = CliRunner().invoke(app, args)
    output = " ".join(result.output.split())
    assert result.exit_code == 2, output
    assert (
        f"error: port {port} is in use (another `polar-mq up`?): stop it or pass --port" in output
    )
    assert not (tmp_path / "up").exists()


def test_the_command_starts_without_the_server_side_libraries() -> None:
    """Every `polar-mq` call (a trainer's `submit`, `status` in a loop, the suite's many CLI
    subprocesses) pays its imports: sqlalchemy alone added about 0.1 s to each. The commands that
    need the database, Celery or FastAPI import them when they run."""
    code = (
        "import sys, polar_mq.cli; "
        "loaded = {m.split('.')[0] for m in sys.modules}; "
        "print(sorted({'sqlalchemy', 'celery', 'fastapi'} & loaded))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]"
