"""A finished job of N rollouts written straight into the database, as the workers would leave it.

Every rollout gets what the job page reads: the submitted/started/finished events of four stages,
an evaluation, `calls_per_rollout` LLM calls with token arrays and per_call training samples that
name their policy version; a few rollouts end as infrastructure or agent failures, so the failed
table and the incomplete groups have rows. Rows go in with multi-row INSERTs, one batch per table.
"""

from __future__ import annotations

import random
import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from polar_mq.models import (
    Evaluation,
    Event,
    Job,
    JobTask,
    LlmCall,
    Rollout,
    TrajectorySample,
)
from polar_mq.models.base import utcnow

STAGES = ("prepare", "run_agent", "build", "evaluate")
PROMPT_TOKENS = 400
COMPLETION_TOKENS = 64


def create_job(
    session: Session, rollouts: int, samples: int, calls_per_rollout: int, tenant: str, seed: int
) -> tuple[uuid.UUID, uuid.UUID]:
    """Insert the job; returns (job id, id of one completed rollout)."""
    rng = random.Random(seed)
    job_id = uuid.uuid4()
    n_tasks = rollouts // samples
    start = utcnow() - timedelta(hours=1)
    session.execute(
        insert(Job),
        [{
            "id": job_id, "tenant": tenant, "samples_per_task": samples, "n_tasks": n_tasks,
            "spec": {"harness": {"type": "reference"}, "evaluator": "exact_match",
                     "builder": "per_call", "pool": "bench"},
            "meta": {"name": f"synthetic {rollouts}-rollout job"}, "created_at": start,
        }],
    )  # fmt: skip
    task_rows = [
        {
            "job_id": job_id,
            "task_index": i,
            "instance": {"instruction": f"task {i}", "answer": "42"},
        }
        for i in range(n_tasks)
    ]
    session.execute(insert(JobTask), task_rows)
    found = session.execute(
        select(JobTask.task_index, JobTask.id).where(JobTask.job_id == job_id)
    ).tuples()
    task_ids = {index: task_id for index, task_id in found}
    rows: dict[str, list[dict[str, Any]]] = {
        "rollouts": [], "events": [], "evals": [], "calls": [], "samples": []
    }  # fmt: skip
    sample_rollout: uuid.UUID | None = None
    for task in range(n_tasks):
        for k in range(samples):
            rid = uuid.uuid4()
            began = start + timedelta(seconds=rng.uniform(0, 3000))
            _rollout(rows, rng, job_id, rid, task_ids[task], task, k, began, calls_per_rollout)
            if sample_rollout is None and rows["rollouts"][-1]["termination_reason"] == "completed":
                sample_rollout = rid
    for model, key in (
        (Rollout, "rollouts"), (Event, "events"), (Evaluation, "evals"), (LlmCall, "calls"),
        (TrajectorySample, "samples"),
    ):  # fmt: skip
        for i in range(0, len(rows[key]), 2000):
            session.execute(insert(model), rows[key][i : i + 2000])
    assert sample_rollout is not None
    return job_id, sample_rollout


def _rollout(
    rows: dict[str, list[dict[str, Any]]],
    rng: random.Random,
    job_id: uuid.UUID,
    rid: uuid.UUID,
    task_id: int,
    task: int,
    k: int,
    began: Any,
    n_calls: int,
) -> None:
    fate = rng.random()
    reason = "completed" if fate > 0.04 else ("runtime_error" if fate > 0.02 else "agent_error")
    reward = None if reason == "runtime_error" else float(rng.random() < 0.6)
    at = began
    rows["events"].append(_event(job_id, rid, "prepare", "submitted", at - timedelta(seconds=2)))
    for stage in STAGES:
        rows["events"].append(_event(job_id, rid, stage, "started", at))
        at += timedelta(seconds=rng.uniform(0.2, 20.0 if stage == "run_agent" else 2.0))
        rows["events"].append(_event(job_id, rid, stage, "finished", at, duration_s=1.0))
        at += timedelta(seconds=rng.uniform(0.01, 0.5))
    rows["rollouts"].append({
        "id": rid, "job_id": job_id, "task_id": task_id, "task_index": task, "sample_index": k,
        "status": "failed" if reason == "runtime_error" else "completed", "attempt": 1,
        "node": "bench-node", "termination_reason": reason, "agent_exit_code": 0,
        "reward": reward, "error": "container vanished" if reason == "runtime_error" else None,
        "n_llm_calls": n_calls, "created_at": began - timedelta(seconds=2), "started_at": began,
        "finished_at": at,
    })  # fmt: skip
    rows["evals"].append({
        "rollout_id": rid, "attempt": 1, "evaluator": "exact_match", "reward": reward,
        "detail": {}, "created_at": at,
    })  # fmt: skip
    prompt = [rng.randrange(3, 259) for _ in range(PROMPT_TOKENS)]
    for seq in range(n_calls):
        completion = [rng.randrange(3, 259) for _ in range(COMPLETION_TOKENS)]
        logprobs = [-rng.random() for _ in completion]
        rows["calls"].append({
            "id": uuid.uuid4(), "rollout_id": rid, "seq": seq, "backend": "engine-0",
            "model": "bench-model", "api_type": "chat", "stream": True, "policy_version": 0,
            "status_code": 200, "complete": True, "request": {"messages": []},
            "engine_request": None, "response": {"text": ""}, "prompt_ids": prompt,
            "completion_ids": completion, "logprobs": logprobs, "finish_reason": "stop",
            "latency_ms": rng.uniform(50, 900), "ttft_ms": rng.uniform(5, 60),
            "created_at": began, "purpose": "agent", "attempt": 1,
        })  # fmt: skip
        rows["samples"].append({
            "rollout_id": rid, "attempt": 1, "sample_index": seq, "builder": "per_call",
            "prompt_ids": prompt, "response_ids": completion, "loss_mask": [1] * len(completion),
            "logprobs": logprobs, "messages": None,
            "meta": {"calls": [seq], "policy_versions": [0]},
        })  # fmt: skip
        prompt = prompt + completion + [rng.randrange(3, 259) for _ in range(20)]


def _event(
    job_id: uuid.UUID, rid: uuid.UUID, stage: str, kind: str, at: Any, **detail: Any
) -> dict[str, Any]:
    return {
        "job_id": job_id, "rollout_id": rid, "stage": stage, "kind": kind, "attempt": 1,
        "worker": "bench-node/1", "at": at, "detail": detail,
    }  # fmt: skip
