"""The verdicts on a failed agent run that say the engine cannot serve the job at all, shared by
the run's judge (`agent_outcome`, `engine_probe`) and the job-wide stop that reads them back from
the events (`jobs.failures`).

Other platform failures (a proxy restart, a 5xx under load) are transient and retried; these two
stay true for every rollout of the job until someone fixes the engine or the job.
"""

from __future__ import annotations

MODEL_NOT_SERVED = "the engine does not serve the job's model (HTTP 404 to the agent's LLM call)"
ENGINE_DOWN = "no engine answers the proxy"
"""The start of the engine-down verdict; the proxy asked and its count of engines follow."""
PERSISTENT_CAUSES = (MODEL_NOT_SERVED, ENGINE_DOWN)
"""Starts of the verdicts that every further attempt of the job would meet again."""
