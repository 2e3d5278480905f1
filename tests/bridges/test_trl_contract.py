"""The TRL bridge against trl 1.16.0's real classes, on groups of a real polar_mq run.

Runs in the trainers' venv (scripts/setup_bridges.sh): AsyncGRPOTrainer's input path (TRL's
`RolloutSample`, queue dataset, planner and packing collator) on stored groups; one real
`GRPOTrainer` step on SmolLM2-135M (CPU) whose `rollout_func` runs a job on the live stack; and
the AsyncGRPO rollout worker leasing a live job. Training with AsyncGRPOTrainer itself needs a
GPU (its loss uses flash-attention tree kernels and it syncs weights to vLLM over NCCL): not run.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.inference import local_vllm
from polar_mq.models import PolicyState
from tests.bridges.conftest import SAMPLES, TASKS, RealGroups, bridges_installed, run_check

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(
        not bridges_installed(),
        reason="trl not in the trainers' venv: bash scripts/setup_bridges.sh",
    ),
]


@pytest.fixture()
def fresh_policy(db_session_factory: sessionmaker[Session]) -> Iterator[None]:
    """Policy version 0 before and after (the worker publishes a version)."""
    with db_session_factory.begin() as session:
        session.execute(delete(PolicyState))
    yield
    with db_session_factory.begin() as session:
        session.execute(delete(PolicyState))


def test_rollout_samples_go_through_trls_packing_collator(real_groups: RealGroups) -> None:
    report = run_check("check_trl.py", "async", str(real_groups.merged))
    assert report["samples"] == len(TASKS) * SAMPLES and report["groups"] == len(TASKS)
    assert 0 < report["trained_tokens"] < report["sample_tokens"]
    # the samples of a group share their prompt: TRL's packing forwards it once
    assert report["forward_tokens"] < report["sample_tokens"]

    per_call = run_check("check_trl.py", "async", str(real_groups.per_call))
    assert per_call["samples"] > len(TASKS) * SAMPLES  # several training samples per rollout


def test_a_grpo_trainer_step_on_a_polar_mq_rollout_func(
    real_groups: RealGroups, tmp_path: Path
) -> None:
    model = local_vllm.model_dir()
    if not (model / "config.json").is_file():
        pytest.skip("SmolLM2-135M-Instruct not converted (bash scripts/setup_vllm.sh)")
    report = run_check("check_trl.py", "grpo", real_groups.url, str(model), str(tmp_path))
    assert report["completions"] == 2 * SAMPLES  # two prompts, in TRL's order
    assert report["rewards"] == [1.0, 1.0, 0.0, 0.0]
    assert report["reward"] == pytest.approx(0.5)


def test_the_async_grpo_worker_leases_a_live_job(
    real_groups: RealGroups, fresh_policy: None
) -> None:
    report = run_check("check_trl.py", "worker", real_groups.url)
    assert report["samples"] == len(TASKS) * SAMPLES
    assert report["policy_version"] == report["base_version"] + 1
    assert report["trained_tokens"] > 0
