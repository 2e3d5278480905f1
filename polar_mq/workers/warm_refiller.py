"""The warm-pool refiller of one node: keeps prepared runtimes ready for the rollouts to come.

Runs as a thread of `polar-mq worker` (or alone: `polar-mq warm-pool`). Every
`warm_pool_refill_interval_s` it compares the pool with the demand and builds what is missing in
the background, `warm_pool_build_concurrency` at a time:

- demand: the queued rollouts of this node's worker pool whose job asks for `runtime.warm`,
  per pool key (the sandbox the job's runtime spec defines);
- target: one idle runtime per free agent slot of this node (run-agent concurrency minus the
  rollouts prepared for or running on it), shared out among the keys by demand, never more than
  a key's queued rollouts, and never past `warm_pool_max_per_node` pooled runtimes in all;
- reaping: idle runtimes unused for `warm_pool_idle_ttl_s` are destroyed, unless their key is
  still wanted.

The database is only read (two small queries per round): the pool itself lives in the runtime root
(`polar_mq/runtimes/warm_pool.py`), so a restarted refiller adopts the idle runtimes it finds.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.harnesses.presets.setup import sandbox_binds
from polar_mq.models import Job, Rollout, RolloutStatus
from polar_mq.runtimes.warm_pool import WarmPool, pool_key
from polar_mq.spec import JobSpec, RuntimeSpec, load_spec

log = logging.getLogger(__name__)


@dataclass
class Demand:
    """Queued warm rollouts per pool key (with a spec to build from) and free agent slots."""

    pending: Counter[str] = field(default_factory=Counter)
    specs: dict[str, tuple[RuntimeSpec, tuple[str, ...]]] = field(default_factory=dict)
    """Per pool key: the runtime spec and the read-only binds (a preset's install) to build."""
    timeouts: dict[str, float] = field(default_factory=dict)
    free_slots: int = 0


def share_out(pending: Counter[str], slots: int) -> dict[str, int]:
    """Split `slots` among keys one at a time, most-wanted first, each capped by its demand."""
    want: Counter[str] = Counter()
    left = slots
    while left > 0:
        open_keys = [k for k, n in pending.most_common() if want[k] < n]
        if not open_keys:
            break
        for key in open_keys:
            if left == 0:
                break
            want[key] += 1
            left -= 1
    return dict(want)


class Refiller:
    def __init__(
        self,
        settings: Settings,
        factory: sessionmaker[Session],
        agent_slots: int,
        pool: WarmPool | None = None,
    ) -> None:
        self.settings = settings
        self.factory = factory
        self.agent_slots = agent_slots
        self.pool = pool or WarmPool(settings.runtime_root, settings.warm_pool_max_per_node)
        self._specs: dict[uuid.UUID, JobSpec | None] = {}
        self._executor = ThreadPoolExecutor(
            settings.warm_pool_build_concurrency, thread_name_prefix="warm-build"
        )
        self._building: dict[Future[str], str] = {}

    def demand(self) -> Demand:
        s = self.settings
        with self.factory() as session:
            queued = session.execute(
                select(Rollout.job_id, func.count())
                .where(Rollout.status == RolloutStatus.QUEUED)
                .group_by(Rollout.job_id)
            ).all()
            here = session.scalar(
                select(func.count()).where(
                    Rollout.node == s.node_name,
                    Rollout.status.in_((RolloutStatus.PREPARED, RolloutStatus.RUNNING)),
                )
            )
            missing = [job_id for job_id, _ in queued if job_id not in self._specs]
            if missing:
                for row in session.execute(select(Job.id, Job.spec).where(Job.id.in_(missing))):
                    loaded = load_spec(row.spec)
                    self._specs[row.id] = loaded if self._ours(loaded) else None
        self._specs = {job_id: self._specs.get(job_id) for job_id, _ in queued}
        demand = Demand(free_slots=max(0, self.agent_slots - int(here or 0)))
        for job_id, count in queued:
            spec = self._specs.get(job_id)
            if spec is None:
                continue
            try:
                binds = sandbox_binds(spec.runtime, spec.harness, s.harness_root)
            except ValueError:  # a preset this node does not know: its prepare fails anyway
                log.warning("job %s: unknown harness %r, not prewarmed", job_id, spec.harness.type)
                continue
            key = pool_key(spec.runtime, binds)
            demand.pending[key] += int(count)
            demand.specs.setdefault(key, (spec.runtime, binds))
            demand.timeouts.setdefault(key, spec.timeouts.prepare_s)
        return demand

    def _ours(self, spec: JobSpec) -> bool:
        return spec.runtime.warm and spec.pool == self.settings.pool

    def step(self) -> list[str]:
        """One round: reap, then start the builds the pool lacks; returns the keys started."""
        self._building = {f: k for f, k in self._building.items() if not _settled(f)}
        demand = self.demand()
        wanted = share_out(demand.pending, demand.free_slots)
        self.pool.reap_idle(self.settings.warm_pool_idle_ttl_s, keep=demand.pending)
        census = self.pool.census()
        in_flight = Counter(self._building.values())
        # conservative: a build in flight may already be counted in the census as busy
        room = self.pool.max_runtimes - census.total - len(self._building)
        started: list[str] = []
        for key, target in wanted.items():
            have = census.idle_by_key[key] + max(census.busy_by_key[key], in_flight[key])
            for _ in range(max(0, target - have)):
                if room <= 0 or len(self._building) >= self.settings.warm_pool_build_concurrency:
                    return started
                runtime_spec, binds = demand.specs[key]
                future = self._executor.submit(
                    self.pool.fill_one, runtime_spec, demand.timeouts[key], binds
                )
                future.add_done_callback(_log_failure)
                self._building[future] = key
                room -= 1
                started.append(key)
        return started

    def run_forever(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.step()
            except Exception:
                log.exception("warm-pool refill round failed")
            stop.wait(self.settings.warm_pool_refill_interval_s)
        self._executor.shutdown(wait=True, cancel_futures=True)


def _settled(future: Future[str]) -> bool:
    return future.done()


def _log_failure(future: Future[str]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("building a warm runtime failed: %s", future.exception())


class RefillerThread:
    """A running refiller; `stop()` ends it, waits for builds in flight and empties the pool.

    A node that stops its workers gracefully leaves no idle runtime behind (containers would
    otherwise wait for the next start's refiller to reap them).
    """

    def __init__(self, refiller: Refiller) -> None:
        self.refiller = refiller
        self.event = threading.Event()
        self.thread = threading.Thread(
            target=refiller.run_forever, args=(self.event,), name="polar-warm-pool", daemon=True
        )
        self.thread.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        self.event.set()
        self.thread.join(timeout_s)
        self.refiller.pool.reap_idle(idle_ttl_s=-1.0)


def start_refiller(settings: Settings, agent_slots: int) -> RefillerThread:
    """Refill this node's warm pool in a daemon thread."""
    from polar_mq.infra.db import create_db_engine, make_session_factory

    factory = make_session_factory(create_db_engine(settings.database_url, pool_size=1))
    return RefillerThread(Refiller(settings, factory, agent_slots))
