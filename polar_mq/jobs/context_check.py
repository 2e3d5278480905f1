"""Submit-time check of a job's `sampling.max_tokens` against the served model's context.

An engine refuses a call whose prompt plus `max_tokens` is over its context (vLLM's 400 "maximum
context length"); a job whose `max_tokens` alone fills the context has every call refused, and
each of its rollouts would end an unscored infrastructure failure after its runtime was built.
When the operator states the context (`served_model_max_len`), such a job is refused at submit
instead. Only this much can be caught here: a prompt that outgrows the context is known only at
the call (`rollouts.agent_outcome`).
"""

from __future__ import annotations

from polar_mq.jobs.schemas import JobCreate

CONTEXT_OVERFLOW = "context_overflow"
"""The error type of a job refused for `context_problem`."""


def context_problem(spec: JobCreate, max_model_len: int | None) -> str | None:
    """Why `spec` cannot run on a model of `max_model_len` tokens, or None (also when unknown)."""
    max_tokens = spec.sampling.get("max_tokens")
    if max_model_len is None or not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        return None
    if max_tokens < max_model_len:
        return None
    return (
        f"sampling.max_tokens ({max_tokens}) leaves no room for a prompt in the served model's "
        f"context of {max_model_len} tokens (POLAR_MQ_SERVED_MODEL_MAX_LEN): the engine would "
        f"refuse every call; ask for fewer than {max_model_len}"
    )
