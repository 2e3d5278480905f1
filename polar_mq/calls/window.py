"""The `created_at` range a rollout's calls fall in, so reads by rollout skip other days.

`llm_calls` is partitioned by day: a query by `rollout_id` alone probes the index of every
partition (and plans each one: ~3 ms at 60 partitions). A rollout's calls are made after it was
created and before it finished; bounding `created_at` by those, with a day of slack for clocks
that differ between the API, the workers and the proxy (the proxy stamps `created_at`), lets
PostgreSQL prune the plan to two or three partitions. The bounds never exclude a real call unless
a clock is off by more than a day.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement

from polar_mq.models import LlmCall

CLOCK_SLACK = timedelta(days=1)


def calls_window(created_at: datetime | None, finished_at: datetime | None) -> list[Any]:
    """Conditions on `LlmCall.created_at` for a rollout created/finished at these times."""
    bounds: list[ColumnElement[bool]] = []
    if created_at is not None:
        bounds.append(LlmCall.created_at >= created_at - CLOCK_SLACK)
    if finished_at is not None:
        bounds.append(LlmCall.created_at <= finished_at + CLOCK_SLACK)
    return bounds
