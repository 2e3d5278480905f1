"""Prepare admission: a node takes new rollouts only while it can start them soon (issue 37).

Why: prepare pins a rollout to the node that prepared it (run agent and evaluate then come through
that node's own queues), and a prepare worker left alone claims from the pool-wide queue as fast
as it can. A node then ends a run with many prepared rollouts waiting for its few run-agent slots
while the other nodes idle (docs/multihost.md, "Throughput on 1, 2 and 3 hosts").

So the node's prepare worker stops consuming the pool-wide prepare queue while its backlog reaches
the admission window, and consumes again once it is below (`admission_step`, on the consumer's
event loop). A paused queue only delays messages: they stay in the broker for the other nodes.

The backlog is counted so that it is never below the truth (an over-count pauses a little early
and is corrected by the next count; an under-count would let the node hoard again):

- `prepared`: the node's rollouts in status `prepared`, counted in PostgreSQL on a thread of its
  own (a slow or unreachable database never blocks the event loop): every `RECOUNT_GAP_S` while
  prepares finish or the count falls (agents starting), backing off to `POLL_S` otherwise;
- `holding`: the prepare messages the worker holds now (received, not yet finished: preparing or
  about to), read on the consumer's thread when deciding;
- the prepares that finished since the last count began: their rollouts may have become prepared
  after the count read them, and they are no longer held. Seen on the consumer's thread as held
  messages that left (whatever the pool: a prefork child's signals never reach the consumer).

A node's backlog therefore reaches at most window + prefetch - 1, the prefetch being the prepare
concurrency: the messages the broker had already sent when the window filled are prepared too.

Failure: with no count younger than `STALE_AFTER_S` (the database is away) the gate fails open,
after a warning: a node paused on a count it cannot renew would never take work again, while an
open node during an outage only does what it did before admission existed (its prepares need the
database to claim anyway). A blip shorter than that keeps the last count.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, func, select
from sqlalchemy.exc import DBAPIError

from polar_mq.config import Settings
from polar_mq.infra.db import create_db_engine
from polar_mq.infra.raw_sql import first_row
from polar_mq.lifecycle.stages import Stage
from polar_mq.models import Rollout, RolloutStatus
from polar_mq.workers.launcher import DEFAULT_CONCURRENCY

log = logging.getLogger(__name__)

POLL_S = 0.5
"""How often the node's prepared rollouts are counted when nothing asks sooner: how late a paused
node resumes after one of its agents started (one indexed count per node per poll)."""
RECOUNT_GAP_S = 0.05
"""The least time between two counts. A prepare that finished since the last count began asks for
a new one (`Verdict.recount`): while prepares flow fast the node counts this often, so the
finished-since term stays small and does not pause a node whose agents start at once."""
STALE_AFTER_S = 5.0
"""A count older than this is not trusted: the gate fails open."""
COUNT_TIMEOUT_S = 2.0
"""Connect, statement and TCP timeout of a count: a hung or cut-off database is a failed count,
soon (the gate fails open `STALE_AFTER_S` after the last good count anyway)."""


def admission_window(settings: Settings) -> int:
    """The node's window; 0: admission is off. `polar-mq worker` sets the setting for its prepare
    worker to the node's run_agent concurrency when the operator left it unset
    (`launcher.plan_workers`); a prepare worker started by hand falls back to the default one."""
    window = settings.prepare_admission_window
    return DEFAULT_CONCURRENCY[Stage.RUN_AGENT] if window is None else window


@dataclass(frozen=True, slots=True)
class PreparedCount:
    """One count of the node's prepared rollouts, and what had finished when it began."""

    prepared: int
    finished_before: int
    """Prepare messages that had left this worker before the count began (`AdmissionGate`)."""
    began_at: float
    """`time.monotonic()` when the count began."""


@dataclass(frozen=True, slots=True)
class Verdict:
    pause: bool
    backlog: int | None
    """The backlog it was decided on; None: no recent count, the gate is open (fail-open)."""
    recount: bool = False
    """Prepares finished since the count began: a new count would be tighter."""


class AdmissionGate:
    """The decision, free of Celery and the database: fed counts from the counter's thread and
    asked on the consumer's with the ids of the prepare messages the worker holds."""

    def __init__(self, window: int, stale_after_s: float = STALE_AFTER_S) -> None:
        if window < 1:
            raise ValueError(f"an admission window is at least 1 (0 turns admission off): {window}")
        self.window = window
        self.stale_after_s = stale_after_s
        self._lock = threading.Lock()
        self._held: frozenset[str] = frozenset()
        self._finished = 0
        """Prepare messages that left this worker (finished, whatever the outcome), as seen by
        the decisions: each arrival is decided on, so each one is seen held at least once."""
        self._count: PreparedCount | None = None

    def finished(self) -> int:
        with self._lock:
            return self._finished

    def counted(self, count: PreparedCount) -> None:
        with self._lock:
            self._count = count

    def decide(self, held: frozenset[str], now: float) -> Verdict:
        """Pause when the backlog reaches the window, consume below it. No hysteresis: the backlog
        only drops when one of the node's agents starts, i.e. a slot was taken and one more
        prepared rollout fits; each resume admits about that one."""
        with self._lock:
            self._finished += len(self._held - held)
            self._held = held
            count, finished = self._count, self._finished
        if count is None or now - count.began_at > self.stale_after_s:
            return Verdict(pause=False, backlog=None)
        since = finished - count.finished_before
        backlog = count.prepared + len(held) + since
        return Verdict(pause=backlog >= self.window, backlog=backlog, recount=since > 0)


def prepared_on_node(settings: Settings) -> Callable[[], int]:
    """A counter of the node's rollouts in status `prepared`: an index range of the status index
    (`ix_rollouts_status_lease`: only the pool's prepared rollouts), on a connection of its own.

    The connection is held between counts (in autocommit on PostgreSQL: one round trip per
    count) and the statement runs on the driver's cursor (`raw_sql.first_row`): while prepares
    flow the node counts every `RECOUNT_GAP_S`, and a checkout with its ping, the reset on
    return and SQLAlchemy's execute around a one-row count were most of its cost. A connection
    the server closed is replaced at once, within the count; any other failure drops it.
    """
    url = settings.database_url
    if url.startswith("sqlite"):
        engine = create_db_engine(url)
    else:
        timeout_ms = int(COUNT_TIMEOUT_S * 1000)
        engine = create_db_engine(
            url, pool_size=1, max_overflow=0, isolation_level="AUTOCOMMIT",
            connect_args={
                "connect_timeout": max(1, int(COUNT_TIMEOUT_S)),
                "options": f"-c statement_timeout={timeout_ms}",
                # a partition: the query unacknowledged, or its answer lost, fails in seconds
                "tcp_user_timeout": timeout_ms, "keepalives_idle": 2,
                "keepalives_interval": 1, "keepalives_count": 2,
            },
        )  # fmt: skip
    query = (
        select(func.count())
        .select_from(Rollout)
        .where(Rollout.status == RolloutStatus.PREPARED, Rollout.node == settings.node_name)
    )
    held: list[Connection] = []

    def count() -> int:
        for retry in (False, True):
            if not held:
                held.append(engine.connect())
            conn = held[0]
            try:
                row = first_row(conn, query, {})
                conn.rollback()  # ends SQLite's read snapshot; nothing to send in autocommit
                return int(row[0]) if row else 0
            except BaseException as error:
                held.clear()
                conn.close()
                lost = isinstance(error, DBAPIError) and error.connection_invalidated
                if retry or not lost:  # a server that closed an idle connection: connect again
                    raise
        raise AssertionError("unreachable")

    return count


class PreparedCounter:
    """Feeds the gate fresh counts on a daemon thread of its own.

    When: at once when asked (`recount`, at most every `gap_s`), and otherwise after `next_wait`:
    `gap_s` after a count that fell (the node's agents are starting: a paused node resumes as
    soon as one more fits, which keeps its slots fed when agents are short), doubling up to
    `poll_s` while the count stays put (long agents: a paused node asks little of the database).
    """

    def __init__(
        self,
        gate: AdmissionGate,
        count: Callable[[], int],
        poll_s: float = POLL_S,
        gap_s: float = RECOUNT_GAP_S,
    ) -> None:
        self.gate = gate
        self.count = count
        self.poll_s = poll_s
        self.gap_s = gap_s
        self._stopping = threading.Event()
        self._asked = threading.Event()
        self._first = threading.Event()
        self._failing = False
        self._last: int | None = None
        self.next_wait = poll_s
        self._thread = threading.Thread(target=self._run, name="prepare-admission", daemon=True)

    def start(self) -> PreparedCounter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._asked.set()

    def recount(self) -> None:
        """Count again soon (at most every `gap_s`); from any thread."""
        self._asked.set()

    def wait_first(self, timeout_s: float) -> bool:
        """Wait (bounded) for the first good count: whether there is one."""
        return self._first.wait(timeout_s)

    def _run(self) -> None:
        while not self._stopping.is_set():
            began = time.monotonic()
            self.count_once()
            self._asked.wait(max(0.0, began + self.next_wait - time.monotonic()))
            self._asked.clear()
            self._stopping.wait(max(0.0, began + self.gap_s - time.monotonic()))

    def count_once(self) -> bool:
        """Count now; a failure is logged once (and its end once) and leaves the last count."""
        began = time.monotonic()
        finished = self.gate.finished()  # before the count: see the module docstring
        try:
            prepared = self.count()
        except Exception as exc:
            if not self._failing:
                log.warning("prepare admission: cannot count this node's prepared rollouts: %r; "
                            "admission is off from %.0f s after the last count", exc,
                            self.gate.stale_after_s)  # fmt: skip
            self._failing = True
            return False
        if self._failing:
            log.warning("prepare admission: counting this node's prepared rollouts again")
            self._failing = False
        self.gate.counted(PreparedCount(prepared, finished, began))
        fell = self._last is not None and prepared < self._last
        self.next_wait = self.gap_s if fell else min(self.poll_s, 2 * self.next_wait)
        self._last = prepared
        self._first.set()
        return True
