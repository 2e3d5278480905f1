"""A policy update, end to end: record the version, drain the proxies, re-judge and re-admit.

The trainer's side of a weight update is two calls:

1. `update(version, pause=True)`: the version is committed first (so capacity and staleness use
   it from now on), then every proxy holds new calls and drains the ones in flight, up to
   `drain_timeout_s`; the trainer then loads the new weights into the inference servers.
2. `resume()`: the proxies let the held calls go, served (and stamped) by the new version.

Without `pause`, the version is stamped on the next calls at once (for trainers that update
weights in place). Either way, groups that the new version makes too old are judged, and the
jobs waiting for capacity admit their next groups. No database transaction is held while the
proxies drain.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.db import unit_of_work
from polar_mq.models import Job, Rollout, RolloutStatus
from polar_mq.policy.admission import admit_all
from polar_mq.policy.proxies import ProxyControl, ProxyReport
from polar_mq.policy.staleness import judge_staleness
from polar_mq.policy.state import PolicyView, current_policy, write_policy
from polar_mq.spec import load_spec


@dataclass(frozen=True, slots=True)
class PolicyUpdate:
    version: int
    previous_version: int
    paused: bool
    drained: bool
    """Every reachable proxy reported no call in flight (always true without a pause)."""
    in_flight: int
    """Calls still in flight across the proxies when the drain wait ended."""
    drained_calls: int
    """Calls that were in flight when the pause began and finished on the old weights."""
    waited_s: float
    groups_stale: int
    """Groups found too old for the trainer by this update (withheld or dropped)."""
    groups_admitted: int
    proxies: list[ProxyReport] = field(default_factory=list)


class PolicyService:
    def __init__(self, factory: sessionmaker[Session], proxies: ProxyControl) -> None:
        self.factory = factory
        self.proxies = proxies

    def get(self) -> PolicyView:
        with unit_of_work(self.factory) as session:
            return current_policy(session)

    def update(self, version: int, pause: bool, drain_timeout_s: float) -> PolicyUpdate:
        """Raises VersionWentBack (nothing changed)."""
        with unit_of_work(self.factory) as session:
            before, after = write_policy(session, version=version, paused=pause or None)
        started = time.monotonic()
        if pause or after.paused:
            reports = self.proxies.pause(version, drain_timeout_s)
        else:
            reports = self.proxies.set_version(version)
        waited = time.monotonic() - started
        stale, admitted = self._rejudge(version)
        reached = [r for r in reports if r.ok]
        return PolicyUpdate(
            version=version,
            previous_version=before.version,
            paused=after.paused,
            drained=all(r.drained is not False for r in reached),
            in_flight=sum(r.in_flight or 0 for r in reached),
            drained_calls=sum(r.in_flight_at_pause or 0 for r in reached),
            waited_s=round(waited, 3),
            groups_stale=stale,
            groups_admitted=admitted,
            proxies=reports,
        )

    def resume(self) -> tuple[PolicyView, list[ProxyReport]]:
        with unit_of_work(self.factory) as session:
            _, after = write_policy(session, paused=False)
        return after, self.proxies.resume(after.version)

    def _rejudge(self, version: int) -> tuple[int, int]:
        """Judge the staleness of every job that still has work or undelivered groups, then
        admit what the new capacity allows."""
        with unit_of_work(self.factory) as session:
            active = select(Rollout.job_id).where(
                Rollout.status.not_in(list(RolloutStatus.TERMINAL))
            )
            jobs = session.scalars(select(Job).where(Job.id.in_(active.distinct()))).all()
            stale = sum(
                judge_staleness(session, job, version, worker="policy")
                for job in jobs
                if load_spec(job.spec).staleness is not None
            )
        with unit_of_work(self.factory) as session:
            admitted = admit_all(session, version, worker="policy")
        return stale, admitted
