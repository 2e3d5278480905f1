"""JobSpec: the stored, typed job spec (round trip, old rows, frozen, defaults in one place)."""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from polar_mq.config import Settings
from polar_mq.jobs.schemas import JobCreate
from polar_mq.rollouts.agent_outcome import CallSummary
from polar_mq.runtimes.base import ExecResult
from polar_mq.spec import (
    SPEC_VERSION,
    JobSpec,
    SpecVersionError,
    TaskInstance,
    TimeoutSpec,
    load_spec,
    upgrade,
)
from polar_mq.workers.stages import run_agent

TASKS = [{"instruction": "say hi"}]

FULL: dict[str, Any] = {
    "tasks": [{"instruction": "say hi", "answer": "hi"}],  # exact_match reads the answer
    "samples_per_task": 4,
    "harness": {"type": "command", "command": "echo hi", "env": {"A": "1"}},
    "runtime": {"kind": "local", "prepare": {"files": {"a.txt": "x"}, "commands": ["true"]}},
    "evaluator": {"name": "exact_match"},
    "builder": "prefix_merge",
    "max_tokens_per_rollout": 5000,
    "sampling": {"temperature": 0.7, "enforce": "clamp"},
    "stop": {"usable_samples_per_group": 2},
    "timeouts": {"agent_s": 30.0, "prepare_s": 12.5, "rollout_s": 90.0},
    "retries": {"max_attempts": 5, "stage_retries": 1},
    "model": "m",
    "staleness": {"max_staleness": 1, "batch_size": 2, "on_stale": "drop"},
    "pool": "gpu",
    "priority": 7,
}

V1_ROW: dict[str, Any] = {  # as `create_job` stored it before the spec was versioned
    "pool": "cpu",
    "harness": {"type": "reference", "env": {}},
    "runtime": {"kind": "local", "network": "host", "prepare": {"files": {}, "commands": []}},
    "evaluator": "completed",
    "builder": "per_call",
    "sampling": {},
    "timeouts": {"agent_s": 45.0},
    "staleness": {"max_staleness": 2, "batch_size": 3, "on_stale": "withhold", "base_version": 4},
}


def test_round_trip_job_create_to_stored_json_and_back() -> None:
    created = JobCreate.model_validate(FULL)
    spec = created.job_spec("default", base_version=3)
    stored = orjson.loads(orjson.dumps(spec.stored()))  # what the JSON column gives back
    assert stored["spec_version"] == SPEC_VERSION
    again = load_spec(stored)
    assert again == spec
    assert again.pool == "gpu" and again.priority == 7  # the job's own pool wins
    assert again.staleness is not None and again.staleness.base_version == 3
    assert again.timeouts.prepare_s == 12.5 and again.retries.stage_retries == 1
    assert again.evaluator_name == "exact_match"
    assert again.harness.command == "echo hi" and again.harness.env == {"A": "1"}
    # the stored JSON keeps its shape: the typed plug-in specs parse it, nothing is added
    assert stored["harness"] == {"type": "command", "command": "echo hi", "env": {"A": "1"}}


def test_the_default_pool_is_used_when_the_job_names_none() -> None:
    assert JobCreate(tasks=TASKS).job_spec("api-pool").pool == "api-pool"


def test_an_old_row_without_spec_version_loads_as_version_1() -> None:
    assert upgrade(V1_ROW)["spec_version"] == SPEC_VERSION
    assert "spec_version" not in V1_ROW  # the stored row is not touched
    spec = load_spec(V1_ROW)
    assert spec.spec_version == SPEC_VERSION
    assert spec.pool == "cpu" and spec.priority == 0  # priority: stored before it existed
    assert spec.timeouts.agent_s == 45.0
    assert spec.timeouts.prepare_s == TimeoutSpec().prepare_s  # left out: the one default
    assert spec.retries.max_attempts == 3 and spec.stop is None
    assert spec.staleness is not None and spec.staleness.base_version == 4


def test_a_row_from_a_newer_release_or_with_a_bad_version_is_refused() -> None:
    with pytest.raises(SpecVersionError, match="newer"):
        load_spec({**V1_ROW, "spec_version": SPEC_VERSION + 1})
    with pytest.raises(SpecVersionError):
        load_spec({**V1_ROW, "spec_version": "2"})


def test_a_stored_field_this_release_does_not_know_is_refused() -> None:
    with pytest.raises(ValidationError):
        load_spec({**V1_ROW, "timeouts": {"agent_sec": 3}})


def test_the_spec_is_frozen() -> None:
    spec = load_spec(V1_ROW)
    with pytest.raises(ValidationError):
        spec.pool = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        spec.timeouts.agent_s = 1.0  # type: ignore[misc]


def test_load_spec_passes_a_loaded_spec_through() -> None:
    spec = JobSpec()
    assert load_spec(spec) is spec


def test_resubmitting_against_an_old_row_compares_the_typed_specs() -> None:
    """A v1 row (no priority, no spec_version) equals the same job submitted today."""
    body = {**FULL, "pool": None, "priority": 0, "staleness": None}
    created = JobCreate.model_validate(body)
    row = created.stored_spec("cpu")
    del row["spec_version"], row["priority"]
    assert load_spec(row) == created.job_spec("cpu")


class FakeRuntime:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.python = "python3"
        self.runtime_id = "rt-test"
        self.exec_kwargs: dict[str, Any] = {}

    def exec(self, command: Any, *, env: dict[str, str] | None = None, **kw: Any) -> ExecResult:
        if env is not None:  # the agent's command
            self.exec_kwargs = kw
        return ExecResult(0, "", "", False, False, 0.01)

    def download(self, path: str) -> bytes:
        raise FileNotFoundError(path)

    def agent_proxy_url(self, url: str) -> str:
        return url


def test_the_agent_stage_sees_the_default_when_the_job_omitted_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`agent_s` is written once (TimeoutSpec); the stage reads it from the loaded spec."""
    runtime = FakeRuntime(tmp_path)
    monkeypatch.setattr(run_agent, "open_runtime", lambda *args: runtime)
    monkeypatch.setattr(run_agent, "summarize_calls", lambda *args: CallSummary(1, 200))
    http = SimpleNamespace(
        post=lambda url, headers: SimpleNamespace(
            raise_for_status=lambda: None, json=lambda: {"written": 0}
        )
    )
    settings = Settings(secret_key="s" * 32, runtime_root=tmp_path, max_agent_timeout_s=10_000)
    ctx = SimpleNamespace(
        settings=settings, http=http, session_factory=None, autocommit_engine=None, receipts=None,
        leases=SimpleNamespace(lost=lambda _rollout_id: False),
    )  # fmt: skip
    row = JobCreate(tasks=TASKS).stored_spec("default")
    del row["timeouts"]  # a row that never said: the model's default fills it in
    rollout = SimpleNamespace(id=uuid.uuid4(), attempt=1, created_at=None)
    claimed = SimpleNamespace(
        rollout=rollout, spec=load_spec(row), instance=TaskInstance.of(TASKS[0])
    )
    run_agent.run(ctx, claimed)  # type: ignore[arg-type]
    assert runtime.exec_kwargs["timeout"] == TimeoutSpec().agent_s
    assert runtime.exec_kwargs["inactivity_timeout"] == settings.default_inactivity_timeout_s
