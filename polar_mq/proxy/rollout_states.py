"""Proxy tokens die with their rollout: a small cache of rollout states, re-read in batches.

A rollout token is an HMAC the proxy checks without the database, so on its own it stays valid
until it expires, also after its rollout ended (a leftover agent process could add calls to a
finished rollout), and a token naming a rollout that never existed is accepted as long as it is
signed. The proxy therefore also asks whether the rollout may still call: once the rollout is
terminal (completed, failed, cancelled) its calls are refused with 403, and a rollout the database
does not know is refused with 401. Judge tokens work like agent tokens: the evaluate stage runs
while the rollout is `evaluating`, which is not terminal.

Not a query per call: the states of the rollouts called recently are re-read together, one query
every `proxy_rollout_state_ttl_s` (default 2 s). A rollout seen for the first time costs one
query, shared by every call that arrives for it meanwhile (and by other new rollouts). So a call
can be let through at most `ttl` plus one query's duration after its rollout ended: that is the
bound of the refusal. A terminal state is final and never re-read; rollouts not called for
`IDLE_S` are forgotten.

When the database cannot be read the proxy keeps serving on what it knows (the last state read;
a valid token of a rollout it could not look up is let through) and retries after one period:
refusing would turn a database blip into failed agents, and the token's signature and expiry
still hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import Engine, select

from polar_mq.models import Rollout, RolloutStatus

log = logging.getLogger(__name__)

StateReader = Callable[[Sequence[uuid.UUID]], Mapping[uuid.UUID, str]]
"""The status of each of the given rollouts that exists (blocking; raises when unreadable)."""

IDLE_S = 600.0
"""A rollout not called for this long is dropped from the cache (read again if it calls)."""
READ_CHUNK = 1000
"""Rollout ids per query (keeps the statement and its parameter list small)."""
ENDED = "rollout_ended"
UNKNOWN = "unknown_rollout"


def db_state_reader(engine: Engine) -> StateReader:
    """Reads `rollouts.status` for many ids in one query per `READ_CHUNK`."""

    def read(ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
        found: dict[uuid.UUID, str] = {}
        with engine.connect() as conn:
            for start in range(0, len(ids), READ_CHUNK):
                chunk = list(ids[start : start + READ_CHUNK])
                query = select(Rollout.id, Rollout.status).where(Rollout.id.in_(chunk))
                found.update({row.id: row.status for row in conn.execute(query)})
        return found

    return read


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a call is refused before it is read: the HTTP status, a code and a message."""

    status: int
    code: str
    message: str


@dataclass(slots=True)
class _Entry:
    status: str | None
    """The rollout's status when last read; None: no such rollout."""
    read_at: float
    used_at: float


class RolloutStates:
    """The TTL cache the proxy consults on every call (`refusal`), refreshed in the background."""

    def __init__(
        self,
        read: StateReader,
        ttl_s: float,
        *,
        idle_s: float = IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.read = read
        self.ttl_s = ttl_s
        self.idle_s = idle_s
        self.clock = clock
        self.queries = 0
        """Queries made so far (tests and metrics: calls must not cost one each)."""
        self._entries: dict[uuid.UUID, _Entry] = {}
        self._waiting: dict[uuid.UUID, asyncio.Future[None]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._retry_at = 0.0
        self._failing = False

    async def refusal(self, rollout_id: uuid.UUID) -> Refusal | None:
        """None when the rollout may call; otherwise why not."""
        now = self.clock()
        entry = self._entries.get(rollout_id)
        if self._stale(entry, now) and now >= self._retry_at:
            await self._lookup(rollout_id)
            entry = self._entries.get(rollout_id)
        if entry is None:  # the database could not be read: serve on the token alone
            return None
        entry.used_at = now
        if entry.status is None:
            return Refusal(401, UNKNOWN, f"invalid rollout token: no rollout {rollout_id}")
        if entry.status in RolloutStatus.TERMINAL:
            return Refusal(
                403, ENDED, f"rollout {rollout_id} has ended ({entry.status}): its token is revoked"
            )
        return None

    def _stale(self, entry: _Entry | None, now: float) -> bool:
        if entry is None:
            return True
        if entry.status in RolloutStatus.TERMINAL:
            return False  # final
        return now - entry.read_at > 2 * self.ttl_s  # the refresher keeps live ones within ttl

    async def _lookup(self, rollout_id: uuid.UUID) -> None:
        """Wait for a read that includes `rollout_id` (one read serves every waiting rollout)."""
        waiter = self._waiting.get(rollout_id)
        if waiter is None:
            waiter = self._waiting[rollout_id] = asyncio.get_running_loop().create_future()
            if self._reader is None or self._reader.done():
                self._reader = asyncio.create_task(self._read_waiting())
        await asyncio.shield(waiter)

    async def _read_waiting(self) -> None:
        await asyncio.sleep(0)  # let the calls that arrived together join this read
        while self._waiting:
            waiting, self._waiting = self._waiting, {}
            try:
                await self._read(list(waiting))
            finally:
                for waiter in waiting.values():
                    if not waiter.done():
                        waiter.set_result(None)

    async def _read(self, ids: Sequence[uuid.UUID]) -> None:
        """Read `ids` and store what was found; a failure keeps the cache as it is."""
        self.queries += 1
        try:
            states = await asyncio.to_thread(self.read, ids)
        except Exception as exc:  # keep serving on what we know; retry after one period
            self._retry_at = self.clock() + self.ttl_s
            if not self._failing:
                log.warning("rollout states unreadable (%s): serving on the tokens alone", exc)
            self._failing = True
            return
        if self._failing:
            log.info("rollout states readable again")
        self._failing = False
        now = self.clock()
        for rollout_id in ids:
            entry = self._entries.get(rollout_id)
            status = states.get(rollout_id)
            if entry is None:
                self._entries[rollout_id] = _Entry(status, now, now)
            else:
                entry.status, entry.read_at = status, now

    async def refresh_once(self) -> None:
        """Forget idle rollouts; re-read every live one in one batch."""
        now = self.clock()
        idle = [key for key, e in self._entries.items() if now - e.used_at > self.idle_s]
        for key in idle:
            del self._entries[key]
        live = [
            key
            for key, entry in self._entries.items()
            if entry.status not in RolloutStatus.TERMINAL
        ]
        if live:
            await self._read(live)

    async def start(self) -> None:
        self._refresher = asyncio.create_task(self._refresh_forever())

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_s)
            await self.refresh_once()

    async def stop(self) -> None:
        for task in (self._refresher, self._reader):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
