"""Job priorities: one scale for users, 0 (the default, lowest) to 9 (highest).

A higher priority is served sooner. It only orders messages that *wait* in a queue; it never
preempts a running stage. Every stage message of the job carries it, so a high-priority job's later
stages do not queue behind a low-priority backlog either. How each broker is told about it is the
workers' business (`polar_mq.workers.priority`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MIN_PRIORITY = 0
MAX_PRIORITY = 9
DEFAULT_PRIORITY = 0


def job_priority(spec: Mapping[str, Any]) -> int:
    """The priority of a stored job spec; jobs stored before priorities existed get the default."""
    value = spec.get("priority", DEFAULT_PRIORITY)
    if not isinstance(value, int) or isinstance(value, bool):
        return DEFAULT_PRIORITY
    return min(MAX_PRIORITY, max(MIN_PRIORITY, value))
