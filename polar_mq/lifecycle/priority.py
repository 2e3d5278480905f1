"""Job priorities: one scale for users, 0 (the default, lowest) to 9 (highest).

A higher priority is served sooner. It only orders messages that *wait* in a queue; it never
preempts a running stage. Every stage message of the job carries it, so a high-priority job's later
stages do not queue behind a low-priority backlog either. How each broker is told about it is the
workers' business (`polar_mq.dispatch.priority`).
"""

from __future__ import annotations

from polar_mq.spec.model import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY

__all__ = ["DEFAULT_PRIORITY", "MAX_PRIORITY", "MIN_PRIORITY"]
"""The scale is defined with the job spec (`polar_mq.spec`); a job's is `JobSpec.priority`."""
