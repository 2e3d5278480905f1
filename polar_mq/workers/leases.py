"""Lease heartbeats: a running stage keeps its claim alive; a dead one lets it expire.

A claim sets `lease_expires_at = now + lease_s`. While the stage runs, one thread per worker
process renews the leases of every stage running in that process every `lease_s / 3` seconds with
a fenced UPDATE (same owner, still in the busy state). So a healthy stage can run for hours with a
short lease, and a worker that dies (kill -9, lost node) stops renewing: the sweeper sees the
expired lease within `lease_s` and restarts the rollout.

A renewal that matches no row means the rollout was taken from this worker: cancelled, or
restarted by the sweeper after a stall. Between renewals the keeper also reads, every `check_s`
(2 s), whether its rollouts are still held (one SELECT for all of them), so a cancel is seen
within seconds, not at the next renewal (20 s with the default lease). It then calls the stage's
`on_lost` (e.g. kill the agent's process tree) so a cancelled agent stops burning GPU time right
away. Once the stage
`settle()`s (its work done, its outcome being committed) a miss is its own commit and is ignored:
a heartbeat racing the commit must not tear down what the next stage needs.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from polar_mq.lifecycle.stages import STAGE_STATES
from polar_mq.lifecycle.transitions import Claimed, renew_leases, still_held
from polar_mq.models.base import utcnow

log = logging.getLogger(__name__)
CHECK_S = 2.0
"""How often a keeper reads whether its rollouts are still held (a cancel is seen this soon)."""


@dataclass(eq=False)
class Held:
    """One running stage's lease, as the keeper tracks it."""

    rollout_id: uuid.UUID
    busy: str
    owner: str
    on_lost: Callable[[], None] | None
    lost: threading.Event = field(default_factory=threading.Event)
    settling: threading.Event = field(default_factory=threading.Event)
    """Set once the stage's work is done and its outcome is being committed. From then on a
    renewal that finds the rollout moved on is that very commit, not a loss: `on_lost` must not
    run (it would kill the agent of, or destroy the runtime needed by, the next stage)."""

    def settle(self) -> None:
        self.settling.set()


class LeaseKeeper:
    """Renews the leases of the stages running in this process (one daemon thread, lazily)."""

    def __init__(
        self, factory: sessionmaker[Session], lease_s: float, check_s: float = CHECK_S
    ) -> None:
        self.factory = factory
        self.lease_s = float(lease_s)
        self.interval_s = max(0.2, self.lease_s / 3)
        self.check_s = min(self.interval_s, max(0.1, float(check_s)))
        self._held: set[Held] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextmanager
    def hold(self, claimed: Claimed, on_lost: Callable[[], None] | None = None) -> Iterator[Held]:
        """Keep `claimed`'s lease alive for the duration of the block."""
        _, busy, _ = STAGE_STATES[claimed.stage]
        held = Held(claimed.rollout.id, busy, claimed.owner, on_lost)
        with self._lock:
            self._held.add(held)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="polar-lease-keeper", daemon=True
                )
                self._thread.start()
        try:
            yield held
        finally:
            with self._lock:
                self._held.discard(held)

    def lost(self, rollout_id: uuid.UUID) -> bool:
        """Whether a stage of this process has lost `rollout_id`'s lease (cancelled or restarted
        elsewhere): what it still has to do is discarded, so it can stop at once (the agent
        stage skips the proxy flush that would wait out a proxy already gone)."""
        with self._lock:
            return any(h.rollout_id == rollout_id and h.lost.is_set() for h in self._held)

    def _run(self) -> None:
        renew_at = time.monotonic() + self.interval_s
        while True:
            time.sleep(self.check_s)
            with self._lock:
                batch = list(self._held)
            renewing = time.monotonic() >= renew_at
            if renewing:
                renew_at = time.monotonic() + self.interval_s
            if batch:
                try:
                    if renewing:
                        self.renew(batch)
                    else:
                        self.check(batch)
                except Exception:  # a database blip: the lease has 2/3 of its length left
                    log.warning("lease renewal or check failed; retrying", exc_info=True)

    def renew(self, batch: list[Held]) -> None:
        """Extend every lease in `batch`; report the ones that are no longer ours (one statement
        for the whole batch on PostgreSQL: `transitions.renew_leases`)."""
        expires = utcnow() + timedelta(seconds=self.lease_s)
        holds = [(h.rollout_id, h.busy, h.owner) for h in batch]
        with self.factory() as session, session.begin():
            kept = renew_leases(session, holds, expires)
        self._report([h for h, hold in zip(batch, holds, strict=True) if hold not in kept])

    def check(self, batch: list[Held]) -> None:
        """Report the stages of `batch` whose rollout is no longer ours, without renewing."""
        holds = {h.rollout_id: (h.busy, h.owner) for h in batch}
        with self.factory() as session:
            held = still_held(session, holds)
        self._report([h for h in batch if h.rollout_id not in held])

    def _report(self, lost: list[Held]) -> None:
        for held in lost:
            if held.lost.is_set() or held.settling.is_set():
                continue
            held.lost.set()
            log.warning("rollout %s was taken from %s (cancelled or restarted)", *_ids(held))
            if held.on_lost is not None:
                try:
                    held.on_lost()
                except Exception:
                    log.exception("stopping the lost stage of rollout %s failed", held.rollout_id)


def _ids(held: Held) -> tuple[str, str]:
    return str(held.rollout_id), held.owner
