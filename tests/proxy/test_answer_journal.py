"""The answer journal (`proxy.store.journal`): rows made durable on local disk before the answer,
committed in batches after it, handed to the spill buffer when the database is unreachable, and
never taken over from a live process. The writer's cases run on real PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from polar_mq.config import Settings
from polar_mq.infra.ports import free_port
from polar_mq.models import LlmCall
from polar_mq.proxy.store import journal as journal_module
from polar_mq.proxy.store import spill as spill_module
from polar_mq.proxy.store.journal import JOURNAL_FILES, AnswerJournal
from polar_mq.proxy.store.spill import SpillBuffer
from polar_mq.proxy.store.spill_layout import adopt_segments, journal_dir
from polar_mq.proxy.store.spill_records import count_rows, read_segment
from polar_mq.proxy.store.writer import DbCallWriter
from tests.conftest import module_database

pytestmark = [pytest.mark.anyio, pytest.mark.spread]
pg_url, pg_engine = module_database("polar_mq_answer_journal")
LINGER_S = 30.0
"""The writer's batching wait: a commit seen within a test's seconds was not waited for."""


def row(seq: int = 0) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(), "rollout_id": uuid.uuid4(), "seq": seq, "backend": "b",
        "model": "m", "api_type": "chat", "stream": False, "policy_version": 0,
        "status_code": 200, "complete": True, "request": {"messages": []}, "response": {},
        "prompt_ids": list(range(50)), "completion_ids": [5, 6], "logprobs": [-0.5, -0.25],
        "finish_reason": "stop", "latency_ms": 1.0, "ttft_ms": None,
        "created_at": datetime.now(UTC),
    }  # fmt: skip


def killed(journal: AnswerJournal) -> None:
    """What a kill -9 does to a journal: its files and lock are closed as they are."""
    for file in journal._files:
        file.close_handle()
    assert journal._lock is not None
    journal._lock.close()


def ids_on_disk(directory: Path) -> list[str]:
    return [str(r["id"]) for s in sorted(directory.glob("**/*.seg")) for r in read_segment(s)[0]]


def stored(engine: Engine, rows: list[dict[str, Any]]) -> int:
    with engine.connect() as conn:
        query = select(func.count()).where(LlmCall.id.in_([r["id"] for r in rows]))
        return int(conn.execute(query).scalar() or 0)


# --- the journal alone --------------------------------------------------------------------------


def test_a_failed_write_is_overwritten_so_later_records_stay_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = AnswerJournal(tmp_path / "journal")
    assert journal.open()
    first, second, third = [row(0)], [row(1)], [row(2)]
    assert journal.append(first)
    real_sync = os.fdatasync

    def failing(fd: int) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(journal_module.os, "fdatasync", failing)
    assert not journal.append(second)  # not in the journal: the caller stores it another way
    monkeypatch.setattr(journal_module.os, "fdatasync", real_sync)
    assert journal.append(third)
    path = journal.path
    rows, _, corrupt = read_segment(path)
    assert [r["id"] for r in rows] == [first[0]["id"], third[0]["id"]] and not corrupt
    assert journal.rows == 2 and count_rows(path) == 2
    journal.rotate()
    journal.clear_retired()
    assert read_segment(path) == ([], 0, False) and journal.rows == 0
    journal.close()
    assert not journal.directory.exists()  # an empty journal leaves nothing behind


def test_the_file_is_recycled_and_read_only_up_to_its_end_mark(tmp_path: Path) -> None:
    """Emptied, the file keeps its blocks and the next records overwrite them (an fdatasync
    then flushes data only); a reader stops at the end mark, before the older rows."""
    journal = AnswerJournal(tmp_path / "journal")
    assert journal.open()
    assert journal.append([row(0), row(1)]) and journal.append([row(2)])
    first = journal.path
    size = first.stat().st_size
    journal.rotate()  # a commit takes the first file's rows; records go to the other meanwhile
    between = [row(9)]
    assert journal.append(between) and journal.path != first
    journal.clear_retired()
    journal.rotate()  # the next commit: the first file is active again
    assert journal.path == first
    newer = [row(3)]
    assert journal.append(newer)
    assert first.stat().st_size == size  # overwritten in place, not grown
    rows, records, corrupt = read_segment(first)
    assert [r["id"] for r in rows] == [newer[0]["id"]] and (records, corrupt) == (1, False)
    assert count_rows(first) == 1 and journal.rows == 2
    spill = tmp_path / "after-a-kill"  # a killed process's journal: the next one adopts it
    spill.mkdir()
    killed(journal)
    assert adopt_segments(spill, [journal.directory]) == 2  # both files: neither is committed
    assert sorted(ids_on_disk(spill)) == sorted(str(r[0]["id"]) for r in (between, newer))


def test_rows_found_in_the_file_at_start_are_set_aside_never_overwritten(
    tmp_path: Path,
) -> None:
    left = AnswerJournal(tmp_path / "journal")
    assert left.open() and left.append([row(0)])
    killed(left)
    journal = AnswerJournal(tmp_path / "journal")  # not taken over first (never done so)
    assert journal.open() and journal.append([row(1)])
    assert len(ids_on_disk(journal.directory)) == 2  # both, in two segments
    journal.close()


def test_a_live_journal_is_not_taken_over_and_a_dead_one_is(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    journal = AnswerJournal(journal_dir(spill))
    assert journal.open()
    journal.append([row()])
    other = tmp_path / "other"
    other.mkdir()
    assert adopt_segments(other, [journal_dir(spill)]) == 0  # locked: its owner lives
    assert (journal_dir(spill) / JOURNAL_FILES[0]).exists()
    killed(journal)  # a killed process: its lock goes with it
    assert adopt_segments(other, [journal_dir(spill)]) == 1
    assert len(ids_on_disk(other)) == 1 and not journal_dir(spill).exists()


def test_a_handed_over_journal_is_spill_backlog(tmp_path: Path) -> None:
    buffer = SpillBuffer(tmp_path, 1 << 20)
    buffer.open()
    journal = AnswerJournal(journal_dir(tmp_path))
    assert journal.open()
    journal.append([row(0), row(1)])
    journal.rotate()
    journal.append([row(5)])  # arrived during the commit: stays journaled
    assert journal.hand_over_retired(buffer)
    assert (buffer.rows, buffer.spilled_total, journal.rows) == (2, 2, 1)
    read = buffer.oldest()
    assert read is not None and len(read.rows) == 2
    journal.rotate()
    journal.append([row(2)])  # a fresh file where the handed-over one was
    assert journal.rows == 2 and read.segment.path != journal.path
    journal.close()
    buffer.close()


def test_a_hand_over_that_cannot_move_the_file_keeps_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database and the disk failing at once: the rows stay journaled (and the file where
    a takeover finds it), never half handed over; a later hand-over moves them."""
    buffer = SpillBuffer(tmp_path, 1 << 20)
    buffer.open()
    journal = AnswerJournal(journal_dir(tmp_path))
    assert journal.open() and journal.append([row(0), row(1)])
    journal.rotate()

    def failing(source: Any, target: Any) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(spill_module.os, "rename", failing)
    assert not journal.hand_over_retired(buffer)
    assert (journal.rows, buffer.rows, buffer.spilled_total) == (2, 0, 0)
    assert len(ids_on_disk(journal.directory)) == 2
    assert journal.append([row(2)])  # the active file still takes records
    with pytest.raises(RuntimeError):
        journal.rotate()  # one file retired at a time: its rows are not forgotten
    monkeypatch.undo()
    assert journal.hand_over_retired(buffer)
    assert (journal.rows, buffer.rows) == (1, 2)
    journal.close()
    buffer.close()


def test_a_written_journal_syncs_only_what_outlives_its_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sync=False` ("write"): records go to the page cache (a kill of the process spares them)
    with no fdatasync per answer; a file handed to the spill buffer, or left at close for the
    next process, is synced first, since it is the rows' only copy from then on."""
    synced: list[int] = []
    real_sync = os.fdatasync

    def counting(fd: int) -> None:
        synced.append(fd)
        real_sync(fd)

    monkeypatch.setattr(journal_module.os, "fdatasync", counting)
    buffer = SpillBuffer(tmp_path, 1 << 20)
    buffer.open()
    journal = AnswerJournal(journal_dir(tmp_path), sync=False)
    assert journal.open()
    for i in range(5):
        assert journal.append([row(i)])
    assert synced == [] and len(ids_on_disk(journal.directory)) == 5
    journal.rotate()
    assert journal.append([row(5)])
    assert journal.hand_over_retired(buffer) and len(synced) == 1
    journal.close()  # one row left: synced for the next process, which takes it over
    assert len(synced) == 2 and len(ids_on_disk(journal.directory)) == 1
    buffer.close()
    assert AnswerJournal(tmp_path / "other")._files[0].sync  # the default: each record synced


# --- the writer with its journal ----------------------------------------------------------------


async def journaled(writer: DbCallWriter, n: int) -> list[dict[str, Any]]:
    """Submit `n` rows and wait until they are durable, as an answer does."""
    rows = [row(i) for i in range(n)]
    for r in rows:
        writer.submit(r)
    await asyncio.wait_for(writer.durable(), 10)
    return rows


async def until_stored(engine: Engine, rows: list[dict[str, Any]], within_s: float = 10) -> int:
    deadline = time.monotonic() + within_s
    while stored(engine, rows) < len(rows) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return stored(engine, rows)


@pytest.mark.parametrize("journal_sync", [True, False], ids=["fdatasync", "write"])
async def test_an_answer_waits_for_the_journal_not_the_commit(
    pg_url: str, tmp_path: Path, pg_engine: Engine, journal_sync: bool
) -> None:
    spill = tmp_path / "spill"
    writer = DbCallWriter(
        pg_url, spill_dir=spill, flush_interval_s=LINGER_S, journal_sync=journal_sync
    )
    await writer.start()
    try:
        rows = await journaled(writer, 3)
        assert ids_on_disk(spill) == [str(r["id"]) for r in rows]  # fsynced before the answer
        stats = writer.stats()
        assert (stats["journal_rows"], stats["spilled_rows"], stats["spilled_total"]) == (3, 0, 0)
        assert stored(pg_engine, rows) == 0  # the commit waits for the linger, or a flush
        started = time.monotonic()
        assert await asyncio.wait_for(writer.flush(), 10) == 3
        assert time.monotonic() - started < LINGER_S / 3
        assert stored(pg_engine, rows) == 3
        assert ids_on_disk(spill) == [] and writer.stats()["journal_rows"] == 0
    finally:
        await writer.close()
    assert not spill.exists()  # a clean stop leaves no file behind


async def test_a_waiting_stage_hurries_the_commit(
    pg_url: str, tmp_path: Path, pg_engine: Engine
) -> None:
    writer = DbCallWriter(pg_url, spill_dir=tmp_path / "spill", flush_interval_s=LINGER_S)
    await writer.start()
    try:
        rows = await journaled(writer, 1)
        writer.hurry()  # what the call receipts' hurry channel does
        assert await until_stored(pg_engine, rows) == 1
    finally:
        await writer.close()


@pytest.mark.parametrize(("linger_s", "batch_size"), [(0.2, 256), (LINGER_S, 2)])
async def test_the_journal_is_committed_at_the_linger_or_a_full_batch(
    pg_url: str, tmp_path: Path, pg_engine: Engine, linger_s: float, batch_size: int
) -> None:
    """Nobody asks: the rows go in when the linger is over, or as soon as a batch is full."""
    writer = DbCallWriter(
        pg_url, spill_dir=tmp_path / "spill", flush_interval_s=linger_s, batch_size=batch_size
    )
    await writer.start()
    try:
        rows = await journaled(writer, 2)
        assert await until_stored(pg_engine, rows) == 2
    finally:
        await writer.close()


async def test_an_unreachable_database_turns_the_journal_into_spill_backlog(
    pg_url: str, tmp_path: Path, pg_engine: Engine
) -> None:
    spill = tmp_path / "spill"
    down = DbCallWriter(
        f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x",
        spill_dir=spill, flush_interval_s=0.1, spill_after_s=0.2, retry_max_wait_s=0.2,
    )  # fmt: skip
    await down.start()
    rows = [row(i) for i in range(2)]
    down.submit(rows[0])
    await asyncio.wait_for(down.durable(), 15)  # journaled: the database was not tried yet
    deadline = time.monotonic() + 20
    handed = (1, 0)  # the spill buffer counts the row a moment before the journal forgets it
    while time.monotonic() < deadline:
        if (down.stats()["spilled_rows"], down.stats()["journal_rows"]) == handed:
            break
        await asyncio.sleep(0.05)
    assert (down.stats()["spilled_rows"], down.stats()["journal_rows"]) == handed
    down.submit(rows[1])  # while down: spilled directly
    await asyncio.wait_for(down.durable(), 15)
    await down.close()
    assert sorted(ids_on_disk(spill)) == sorted(str(r["id"]) for r in rows)
    up = DbCallWriter(pg_url, spill_dir=spill)
    await up.start()
    try:
        await asyncio.wait_for(up.flush(), 15)
        assert stored(pg_engine, rows) == 2
        assert up.stats()["replayed"] == 2
    finally:
        await up.close()
    assert ids_on_disk(spill) == []


async def test_journaled_rows_are_never_dropped_for_the_spill_bound(tmp_path: Path) -> None:
    """Rows journaled before the outage is seen were answered: handed over, they are kept
    whole even past `spill_max_bytes` (the bytes were on the disk already), and count toward
    it, so the rows that come next, spilled directly, are the ones dropped."""
    spill = tmp_path / "spill"
    down = DbCallWriter(
        f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x",
        spill_dir=spill, spill_max_bytes=5_000, flush_interval_s=0.05, spill_after_s=0.2,
        retry_max_wait_s=5.0,
    )  # fmt: skip
    await down.start()
    try:
        answered = await journaled(down, 40)
        deadline = time.monotonic() + 20
        while down.stats()["journal_rows"] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stats = down.stats()
        assert (stats["journal_rows"], stats["spilled_rows"]) == (0, 40)
        assert stats["spill_bytes"] > 5_000 and stats["dropped_overflow"] == 0
        assert sorted(ids_on_disk(spill)) == sorted(str(r["id"]) for r in answered)
        down.submit(row())  # the database known down: spilled directly, and the bound is full
        await asyncio.wait_for(down.durable(), 10)
        assert down.stats()["dropped_overflow"] == 1
    finally:
        await down.close()


async def test_a_journal_that_cannot_write_commits_directly(
    pg_url: str, tmp_path: Path, pg_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(journal_module.os, "fdatasync", failing)
    writer = DbCallWriter(pg_url, spill_dir=tmp_path / "spill", flush_interval_s=LINGER_S)
    await writer.start()
    try:
        rows = [row()]
        writer.submit(rows[0])
        await asyncio.wait_for(writer.durable(), 10)
        assert stored(pg_engine, rows) == 1  # committed before the answer, as without a journal
        assert writer.stats()["journal_rows"] == 0
    finally:
        await writer.close()


async def test_a_written_journal_takes_the_row_on_the_serving_loop(
    pg_url: str, tmp_path: Path, pg_engine: Engine
) -> None:
    """`write` mode: `submit` itself writes the row to the journal, so it is on the page cache
    when `submit` returns and the answer has nothing to wait for; the writer thread only
    commits. Ten rows journaled one by one are ten records, committed by one flush."""
    spill = tmp_path / "spill"
    writer = DbCallWriter(pg_url, spill_dir=spill, flush_interval_s=LINGER_S, journal_sync=False)
    await writer.start()
    try:
        first = await journaled(writer, 1)  # the writer's store is up from here on
        groups = writer.stats()["groups"]
        journal = writer._journal
        assert journal is not None
        appended_on: list[str] = []
        append = journal.append

        def watched(rows: list[dict[str, Any]]) -> bool:
            appended_on.append(threading.current_thread().name)
            return append(rows)

        journal.append = watched  # type: ignore[method-assign]
        rows = [row(i) for i in range(10)]
        for r in rows:
            writer.submit(r)
            assert writer.pending == 0
        assert appended_on == [threading.current_thread().name] * 10
        assert sorted(ids_on_disk(spill)) == sorted(str(r["id"]) for r in first + rows)
        assert writer.stats()["groups"] == groups + 10
        waited = writer.durable()  # a coroutine that returns at once: nothing is pending
        await asyncio.wait_for(waited, 0.5)
        assert stored(pg_engine, first + rows) == 0  # the commit waits for the linger, or a flush
        assert await asyncio.wait_for(writer.flush(), 10) == 11
        assert stored(pg_engine, first + rows) == 11 and ids_on_disk(spill) == []
    finally:
        await writer.close()
    assert not spill.exists()


@pytest.mark.parametrize("journal_sync", [True, False], ids=["fdatasync", "write"])
async def test_a_journal_whose_disk_fails_leaves_rows_to_the_writer_thread(
    pg_url: str,
    tmp_path: Path,
    pg_engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    journal_sync: bool,
) -> None:
    """A journal write that fails (disk full) in either mode: the answer waits for the row's
    commit, as without a journal, and later rows are not lost either."""
    writer = DbCallWriter(
        pg_url, spill_dir=tmp_path / "spill", flush_interval_s=LINGER_S, journal_sync=journal_sync
    )
    await writer.start()
    try:
        before = await journaled(writer, 1)  # the store is up: `write` journals on the loop

        def failing(*args: Any) -> int:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(journal_module.os, "pwrite", failing)
        rows = [row(i) for i in range(3)]
        for r in rows:
            writer.submit(r)
        await asyncio.wait_for(writer.durable(), 10)
        assert stored(pg_engine, rows) == 3  # committed before the answer
        monkeypatch.undo()
        assert await asyncio.wait_for(writer.flush(), 10) == 4
        assert stored(pg_engine, before) == 1 and writer.stats()["journal_rows"] == 0
    finally:
        await writer.close()


SLOW_INSERT = """
CREATE OR REPLACE FUNCTION polar_test_slow_insert() RETURNS trigger AS $$
BEGIN
    IF NEW.model = 'slow-insert' THEN PERFORM pg_sleep(1.5); END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE OR REPLACE TRIGGER polar_test_slow_insert BEFORE INSERT ON llm_calls
    FOR EACH ROW EXECUTE FUNCTION polar_test_slow_insert();
"""
"""Only rows of model `slow-insert` wait: the module's other tests share the database."""


@pytest.mark.parametrize("journal_sync", [True, False], ids=["fdatasync", "write"])
async def test_a_flush_asked_during_the_commit_waits_for_it(
    pg_url: str, tmp_path: Path, pg_engine: Engine, journal_sync: bool
) -> None:
    """A stage's flush landing while the journaled rows are being committed (a 10 MB call took
    13 s here) must not return before they are in the database: it once did, and the stage
    built a trajectory without the call."""
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(SLOW_INSERT)
    writer = DbCallWriter(
        pg_url, spill_dir=tmp_path / "spill", flush_interval_s=0.05, journal_sync=journal_sync
    )
    await writer.start()
    try:
        rows = [{**row(), "model": "slow-insert"}]
        writer.submit(rows[0])
        await asyncio.wait_for(writer.durable(), 10)
        await asyncio.sleep(0.5)  # past the linger: the commit is in the trigger's sleep
        assert stored(pg_engine, rows) == 0
        await asyncio.wait_for(writer.flush(), 10)
        assert stored(pg_engine, rows) == 1
    finally:
        await writer.close()


@pytest.mark.parametrize("journal_sync", [True, False], ids=["fdatasync", "write"])
async def test_answers_are_journaled_while_a_commit_runs(
    pg_url: str, tmp_path: Path, pg_engine: Engine, journal_sync: bool
) -> None:
    """A commit runs beside the journaling: a call answered while the journal's rows are being
    committed waits for its own fsync, not for that commit (it once waited: every answer of the
    proxy stalled at each commit)."""
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(SLOW_INSERT)
    spill = tmp_path / "spill"
    writer = DbCallWriter(pg_url, spill_dir=spill, flush_interval_s=0.05, journal_sync=journal_sync)
    await writer.start()
    try:
        slow = [{**row(), "model": "slow-insert"}]
        writer.submit(slow[0])
        await asyncio.wait_for(writer.durable(), 10)
        await asyncio.sleep(0.3)  # past the linger: the commit is in the trigger's 1.5 s sleep
        assert stored(pg_engine, slow) == 0
        started = time.monotonic()
        during = await journaled(writer, 2)
        assert time.monotonic() - started < 0.75  # answered before the running commit ended
        assert stored(pg_engine, slow + during) == 0
        assert {str(r["id"]) for r in slow + during} == set(ids_on_disk(spill))  # both files
        assert writer.stats()["journal_rows"] == 3
        await asyncio.wait_for(writer.flush(), 10)
        assert stored(pg_engine, slow + during) == 3 and ids_on_disk(spill) == []
    finally:
        await writer.close()


SLOW_COMMIT = """
CREATE OR REPLACE FUNCTION polar_test_slow_commit() RETURNS trigger AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM added WHERE model = 'slow-commit') THEN
        PERFORM pg_sleep(0.05);
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE OR REPLACE TRIGGER polar_test_slow_commit AFTER INSERT ON llm_calls
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION polar_test_slow_commit();
"""
"""Every statement holding a row of model `slow-commit` takes 50 ms more."""


@pytest.mark.parametrize("journal_sync", [True, False], ids=["fdatasync", "write"])
async def test_a_flush_returns_under_steady_load(
    pg_url: str, tmp_path: Path, pg_engine: Engine, journal_sync: bool
) -> None:
    """Rows keep arriving during every commit, so the journal is never empty when one ends: a
    flush waits for the rows submitted before it, not for an empty journal (never, here)."""
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(SLOW_COMMIT)
    writer = DbCallWriter(
        pg_url, spill_dir=tmp_path / "spill", flush_interval_s=0.02, journal_sync=journal_sync
    )
    await writer.start()
    load_on = True

    async def load() -> None:
        while load_on:
            writer.submit({**row(), "model": "slow-commit"})
            await asyncio.wait_for(writer.durable(), 10)
            await asyncio.sleep(0.002)

    task = asyncio.create_task(load())
    try:
        await asyncio.sleep(0.3)
        before = await journaled(writer, 3)
        for _ in range(3):
            await asyncio.wait_for(writer.flush(), 10)
            assert stored(pg_engine, before) == 3
            assert writer.stats()["journal_rows"] > 0  # the load goes on
    finally:
        load_on = False
        await task
        await writer.close()


async def test_a_proxy_takes_over_the_journals_of_its_own_and_an_old_layout(
    pg_url: str, tmp_path: Path, pg_engine: Engine
) -> None:
    """Killed with journaled rows: a single proxy's journal, and the journal of worker 3 of an
    earlier `--workers 4` proxy beside that worker's spill segment. The single proxy that comes
    back commits all three rows and leaves no orphan directory behind."""
    spill = tmp_path / "spill"
    old_worker = spill / "worker-3"
    left: list[dict[str, Any]] = []
    for directory in (journal_dir(spill), journal_dir(old_worker)):
        journal = AnswerJournal(directory)
        assert journal.open()
        rows = [row()]
        journal.append(rows)
        left += rows
        killed(journal)  # killed: the lock goes with the process
    segment = SpillBuffer(old_worker, 1 << 20)
    segment.open()
    left.append(row())
    segment.append(left[-1:])
    segment.close()
    writer = DbCallWriter.from_settings(
        Settings(database_url=pg_url, proxy_spill_dir=spill, secret_key="s" * 32)
    )
    await writer.start()
    try:
        await asyncio.wait_for(writer.flush(), 15)
        assert stored(pg_engine, left) == 3
    finally:
        await writer.close()
    assert not old_worker.exists() and not spill.exists()
