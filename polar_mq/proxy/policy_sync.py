"""The proxy follows the policy version recorded in the database.

The API pushes each weight update to every proxy it knows (`polar_mq.policy.proxies`), but a
proxy that restarts, joins later, or missed a push must still stamp the right version and honour
a pause. So the proxy reads `policy_state` once before it serves (a restarted proxy never stamps
version 0 by mistake) and then every `policy_sync_s`, applying it to every backend only when
the recorded state changed: an operator's per-backend admin change is not undone by the poll.
A database that cannot be read leaves the backends as they are (the proxy keeps serving).

The recorded LoRA adapter is loaded into every backend before the recorded pause is lifted, so a
proxy that starts (or missed the API's push) never serves a published version on old weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from sqlalchemy import Engine, select

from polar_mq.models import DEFAULT_POLICY, PolicyState
from polar_mq.policy.weights import Adapter
from polar_mq.proxy.adapters import load_everywhere
from polar_mq.proxy.backends import BackendPool

log = logging.getLogger(__name__)

Recorded = tuple[int, bool, Adapter | None]
PolicyReader = Callable[[], Recorded | None]
"""(version, paused, adapter) as recorded, None when nothing is recorded; raises when
unreadable."""


def db_reader(engine: Engine, name: str = DEFAULT_POLICY) -> PolicyReader:
    query = select(
        PolicyState.version, PolicyState.paused, PolicyState.adapter_name, PolicyState.adapter_path
    ).where(PolicyState.name == name)

    def read() -> Recorded | None:
        with engine.connect() as conn:
            row = conn.execute(query).first()
        if row is None:
            return None
        adapter = None
        if row.adapter_name is not None and row.adapter_path is not None:
            adapter = Adapter(row.adapter_name, row.adapter_path)
        return int(row.version), bool(row.paused), adapter

    return read


class PolicySync:
    def __init__(self, pool: BackendPool, read: PolicyReader, interval_s: float) -> None:
        self.pool = pool
        self.read = read
        self.interval_s = interval_s
        self.applied: Recorded | None = None
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
        version, paused, adapter = state
        if adapter is not None and (self.applied is None or adapter != self.applied[2]):
            for backend in self.pool.backends.values():  # hold calls while it loads
                backend.pause()
            await load_everywhere(self.pool, adapter)
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
