"""The run-agent stage hands the agent a token carrying the job's sampling policy."""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from polar_mq.capability.tokens import verify_rollout_token
from polar_mq.config import Settings
from polar_mq.rollouts.agent_outcome import CallSummary
from polar_mq.runtimes.base import ExecResult
from polar_mq.spec import TaskInstance, load_spec
from polar_mq.workers.stages import run_agent

SECRET = "run-agent-secret"


class FakeRuntime:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.python = "python3"
        self.runtime_id = "rt-test"
        self.env: dict[str, str] = {}

    def exec(self, command: Any, *, env: dict[str, str] | None = None, **_: Any) -> ExecResult:
        if env is not None:  # the agent's command (the workspace diff runs without env)
            self.env = dict(env)
        return ExecResult(0, "", "", False, False, 0.01)

    def download(self, path: str) -> bytes:
        raise FileNotFoundError(path)  # no diff, no transcript

    def agent_proxy_url(self, url: str) -> str:
        return url  # the node's network: the proxy as configured


class FakeHttp:
    def post(self, url: str, headers: dict[str, str]) -> Any:
        return SimpleNamespace(raise_for_status=lambda: None, json=lambda: {"written": 0})


def _agent_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: dict[str, Any]
) -> dict[str, str]:
    runtime = FakeRuntime(tmp_path)
    monkeypatch.setattr(run_agent, "open_runtime", lambda *args: runtime)
    monkeypatch.setattr(run_agent, "summarize_calls", lambda *args: CallSummary(1, 200))
    settings = Settings(secret_key=SECRET, runtime_root=tmp_path)
    ctx = SimpleNamespace(
        settings=settings, http=FakeHttp(), session_factory=None, autocommit_engine=None,
        receipts=None, leases=SimpleNamespace(lost=lambda _rollout_id: False),
    )  # fmt: skip
    rollout = SimpleNamespace(
        id=uuid.uuid4(), attempt=2, created_at=None, task_index=3, sample_index=5
    )
    claimed = SimpleNamespace(
        rollout=rollout, spec=load_spec(spec), instance=TaskInstance.of({"instruction": "do it"})
    )
    outcome = run_agent.run(ctx, claimed)  # type: ignore[arg-type]
    assert outcome.exit_code == 0 and outcome.columns()["agent_exit_code"] == 0
    return runtime.env


def test_the_agent_token_carries_the_jobs_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sampling = {"temperature": 0.9, "max_tokens": 64, "enforce": {"max_tokens": "clamp"}}
    env = _agent_env(tmp_path, monkeypatch, {"sampling": sampling})
    claim = verify_rollout_token(SECRET, env["OPENAI_API_KEY"])
    assert claim.attempt == 2 and claim.sampling is not None
    assert claim.sampling.as_dict() == {
        "temperature": ["override", 0.9],
        "max_tokens": ["clamp", 64],
    }
    assert env["ANTHROPIC_API_KEY"] == env["OPENAI_API_KEY"]
    assert env["POLAR_AGENT_TEMPERATURE"] == "0.9"  # still exported for harnesses that read it


@pytest.mark.parametrize("sampling", [None, {}, {"temperature": 0.9, "enforce": "off"}])
def test_no_policy_keeps_the_short_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sampling: dict[str, Any] | None
) -> None:
    env = _agent_env(tmp_path, monkeypatch, {} if sampling is None else {"sampling": sampling})
    token = env["OPENAI_API_KEY"]
    assert token.count("_") == 5
    assert verify_rollout_token(SECRET, token).sampling is None


def test_a_seeded_job_gives_each_rollout_its_own_reproducible_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _agent_env(tmp_path, monkeypatch, {"sampling": {"temperature": 1.0, "seed": 7}})
    assert env["POLAR_AGENT_SEED"] == str(run_agent.rollout_seed(7, 3, 5))
    seeds = {run_agent.rollout_seed(7, t, s) for t in range(4) for s in range(8)}
    assert len(seeds) == 32  # every sample of every group its own: no identical replies
    assert run_agent.rollout_seed(8, 3, 5) != run_agent.rollout_seed(7, 3, 5)
    assert all(0 <= seed < 2**31 for seed in seeds)  # what vLLM and SGLang take


def test_no_seed_without_a_job_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _agent_env(tmp_path, monkeypatch, {"sampling": {"temperature": 1.0}})
    assert "POLAR_AGENT_SEED" not in env
