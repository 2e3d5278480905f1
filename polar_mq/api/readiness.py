"""Readiness: can this API process reach its database and its broker right now?

Both checks run at once in worker threads under one deadline, so a black-holed host makes the probe
answer 503 in time instead of hanging it; a check still stuck at the deadline is abandoned.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
from kombu.connection import Connection
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

OK = "ok"


def check_database(factory: sessionmaker[Session]) -> str:
    try:
        with factory() as session:
            session.execute(text("SELECT 1"))
    except Exception as exc:
        return f"unreachable: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return OK


def check_broker(url: str, timeout_s: float) -> str:
    try:
        with Connection(url, connect_timeout=timeout_s) as conn:
            conn.ensure_connection(
                max_retries=1, interval_start=0, interval_step=0, timeout=timeout_s
            )
    except Exception as exc:
        return f"unreachable: {type(exc).__name__}: {str(exc)[:200]}"
    return OK


async def readiness(
    factory: sessionmaker[Session], broker_url: str, timeout_s: float = 3.0
) -> dict[str, str]:
    """{"database": ..., "broker": ...}, each `ok` or the reason it is not."""
    checks = {"database": "timed out", "broker": "timed out"}

    async def run(name: str, fn: Callable[..., str], *args: object) -> None:
        checks[name] = await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)

    with anyio.move_on_after(timeout_s + 0.5):
        async with anyio.create_task_group() as group:
            group.start_soon(run, "database", check_database, factory)
            group.start_soon(run, "broker", check_broker, broker_url, timeout_s)
    return checks
