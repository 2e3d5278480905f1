"""The `polar-mq` command without a running system: its commands are all registered, and a bad
job file or an unreachable API is a clear message, never a traceback (the live commands are
covered end to end in tests/e2e/test_cli.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from polar_mq.cli import app

COMMANDS = [
    "api", "proxy", "worker", "warm-pool", "janitor", "sweeper", "cancel", "flower", "submit",
    "export", "status", "groups", "demo", "policy", "db", "keys", "harness",
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
