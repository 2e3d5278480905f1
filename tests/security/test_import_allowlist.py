"""Evaluator and builder import paths only from the allow-list: `"os:system"` is a 4xx at submit.

Through the API (the app's `import_allowlist`) and in a worker (`allowing`, as the stage runner
sets it); a refused module is never imported, so its import-time code never runs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.evaluators import get_evaluator
from polar_mq.infra import imports
from polar_mq.infra.imports import EVALUATOR_GROUP, ImportNotAllowed, allowing
from polar_mq.trajectories.registry import get_builder
from polar_mq.ui.app import create_app

SIDE_EFFECT_MODULE = "pmq_import_side_effect"
TASKS = [{"instruction": "x", "answer": "1"}]


@pytest.fixture
def side_effect_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A module that leaves a file behind when it is imported, and a scoring function."""
    marker = tmp_path / "imported"
    source = f"open({str(marker)!r}, 'w').close()\n\ndef score(ctx):\n    return 1.0\n"
    (tmp_path / f"{SIDE_EFFECT_MODULE}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield marker
    sys.modules.pop(SIDE_EFFECT_MODULE, None)


def api(
    pg_url: str, factory: sessionmaker[Session], allowlist: list[str] | None = None
) -> Iterator[TestClient]:
    values: dict[str, Any] = {"database_url": pg_url}
    if allowlist is not None:
        values["import_allowlist"] = allowlist
    app = create_app(Settings(**values), session_factory=factory, publisher=lambda _: None)
    with TestClient(app) as client:
        yield client


@pytest.fixture
def client(pg_url: str, db_session_factory: sessionmaker[Session]) -> Iterator[TestClient]:
    yield from api(pg_url, db_session_factory, ["polar_mq"])  # the default


@pytest.mark.parametrize(
    "field",
    [
        {"evaluator": "os:system"},
        {"evaluator": {"name": "python", "callable": "os:system"}},
        {"evaluator": {"name": "weighted", "evaluators": [{"spec": "subprocess:run"}]}},
        {"evaluator": "polar_mq_evil:score"},  # a prefix matches whole module names only
        {"builder": "os:system"},
        {"builder": "builtins:exec"},
    ],
)
def test_paths_outside_the_allowlist_are_refused_at_submit(
    client: TestClient, field: dict[str, Any]
) -> None:
    answer = client.post("/v1/jobs", json={"tasks": TASKS, **field})
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["type"] == "validation_error"
    assert "is not allowed" in error["message"] and "POLAR_MQ_IMPORT_ALLOWLIST" in error["message"]


def test_a_refused_module_is_never_imported(client: TestClient, side_effect_module: Path) -> None:
    spec = {"tasks": TASKS, "evaluator": f"{SIDE_EFFECT_MODULE}:score"}
    answer = client.post("/v1/jobs", json=spec)
    assert answer.status_code == 422, answer.text
    assert not side_effect_module.exists() and SIDE_EFFECT_MODULE not in sys.modules


def test_polar_mq_paths_and_configured_prefixes_are_accepted(
    client: TestClient,
    pg_url: str,
    db_session_factory: sessionmaker[Session],
    side_effect_module: Path,
) -> None:
    own = {"evaluator": "polar_mq.evaluators.match:ExactMatchEvaluator"}
    own["builder"] = "polar_mq.trajectories.prefix_merge:PrefixMergeBuilder"
    assert client.post("/v1/jobs", json={"tasks": TASKS, **own}).status_code == 201
    for configured in api(pg_url, db_session_factory, ["polar_mq", SIDE_EFFECT_MODULE]):
        spec = {"tasks": TASKS, "evaluator": f"{SIDE_EFFECT_MODULE}:score"}
        assert configured.post("/v1/jobs", json=spec).status_code == 201
    assert side_effect_module.exists()


def test_entry_points_are_allowed_by_path_and_by_name(
    monkeypatch: pytest.MonkeyPatch, side_effect_module: Path
) -> None:
    registered = {EVALUATOR_GROUP: {"side_score": f"{SIDE_EFFECT_MODULE}:score"}}
    monkeypatch.setattr(imports, "registered", lambda group: registered.get(group, {}))
    with allowing(["polar_mq"]):
        assert get_evaluator("side_score").evaluate(None).reward == 1.0  # type: ignore[arg-type]
        assert get_evaluator(f"{SIDE_EFFECT_MODULE}:score") is not None
        with pytest.raises(ImportNotAllowed):
            get_evaluator("os:system")


def test_workers_check_the_allowlist_too() -> None:
    """A spec stored before the allow-list existed cannot make a worker import anything."""
    with allowing(["polar_mq"]):
        with pytest.raises(ImportNotAllowed, match="'os' is not under"):
            get_evaluator({"name": "python", "callable": "os:system"})
        with pytest.raises(ImportNotAllowed):
            get_builder("os:system")
        assert get_builder("polar_mq.trajectories.prefix_merge:PrefixMergeBuilder") is not None
    with allowing([]), pytest.raises(ImportNotAllowed, match="empty"):
        get_builder("polar_mq.trajectories.prefix_merge:PrefixMergeBuilder")


def test_the_allowlist_setting_reads_json_or_commas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POLAR_MQ_IMPORT_ALLOWLIST", raising=False)
    assert Settings().import_allowlist == ["polar_mq"]  # the default: polar_mq's own only
    assert Settings(import_allowlist="polar_mq, my_evals").import_allowlist == [
        "polar_mq",
        "my_evals",
    ]
    assert Settings(import_allowlist='["a.b"]').import_allowlist == ["a.b"]
