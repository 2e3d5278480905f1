"""`polar-mq db prune`: a clear message for a bad age, a JSON report otherwise."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
from typer.testing import CliRunner

from polar_mq.cli.db import db_app
from polar_mq.config import get_settings
from tests.retention.conftest import call_row, days_ago, insert_calls, make_job


@pytest.mark.parametrize("age", ["banana", "30", "-3d", "0d", "3y"])
def test_bad_age_is_a_clear_message(age: str) -> None:
    result = CliRunner().invoke(db_app, ["prune", "--older-than", age])
    assert result.exit_code == 2
    assert "--older-than" in result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.fixture(autouse=True)
def fresh_settings() -> Iterator[None]:
    """The CLI reads the process settings (cached): each test's database URL must be seen."""
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_prune_dry_run_prints_a_report(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLAR_MQ_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    (rollout,) = make_job(engine, ["completed"])
    insert_calls(engine, [call_row(rollout, 0, days_ago(40)), call_row(rollout, 1, days_ago(1))])
    result = CliRunner().invoke(db_app, ["prune", "--older-than", "30d", "--dry-run"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["dry_run"], report["rows_deleted"], report["rows_kept"]) == (True, 1, 0)
    result = CliRunner().invoke(db_app, ["prune", "--older-than", "30d"])
    assert json.loads(result.output)["rows_deleted"] == 1
