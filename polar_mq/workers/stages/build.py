"""Stage 3, build trajectory: the rollout's captured LLM calls become training samples.

Reads only the database, so it runs on any node. Token ids come from the calls exactly as the engine
produced them; nothing is re-tokenized.
"""

from __future__ import annotations

from polar_mq.calls import AttemptCalls, agent_call_rows
from polar_mq.lifecycle.transitions import Claimed
from polar_mq.trajectories.base import CapturedCall
from polar_mq.trajectories.registry import get_builder
from polar_mq.workers.context import WorkerContext
from polar_mq.workers.stages.outcomes import Built


def load_calls(ctx: WorkerContext, claimed: Claimed) -> list[CapturedCall]:
    """The agent's calls in call order; judge calls (`llm_judge`, e.g. of an earlier attempt) are
    stored with the rollout but are never training data."""
    with ctx.autocommit_engine.connect() as conn:  # one read: no BEGIN and COMMIT around it
        rows = agent_call_rows(conn, AttemptCalls.of(claimed.rollout))
        return [
            CapturedCall(
                seq=row.seq,
                call_id=str(row.id),
                prompt_ids=row.prompt_ids,
                completion_ids=row.completion_ids,
                logprobs=row.logprobs,
                finish_reason=row.finish_reason,
                policy_version=row.policy_version,
                status_code=row.status_code,
                request=row.engine_request or row.request,  # a family call: its chat form
                response=row.response,
                prompt_source=row.prompt_source,
                tito_fallback=row.tito_fallback,
            )
            for row in rows
        ]


def run(ctx: WorkerContext, claimed: Claimed) -> Built:
    builder_name = claimed.spec.builder
    calls = load_calls(ctx, claimed)
    built = get_builder(builder_name).build(calls)
    return Built(claimed.rollout, builder_name, len(calls), built)
