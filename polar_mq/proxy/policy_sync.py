"""The proxy follows the policy version recorded in the database.

The API pushes each weight update to every proxy it knows (`polar_mq.policy.proxies`), but a
proxy that restarts, joins later, or missed a push must still stamp the right version and honour
a pause. So the proxy reads `policy_state` once before it serves (a restarted proxy never stamps
version 0 by mistake) and then every `policy_sync_s`, applying it to every backend only when
the recorded state changed: an operator's per-backend admin change is not undone by the poll.
A database that cannot be read leaves the backends as they are (the proxy keeps serving).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from sqlalchemy import Engine, select

from polar_mq.models import DEFAULT_POLICY, PolicyState
from polar_mq.proxy.backends import BackendPool

log = logging.getLogger(__name__)

PolicyReader = Callable[[], tuple[int, bool] | None]
"""(version, paused) as recorded, None when nothing is recorded; raises when unreadable."""


def db_reader(engine: Engine, name: str = DEFAULT_POLICY) -> PolicyReader:
    query = select(PolicyState.version, PolicyState.paused).where(PolicyState.name == name)

    def read() -> tuple[int, bool] | None:
        with engine.connect() as conn:
            row = conn.execute(query).first()
        return (int(row.version), bool(row.paused)) if row is not None else None

    return read


class PolicySync:
    def __init__(self, pool: BackendPool, read: PolicyReader, interval_s: float) -> None:
        self.pool = pool
        self.read = read
        self.interval_s = interval_s
        self.applied: tuple[int, bool] | None = None
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    async def sync_once(self) -> None:
        try:
            state = await asyncio.to_thread(self.read)
        except Exception as exc:  # the proxy keeps serving on what it has
            if not self._failing:
                log.warning("policy state unreadable (%s); keeping the current versions", exc)
            self._failing = True
            return
        self._failing = False
        if state is None or state == self.applied:
            return
        version, paused = state
        for backend in self.pool.backends.values():
            backend.policy_version = version
            if paused:
                backend.pause()
            else:
                backend.resume()
        log.info("policy version %d%s (from the database)", version, " paused" if paused else "")
        self.applied = state

    async def start(self) -> None:
        await self.sync_once()
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.sync_once()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
