"""The `llm_calls` read contract: which calls are an attempt's agent calls, and what the stages
read of them (all of them in call order, the last answer, a summary, the last sign of life).

Written once here because the build, evaluate and run-agent stages and the read services all ask
the same questions, and each must mean the same thing: calls of the rollout's *current* attempt
(never a lost attempt's), of purpose `agent` (never a judge's), bounded to the days the rollout
lived in (`window`: the table is partitioned by day).
"""

from polar_mq.calls.attempt import (
    AttemptCalls,
    CallSummary,
    agent_call_rows,
    agent_calls,
    last_agent_answer,
    last_agent_response,
    last_call_at,
    summarize,
)
from polar_mq.calls.window import calls_window, job_calls_window

__all__ = [
    "AttemptCalls",
    "CallSummary",
    "agent_call_rows",
    "agent_calls",
    "calls_window",
    "job_calls_window",
    "last_agent_answer",
    "last_agent_response",
    "last_call_at",
    "summarize",
]
