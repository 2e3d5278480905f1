"""A policy update, end to end: record the version, drain the proxies, re-judge and re-admit.

The trainer's side of a weight update is two calls:

1. `update(version, pause=True)`: the version is committed first (so capacity and staleness use
   it from now on), then every proxy holds new calls and drains the ones in flight, up to
   `drain_timeout_s`; the trainer then loads the new weights into the inference servers.
2. `resume()`: the proxies let the held calls go, served (and stamped) by the new version.

Without `pause`, the version is stamped on the next calls at once (for trainers that update
weights in place).

With `adapter_path` (a LoRA adapter directory the engines can read) the update carries the
weights itself, in one call: the version and adapter are recorded (paused, so proxies that only
follow the database hold too), every proxy pauses and drains, loads the adapter into all its
backends (a backend that fails leaves the rotation), and resumes (unless `pause` asked to stay
paused): calls after that are served by the adapter and stamped with the version. When every
proxy drained, the adapters loaded before are unloaded (no call can still use them).

With `checkpoint_path` (a full model directory the engines can read) the same sequence reloads
every backend's weights from disk instead (`polar_mq.proxy.checkpoints`: SGLang's
`update_weights_from_disk`, vLLM's dev-mode `reload_weights`); calls keep the served model name.

Either way, groups that the new version makes too old are judged, and the
jobs waiting for capacity admit their next groups. No database transaction is held while the
proxies drain.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.db import unit_of_work
from polar_mq.models import Job, Rollout, RolloutStatus
from polar_mq.policy.admission import admit_all
from polar_mq.policy.proxies import ProxyControl, ProxyReport
from polar_mq.policy.staleness import judge_staleness
from polar_mq.policy.state import PolicyView, current_policy, write_policy
from polar_mq.policy.weights import Adapter, adapter_for, checkpoint_for
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
    adapter: Adapter | None = None
    """The adapter published with this version (its `name` is the engines' `lora_name`)."""
    adapter_loaded: bool | None = None
    """Every proxy was reached and every backend of each loaded it. None: no adapter published,
    or no proxy configured to ask (proxies load it from the database within `policy_sync_s`)."""
    adapter_loads: list[ProxyReport] = field(default_factory=list)
    """Each proxy's answer to the load: per backend None (loaded) or the error."""
    resumed: list[ProxyReport] = field(default_factory=list)
    """Each proxy's answer to the resume that ends an adapter update."""


class PolicyService:
    def __init__(self, factory: sessionmaker[Session], proxies: ProxyControl) -> None:
        self.factory = factory
        self.proxies = proxies

    def get(self) -> PolicyView:
        with unit_of_work(self.factory) as session:
            return current_policy(session)

    def update(
        self,
        version: int,
        pause: bool,
        drain_timeout_s: float,
        adapter_path: str | None = None,
        checkpoint_path: str | None = None,
    ) -> PolicyUpdate:
        """Raises VersionWentBack (nothing changed); ValueError for both kinds of weights."""
        if adapter_path is not None and checkpoint_path is not None:
            raise ValueError("publish either adapter_path or checkpoint_path, not both")
        if adapter_path is not None:
            adapter = adapter_for(version, adapter_path)
            return self._publish(version, pause, drain_timeout_s, adapter)
        if checkpoint_path is not None:
            checkpoint = checkpoint_for(version, checkpoint_path)
            return self._publish(version, pause, drain_timeout_s, checkpoint)
        with unit_of_work(self.factory) as session:
            before, after = write_policy(session, version=version, paused=pause or None)
        started = time.monotonic()
        if pause or after.paused:
            reports = self.proxies.pause(version, drain_timeout_s)
        else:
            reports = self.proxies.set_version(version)
        waited = time.monotonic() - started
        return self._outcome(version, before.version, after.paused, reports, waited)

    def _publish(
        self, version: int, stay_paused: bool, drain_timeout_s: float, adapter: Adapter
    ) -> PolicyUpdate:
        """New weights: pause, drain, load the adapter (or checkpoint) everywhere, resume."""
        with unit_of_work(self.factory) as session:
            before, _ = write_policy(session, version=version, paused=True, adapter=adapter)
        started = time.monotonic()
        paused = self.proxies.pause(version, drain_timeout_s)
        reached = [r for r in paused if r.ok]
        drained = len(reached) == len(paused) and all(r.drained for r in reached)
        loads = self.proxies.load_adapter(adapter, unload_others=drained)
        resumed: list[ProxyReport] = []
        if not stay_paused:
            with unit_of_work(self.factory) as session:
                write_policy(session, paused=False)
            resumed = self.proxies.resume(version)
        waited = time.monotonic() - started
        return self._outcome(
            version, before.version, stay_paused, paused, waited,
            adapter=adapter,
            adapter_loaded=_all_loaded(loads) if loads else None,
            adapter_loads=loads,
            resumed=resumed,
        )  # fmt: skip

    def _outcome(
        self,
        version: int,
        previous: int,
        paused: bool,
        reports: list[ProxyReport],
        waited_s: float,
        **adapter: Any,
    ) -> PolicyUpdate:
        """What an update did: the proxies' drain figures, and the groups it judged stale or
        admitted (the jobs are judged again under the new version)."""
        stale, admitted = self._rejudge(version)
        reached = [r for r in reports if r.ok]
        return PolicyUpdate(
            version=version,
            previous_version=previous,
            paused=paused,
            drained=all(r.drained is not False for r in reached),
            in_flight=sum(r.in_flight or 0 for r in reached),
            drained_calls=sum(r.in_flight_at_pause or 0 for r in reached),
            waited_s=round(waited_s, 3),
            groups_stale=stale,
            groups_admitted=admitted,
            proxies=reports,
            **adapter,
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


def _all_loaded(loads: list[ProxyReport]) -> bool:
    """Every proxy answered the load and every backend of each carries the adapter."""
    return all(r.ok and all(e is None for e in (r.adapter_loads or {}).values()) for r in loads)
