"""Call logging off the request path: the request only enqueues a dict; a thread writes batches.

`DbCallWriter` keeps a bounded queue (a full queue drops and counts, it never blocks a request),
and one background thread with its own engine turns up to `batch_size` rows, or whatever arrived
within `flush_interval_s`, into one multi-row `INSERT ... ON CONFLICT (id) DO NOTHING`
(`call_insert`). `submit` appends to a deque without a lock and wakes the thread only when it
sleeps for lack of rows. Where a batch goes when the database is down is `call_store`'s business:
with a spill directory it lands in a local durable buffer (`spill`), replayed exactly once when the
database is back, also after a restart; without one it is retried in place. After each commit
the committed rows' ids go to their attempts' call receipts (`call_receipts`), which the run-agent
stage waits on instead of calling `flush()` through the proxy.

`flush()` returns only when every row submitted before it is committed to the database: rows
that sit in the spill buffer are not stored yet, so flush keeps waiting for the replay and, after
`flush_timeout_s`, raises `CallsNotStored` (the proxy answers 503, so the run-agent stage never
builds a trajectory from a partial set of calls).

`durable()` is the weaker wait the request path uses before an answer leaves the proxy: every row
submitted so far is committed *or* fsynced to the spill buffer (which the next process replays).
A proxy killed with -9 right after answering then still has the call: "calls an agent saw
answered = calls stored" holds across proxy crashes, not only clean stops. It costs the call one
commit round trip, not a commit of its own: the rows of the calls answered during a commit go in
the next batch together (group commit), so the thread never lingers for more rows.
With a spill directory the group is made durable by the answer journal instead (`journal`:
an fsync answers it, the rows are committed in batches later, on a thread of their own so that
no answer waits for a commit: `journal_commits`; `answer_journal=False`: off). A journal written
without fdatasync (`journal_sync=False`) is written by `submit` itself, on the serving loop:
the row is durable when `submit` returns, and `durable()` has nothing to wait for.
`durable_answers=False` (`POLAR_MQ_PROXY_DURABLE_ANSWERS=false`) makes `durable()` return at once:
the old answer-first behaviour, for a deployment that prefers the latency (bench/proxy figures in
docs/multihost.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Engine

from polar_mq.config import Settings
from polar_mq.proxy.store.call_store import CallStore
from polar_mq.proxy.store.journal import AnswerJournal
from polar_mq.proxy.store.journal_commits import JournaledCommits
from polar_mq.proxy.store.receipts import StoredReceipts
from polar_mq.proxy.store.sink import CallSink, MemoryCallSink
from polar_mq.proxy.store.spill import SpillBuffer
from polar_mq.proxy.store.spill_layout import journal_dir, taken_over
from polar_mq.proxy.store.waiters import FlushWaiter, expire, resolve, resolve_all
from polar_mq.proxy.store.writer_engine import create_writer_engine

if TYPE_CHECKING:
    from polar_mq.proxy.server.worker_slot import WorkerSlot

logger = logging.getLogger(__name__)

__all__ = ["CallSink", "CallsNotStored", "DbCallWriter", "MemoryCallSink"]

_WAKE = object()
_STOP = object()
_ENDS = (_WAKE, _STOP)
_Waiter = tuple[int, asyncio.AbstractEventLoop, "asyncio.Future[None]"]
"""A durable() waiting for that many rows to be committed, journaled or spilled."""


class CallsNotStored(RuntimeError):
    """flush() timed out (or the writer stopped) with rows not yet in the database."""


class DbCallWriter:
    """Bounded asynchronous batch writer of `llm_calls` rows (see the module docstring)."""

    def __init__(
        self,
        database_url: str | None = None,
        *,
        engine: Engine | None = None,
        batch_size: int = 256,
        flush_interval_s: float = 0.05,
        queue_max: int = 100_000,
        retry_max_wait_s: float = 5.0,
        close_timeout_s: float = 10.0,
        spill_dir: Path | None = None,
        spill_max_bytes: int = 1 << 30,
        spill_after_s: float = 1.0,
        flush_timeout_s: float = 20.0,
        spill_adopt_from: Sequence[Path] = (),
        receipts_url: str | None = None,
        durable_answers: bool = True,
        answer_journal: bool = True,
        journal_sync: bool = True,
    ) -> None:
        if (database_url is None) == (engine is None):
            raise ValueError("give exactly one of database_url or engine")
        self._url = database_url
        self._engine = engine
        self._batch_size = batch_size
        self._interval = flush_interval_s
        self._retry_max_wait = retry_max_wait_s
        self._spill_after = spill_after_s
        self._close_timeout = close_timeout_s
        self._flush_timeout = flush_timeout_s
        self._receipts = StoredReceipts(receipts_url) if receipts_url else None
        self._spill = (
            SpillBuffer(spill_dir, spill_max_bytes, adopt_from=spill_adopt_from)
            if spill_dir is not None
            else None
        )
        self._queue: deque[Any] = deque()
        self._queue_max = queue_max
        self._signal = threading.Event()
        """Wakes the thread: from `submit` only while it waits for a first row (`_idle`), from a
        flush or close always."""
        self._idle = False
        self._lock = threading.Lock()
        self._waiters: list[FlushWaiter] = []
        self._durable_answers = durable_answers
        self._journal = (
            AnswerJournal(journal_dir(spill_dir), sync=journal_sync)
            if spill_dir is not None and durable_answers and answer_journal
            else None
        )
        self._commits: JournaledCommits | None = None
        """The journal's rows and their commits, once the journal is open (`start`)."""
        self._journal_inline = not journal_sync
        """`submit` journals rows itself (module docstring), once the journal is open."""
        self._inline: JournaledCommits | None = None
        """The commits `submit` journals into: set by `start` when `_journal_inline`."""
        self._durable_waiters: deque[_Waiter] = deque()
        """durable() calls, in submission order (their targets never decrease)."""
        self._durable_late = 0
        self._thread: threading.Thread | None = None
        self._store: CallStore | None = None
        self._closing = False
        self._give_up_at: float | None = None
        self._submitted = 0
        self._done = 0
        self._dropped = 0
        self._groups = 0
        """Groups of rows made durable (or stored) one at a time: rows per group is what a
        group commit gathers, and every group costs the writer the same fixed work."""
        self._groups_inline = 0
        """Rows journaled by `submit` (each a group of its own), counted on the serving loop."""

    @classmethod
    def from_settings(cls, settings: Settings, worker: WorkerSlot | None = None) -> DbCallWriter:
        """The writer of a single proxy, or of child `worker` of a `--workers N` one (whose
        settings already name its own spill subdirectory); either takes over the spill
        directories the proxy's previous layout left behind (`spill_layout`)."""
        spill = settings.proxy_spill_path
        orphans: list[Path] = []
        if spill is not None:
            orphans = taken_over(spill, *((worker.index, worker.count) if worker else ()))
        return cls(
            settings.database_url,
            batch_size=settings.log_batch_size,
            flush_interval_s=settings.log_flush_interval_s,
            queue_max=settings.log_queue_max,
            spill_dir=settings.proxy_spill_path,
            spill_max_bytes=settings.proxy_spill_max_bytes,
            flush_timeout_s=settings.proxy_flush_timeout_s,
            spill_adopt_from=orphans,
            receipts_url=settings.call_receipts_redis_url,
            durable_answers=settings.proxy_durable_answers,
            answer_journal=settings.proxy_answer_journal,
            journal_sync=settings.proxy_journal_sync == "fdatasync",
        )

    async def start(self) -> None:
        """Open the spill directory (a locked one fails here, loudly) and start the thread."""
        if self._thread is None:
            if self._spill is not None:
                self._spill.open()
            if self._journal is not None and self._journal.open():
                self._commits = JournaledCommits(
                    self._journal,
                    interval_s=self._interval,
                    batch_size=self._batch_size,
                    wake=self._signal.set,
                )
                if self._journal_inline:
                    self._inline = self._commits
            self._thread = threading.Thread(target=self._run, name="call-writer", daemon=True)
            self._thread.start()

    def submit(self, row: dict[str, Any]) -> None:
        if self._closing:
            self._dropped += 1
            return
        if len(self._queue) >= self._queue_max:
            self._dropped += 1
            if self._dropped & (self._dropped - 1) == 0:  # log at 1, 2, 4, 8, ... drops
                logger.error("call log queue full: %d calls dropped so far", self._dropped)
            return
        inline = self._inline
        if inline is not None and self._journal_now(inline, row):
            return
        self._queue.append(row)
        self._submitted += 1
        if self._idle:
            self._signal.set()

    def _journal_now(self, commits: JournaledCommits, row: dict[str, Any]) -> bool:
        """Journal `row` on the caller's thread (`write` mode, module docstring); False: the
        writer thread takes it as usual. Only while no row waits for that thread, so rows are
        durable in the order they were submitted (a `durable()` waits for a count of them), and
        while the database is up (while down, rows go to the spill buffer, as queued rows do)."""
        store = self._store
        if store is None or store.down or self._done != self._submitted:
            return False
        journaled = commits.keep([row])
        if not journaled:
            return False  # logged by the journal; the writer thread stores it another way
        with self._lock:
            self._submitted += 1
            self._done += 1
        self._groups_inline += 1
        if commits.wants_commit(journaled):
            self._signal.set()
        return True

    async def flush(self) -> int:
        """Wait until the rows submitted so far are committed; `CallsNotStored` on timeout."""
        target = self._submitted
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiter = FlushWaiter(target, loop, future)
        with self._lock:
            if self._ready(waiter):
                return self.written
            self._waiters.append(waiter)
        if self._thread is None or not self._thread.is_alive():
            with self._lock:
                self._waiters.remove(waiter)
            raise CallsNotStored("the call writer is not running")
        self._poke()
        try:
            await asyncio.wait_for(future, self._flush_timeout)
        except TimeoutError:
            with self._lock:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            raise CallsNotStored(self._not_stored_message()) from None
        return self.written

    async def durable(self) -> None:
        """Wait until every row submitted so far is committed or spilled to disk (module
        docstring). Never raises: past `flush_timeout_s` (a database down and no spill
        directory) the call is answered anyway, its row still queued, and counted
        (`durable_late`)."""
        target = self._submitted
        if not self._durable_answers or self._done >= target:
            return
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._done >= target:
                return
            self._durable_waiters.append((target, loop, future))
        # a timer rather than `asyncio.wait_for`, which costs twice the await itself (a waiter
        # future and callbacks per call), on every answer
        expiry = loop.call_later(self._flush_timeout, expire, future)
        try:
            await future
        except TimeoutError:
            self._durable_late += 1
            if self._durable_late & (self._durable_late - 1) == 0:
                logger.error(
                    "a call was answered before its row was durable (%d so far): %s",
                    self._durable_late,
                    self._not_stored_message(),
                )
        finally:
            expiry.cancel()

    async def close(self) -> None:
        """Store what is queued (spilled if the database is down; lost after `close_timeout_s`
        only when there is no spill directory), then stop the thread."""
        if self._closing:
            return
        self._closing = True
        self._give_up_at = time.monotonic() + self._close_timeout
        thread = self._thread
        if thread is None:
            return
        self._queue.append(_STOP)
        self._signal.set()
        await asyncio.to_thread(thread.join, self._close_timeout + self._retry_max_wait + 1.0)
        if thread.is_alive():
            logger.error("call writer did not stop in time; %d rows pending", self.pending)

    @property
    def pending(self) -> int:
        return self._submitted - self._done

    @property
    def written(self) -> int:
        return self._store.written if self._store else 0

    def stats(self) -> dict[str, int]:
        """Counters since start; `spilled_rows`/`spill_bytes` are what waits on disk now."""
        store = self._store
        spill = self._spill
        return {
            "queued": self.pending,
            "written": self.written,
            "spilled_rows": spill.rows if spill else 0,
            "spill_bytes": spill.bytes if spill else 0,
            "spilled_total": spill.spilled_total if spill else 0,
            "replayed": store.replayed if store else 0,
            "dropped": self._dropped,
            "dropped_overflow": spill.dropped_rows if spill else 0,
            "failed": store.failed if store else 0,
            "refused": store.refused if store else 0,
            "refused_kept": spill.refused_kept if spill else 0,
            "durable_late": self._durable_late,
            "groups": self._groups + self._groups_inline,
            "journal_rows": self._commits.rows if self._commits else 0,
        }

    def _ready(self, waiter: FlushWaiter) -> bool:
        if self._done < waiter.target:
            return False
        commits = self._commits
        if commits is not None:
            if waiter.journal_mark is None:  # the target rows are kept: journaled by now if ever
                waiter.journal_mark = commits.journaled_total
            if commits.settled_total < waiter.journal_mark:
                return False
        backlog = self._store.backlog if self._store else (self._spill.rows if self._spill else 0)
        return backlog == 0

    def _not_stored_message(self) -> str:
        s = self.stats()
        return (
            f"call rows not yet in the database after {self._flush_timeout:g}s: "
            f"{s['spilled_rows']} spilled to disk awaiting replay, {s['queued']} queued "
            "(database unreachable?)"
        )

    def hurry(self) -> None:
        """Commit what is queued now rather than after the batching wait (a stage waits)."""
        if self._queue or (self._commits is not None and self._commits.rows):
            self._poke()

    def _poke(self) -> None:
        """Cut the current batch's wait short so a flush does not wait for the interval."""
        self._queue.append(_WAKE)
        self._signal.set()

    # --- writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        engine: Engine | None = None
        try:
            engine = self._engine or create_writer_engine(cast(str, self._url))
            store = CallStore(
                engine,
                self._spill,
                batch_size=self._batch_size,
                retry_max_wait_s=self._retry_max_wait,
                spill_after_s=self._spill_after,
                closing=self._should_give_up,
                committed=self._receipts.record if self._receipts else None,
            )
            self._store = store
            stop = False
            while not stop:
                batch, stop, woken = self._collect(self._first_wait(store))
                if batch:
                    self._keep(store, batch)
                    self._groups += 1
                self._mark_done(len(batch))
                commits = self._commits
                if commits is not None:
                    if woken:
                        commits.hurry()
                    if commits.advance(store):
                        self._mark_done(0)
                if not stop and not (commits is not None and commits.busy) and store.replay():
                    self._mark_done(0)
            if self._commits is not None:
                self._commits.finish(store)
                self._mark_done(0)
        except BaseException:  # pragma: no cover - a bug here must not hang flush() forever
            logger.exception("call writer thread crashed")
            raise
        finally:
            if self._commits is not None:
                self._commits.close()
            if self._journal is not None:
                self._journal.close()
            if self._spill is not None:
                self._spill.close()
            if engine is not None and self._engine is None:
                engine.dispose()
            if self._receipts is not None:
                self._receipts.close()
            self._mark_done(0, release_all=True)

    def _first_wait(self, store: CallStore) -> float | None:
        """How long to wait for a first row: until the store's next probe (None: for ever), and
        no later than the journaled rows' commit. While a commit runs, until it ends (it wakes
        the thread): the store is the commit's until then."""
        commits = self._commits
        if commits is not None and commits.busy:
            return None
        hint = store.wait_hint()
        due = commits.wait_s() if commits is not None else None
        if due is None:
            return hint
        return due if hint is None else min(hint, due)

    def _keep(self, store: CallStore, batch: list[dict[str, Any]]) -> None:
        """Make `batch` durable: in the answer journal (committed later), or stored now (the
        database, or the spill buffer while it is down or the journal's disk fails)."""
        commits = self._commits
        if commits is not None and not store.down and commits.keep(batch):
            return
        if commits is not None:  # the store is the running commit's: wait for it to end
            commits.settle(store, wait=True)
        store.store(batch)

    def _collect(self, first_wait: float | None) -> tuple[list[dict[str, Any]], bool, bool]:
        """The next batch, whether the writer was asked to stop after it, and whether a flush
        or a waiting stage asked for what is kept to be committed now.

        Blocks up to `first_wait` for a first row (None: until one comes), then waits once for
        `flush_interval_s` (cut short by a flush or close) unless a batch is already queued;
        while spilled rows wait for replay, or when answers wait for their rows (`durable`), it
        never lingers.
        """
        rows = self._queue
        if not rows:
            self._idle = True
            if not rows:  # re-checked after `_idle` is published: no row can slip past
                self._signal.wait(first_wait)
            self._idle = False
            self._signal.clear()
            if not rows:
                return [], False, False
        if (
            not self._durable_answers  # every answer waits for its row: a linger is pure latency
            and first_wait is None
            and len(rows) < self._batch_size
            and rows[-1] not in _ENDS
        ):
            self._signal.wait(self._interval)  # more rows come meanwhile: one batch, one wait
            self._signal.clear()
        batch: list[dict[str, Any]] = []
        while rows and len(batch) < self._batch_size:
            item = rows.popleft()
            if item is _STOP:
                return batch, True, True
            if item is _WAKE:
                return batch, False, True
            batch.append(item)
        return batch, False, False

    def _should_give_up(self) -> bool:
        return self._give_up_at is not None and time.monotonic() >= self._give_up_at

    def _mark_done(self, n: int, release_all: bool = False) -> None:
        with self._lock:
            self._done += n
            durable = self._durable_waiters
            settled: list[asyncio.Future[None]] = []
            loop: asyncio.AbstractEventLoop | None = None
            while durable and (release_all or durable[0][0] <= self._done):
                _, loop, future = durable.popleft()
                settled.append(future)
            ready: list[tuple[FlushWaiter, BaseException | None]] = []
            waiting: list[FlushWaiter] = []
            for waiter in self._waiters:
                if self._ready(waiter):
                    ready.append((waiter, None))
                elif release_all:
                    ready.append((waiter, CallsNotStored(self._not_stored_message())))
                else:
                    waiting.append(waiter)
            self._waiters = waiting
        if settled and loop is not None:  # one wake-up of the serving loop for the whole batch
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(resolve_all, settled)
        for waiter, error in ready:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                waiter.loop.call_soon_threadsafe(resolve, waiter.future, error)
