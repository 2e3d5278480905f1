"""Running real harnesses (presets) through the real pipeline against the scripted fake engine.

One stack serves every preset test of a session: the fake engine reads its plans from a directory
(`testing/scripted_policy.PlanDirectory`), and each task's instruction carries the tag of the plan
that drives it (`[[plan:NAME]]`). Presets are installed with the project's own installer into the
node's harness cache (`Settings.harness_root`), so reruns reuse them.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.harnesses.presets.install import InstallError, InstallReport, install
from polar_mq.harnesses.presets.registry import get_preset
from polar_mq.models import Job, LlmCall, Rollout, RolloutArtifact
from polar_mq.stack.devstack import LocalStack
from tests.e2e.stack import client_of

INSTALLS: dict[str, InstallReport] = {}
"""What each preset install cost in this session (cold, or reused from the cache)."""


@dataclass
class PresetStack:
    stack: LocalStack
    plans: Path

    def plan(self, name: str, plan: dict[str, Any]) -> str:
        """Write a plan; returns the tag to put in an instruction."""
        (self.plans / f"{name}.json").write_text(json.dumps(plan))
        return f"[[plan:{name}]]"


def model_sandbox(**runtime: Any) -> dict[str, Any]:
    """The runtime for a harness a real model drives: a bwrap sandbox (the node read-only, no
    capabilities, its own pid namespace), never `local`.

    The suite runs `local` agents as root (`POLAR_MQ_UNSAFE_ROOT_AGENTS`, tests/conftest.py), and
    a sampled model's shell command (mini-swe-agent's bash, Claude Code's Bash, codex's shell,
    aider's file edits) is arbitrary: as root on the node it can delete `/bin/sh` or kill the
    suite. Skips where bwrap is missing rather than run them on the node."""
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed: a real model's commands never run as root here")
    return {"kind": "bwrap", "network": "host", **runtime}


def install_preset(name: str, version: str | None = None) -> InstallReport:
    """Install (or reuse) a preset in the node's cache; skips the test when the registry fails."""
    preset = get_preset(name)
    assert preset is not None, f"no preset {name}"
    version = version or preset.package.default_version
    try:
        report = install(Settings().harness_root, name, preset.package, version)
    except InstallError as exc:
        pytest.skip(f"{name}@{version} could not be installed here: {exc}")
    INSTALLS[name] = report
    return report


@dataclass
class PresetRun:
    job_id: str
    rollouts: list[Rollout]
    calls: dict[Any, list[LlmCall]]
    artifacts: dict[Any, dict[str, bytes]]
    seconds: float
    runtime: dict[str, Any]
    """The job's stored runtime spec (with the network resolved at submit)."""


def run_preset(
    preset_stack: PresetStack,
    db: sessionmaker[Session],
    harness: dict[str, Any],
    tasks: list[dict[str, Any]],
    *,
    samples_per_task: int = 1,
    timeout: float = 300,
    **job: Any,
) -> PresetRun:
    """Submit a job, wait until it ends, and read back rollouts, calls and artifacts."""
    started = time.monotonic()
    job_id = submit_preset(preset_stack, harness, tasks, samples_per_task=samples_per_task, **job)
    return collect_preset(preset_stack, db, job_id, timeout=timeout, started=started)


def submit_preset(
    preset_stack: PresetStack,
    harness: dict[str, Any],
    tasks: list[dict[str, Any]],
    *,
    samples_per_task: int = 1,
    **job: Any,
) -> str:
    """Submit a job without waiting (several jobs then run side by side); returns its id."""
    client = client_of(preset_stack.stack)
    submitted = client.submit(tasks, samples_per_task=samples_per_task, harness=harness, **job)
    return str(submitted.job_id)


def collect_preset(
    preset_stack: PresetStack,
    db: sessionmaker[Session],
    job_id: str,
    *,
    timeout: float = 300,
    started: float | None = None,
) -> PresetRun:
    """Wait until a submitted job ends; read back its rollouts, calls and artifacts."""
    client_of(preset_stack.stack).wait(job_id, progress=False, timeout=timeout)
    seconds = time.monotonic() - (started if started is not None else time.monotonic())
    key = uuid.UUID(job_id)
    with db() as session:
        rollouts = list(session.scalars(select(Rollout).where(Rollout.job_id == key)).all())
        calls = {
            r.id: list(
                session.scalars(
                    select(LlmCall)
                    .where(LlmCall.rollout_id == r.id, LlmCall.attempt == r.attempt)
                    .order_by(LlmCall.seq)
                ).all()
            )
            for r in rollouts
        }
        artifacts = {
            r.id: {
                a.name: bytes(a.content)
                for a in session.scalars(
                    select(RolloutArtifact).where(RolloutArtifact.rollout_id == r.id)
                )
            }
            for r in rollouts
        }
        job_spec = session.get(Job, key)
        runtime = dict(job_spec.spec["runtime"]) if job_spec is not None else {}
        session.expunge_all()
    return PresetRun(job_id, rollouts, calls, artifacts, seconds, runtime)


def explain(run: PresetRun) -> str:
    """What went wrong, for a failing assertion: each rollout's state, error and agent log tail."""
    lines = []
    for r in run.rollouts:
        log = run.artifacts.get(r.id, {}).get("agent.log", b"")[-1500:].decode(errors="replace")
        lines.append(f"{r.status}/{r.termination_reason} reward={r.reward} error={r.error}\n{log}")
    return "\n---\n".join(lines)


def assert_captured(run: PresetRun, *, min_calls: int = 2) -> None:
    """Every rollout completed, every call captured with token ids, the agent log stored."""
    assert run.rollouts, "no rollouts"
    for rollout in run.rollouts:
        assert rollout.termination_reason == "completed", explain(run)
        calls = run.calls[rollout.id]
        assert len(calls) >= min_calls, explain(run)
        for call in calls:
            assert call.status_code == 200 and call.complete, (call.status_code, call.response)
            assert call.prompt_ids and call.completion_ids, call.id
        assert "agent.log" in run.artifacts[rollout.id]
