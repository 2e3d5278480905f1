"""An engine's refusal ends the rollout as the platform's failure, never as the policy's zero.

Scenario: a group of three samples against an engine whose context is small; one agent's prompt
is over it, so the engine answers its only call 400 ("maximum context length") and the agent
exits non-zero. No token of the policy was sampled: scored 0 it would drag the group's mean and
advantages. The run-agent stage sees that the last call was the engine's refusal, so the rollout
ends `backend_error` with the engine's message, unscored, at once (the same transcript would meet
the same limit on a new attempt) and the group's statistics use the two other samples. An honest
agent that gets its answers and then fails its task stays `agent_error`, scored 0.

What can be caught before any runtime is built is caught at submit: a job whose
`sampling.max_tokens` leaves no room for a prompt in the served model's context (the operator's
`served_model_max_len`) is refused with a 422 that names the setting.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.client.errors import PolarMQError
from polar_mq.models import Event, EventKind
from tests.reliability.support import (
    RelStack,
    agent_command,
    check_invariants,
    rel_stack,
    wait_terminal,
)

pytestmark = [pytest.mark.e2e, pytest.mark.reliability]

MAX_MODEL_LEN = 300
"""The fake engine's context (its byte tokenizer: one token per byte of the chat template)."""
LONG = 600
"""Characters of the over-long instruction: its prompt alone is past the context."""


@pytest.fixture()
def small_engine(
    pg_url: str, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> Iterator[RelStack]:
    with rel_stack(
        pg_url, tmp_path, fake={"max_model_len": MAX_MODEL_LEN}, served_model_max_len=MAX_MODEL_LEN
    ) as stack:
        yield stack


def _one_over_long() -> str:
    """The agent command for a group where exactly one sample (the first to take the lock)
    sends an instruction over the context; the others send the task's own."""
    return (
        'if mkdir "$REL_CALL_LOG/long.lock" 2>/dev/null; then '
        f'printf \'{{"instruction": "%0{LONG}d", "calls": 1}}\' 0 > "$POLAR_WORKDIR/long.json"; '
        'export POLAR_TASK_FILE="$POLAR_WORKDIR/long.json"; fi; '
        f"exec {agent_command()}"
    )


def _group(rel: RelStack, rollout_id: str) -> dict[str, Any]:
    job_id = str(rel.client.rollout(rollout_id)["job_id"])
    (group,) = rel.client.results(job_id, advantages="grpo")
    return dict(group)


def test_engine_refusal_is_an_unscored_infrastructure_failure_outside_group_stats(
    small_engine: RelStack, db_session_factory: sessionmaker[Session]
) -> None:
    rel = small_engine
    ids = rel.submit(
        [{"instruction": "2+2", "calls": 1}],
        samples=3,
        harness={"type": "command", "command": _one_over_long()},
        retries={"max_attempts": 3},
    )
    failing = rel.submit(  # an honest agent: answered, then fails its task
        [{"instruction": "2+3", "calls": 1}],
        harness={"type": "command", "command": f"{agent_command()} && exit 3"},
    )
    wait_terminal(db_session_factory, ids + failing, 90)
    rollouts = check_invariants(rel, db_session_factory, ids + failing)

    refused = [rid for rid in ids if rollouts[rid].status == "failed"]
    assert len(refused) == 1, {rid: (r.termination_reason, r.error) for rid, r in rollouts.items()}
    lost = rollouts[refused[0]]
    assert lost.termination_reason == "backend_error" and lost.reward is None
    assert lost.attempt == 1, "a deterministic refusal is not retried"
    assert lost.error is not None
    assert "the engine refused the agent's last call (HTTP 400): " in lost.error
    assert "maximum context length is 300 tokens" in lost.error
    with db_session_factory() as session:
        requeued = session.scalars(
            select(Event.id).where(
                Event.rollout_id == uuid.UUID(refused[0]), Event.kind == EventKind.REQUEUED
            )
        ).all()
    assert not requeued

    group = _group(rel, ids[0])
    assert group["complete"] and group["incomplete"]
    assert (group["n_samples"], group["n_usable"]) == (3, 2)
    assert group["mean_reward"] == 1.0, "the refused sample must not count as a 0"
    by_id = {str(s["rollout_id"]): s for s in group["samples"]}
    assert by_id[refused[0]]["termination_reason"] == "backend_error"
    assert by_id[refused[0]]["reward"] is None and not by_id[refused[0]]["usable"]
    assert by_id[refused[0]]["advantage"] is None

    honest = rollouts[failing[0]]
    assert (honest.status, honest.termination_reason) == ("completed", "agent_error")
    assert honest.reward == 0.0
    (sample,) = _group(rel, failing[0])["samples"]
    assert sample["usable"] and sample["reward"] == 0.0


def test_max_tokens_over_the_served_context_is_refused_at_submit(
    small_engine: RelStack, db_session_factory: sessionmaker[Session]
) -> None:
    rel = small_engine
    with pytest.raises(PolarMQError) as refused:
        rel.submit([{"instruction": "2+2"}], sampling={"max_tokens": MAX_MODEL_LEN})
    assert (refused.value.status, refused.value.type) == (422, "context_overflow")
    assert "sampling.max_tokens (300)" in str(refused.value)
    assert "POLAR_MQ_SERVED_MODEL_MAX_LEN" in str(refused.value)
    fits = rel.submit([{"instruction": "2+2"}], sampling={"max_tokens": MAX_MODEL_LEN - 1})
    wait_terminal(db_session_factory, fits, 60)  # accepted: it runs (and ends before teardown)
