"""Where an attempt's calls go on, by the durable record: `max(seq) + 1` of its stored calls.

The seed of a call counter that does not know an attempt (`seq`: why a database read, and what it
cannot see). One indexed read per miss, in a thread (the engine is synchronous), on the proxy's
read engine. It reads every purpose (agent and judge calls share the attempt's counter) and every
day: the proxy does not know when the rollout started, and a miss is rare (once per attempt per
process), so probing each day's partition index once is cheaper than a wrong floor.

It refuses (a retryable 503, `sequence_unavailable`) when it cannot be sure:
- the database cannot be read;
- this process's writer holds spilled rows (a database outage now, or a dead predecessor's spill
  directory not yet replayed): their seqs are not in the table, so the floor read may be too low.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

from sqlalchemy import Engine, func, select

from polar_mq.models import LlmCall
from polar_mq.proxy.backends.pool import BackendUnavailable
from polar_mq.proxy.store.seq import SeqFloor

logger = logging.getLogger(__name__)

_MAX_SEQ = select(func.max(LlmCall.seq))


def db_seq_floor(engine: Engine, spilled_rows: Callable[[], int]) -> SeqFloor:
    """The floor of an attempt read from `llm_calls`, refused while `spilled_rows()` > 0."""

    def read(rollout_id: uuid.UUID, attempt: int) -> int:
        query = _MAX_SEQ.where(LlmCall.rollout_id == rollout_id, LlmCall.attempt == attempt)
        with engine.connect() as conn:
            found = conn.execute(query).scalar()
        return 0 if found is None else int(found) + 1

    async def floor(rollout_id: uuid.UUID, attempt: int) -> int:
        if spilled_rows() > 0:
            raise BackendUnavailable(
                "this proxy holds call rows not yet stored; the rollout's call order will be "
                "known once they are: retry shortly",
                "sequence_unavailable",
                1,
            )
        try:
            return await asyncio.to_thread(read, rollout_id, attempt)
        except Exception as exc:
            logger.warning("call order of rollout %s unreadable: %s", rollout_id, exc)
            raise BackendUnavailable(
                "the rollout's call order cannot be read (database unreachable); retry shortly",
                "sequence_unavailable",
                1,
            ) from exc

    return floor


def spilled_rows(stats: dict[str, int]) -> int:
    """Rows a writer holds on disk, not yet in the database (0 for sinks without a spill)."""
    return int(stats.get("spilled_rows", 0))
