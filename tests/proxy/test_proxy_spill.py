"""The durable spill buffer and its exactly-once replay, on real files and real PostgreSQL.

An outage is simulated on the writer's own engine (every statement fails as a dropped connection
would) so that these tests run in seconds; `tests/reliability/test_proxy_db_outage.py` cuts a real
network path to PostgreSQL under a real proxy process.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from proxy_support import proxy_settings
from sqlalchemy import Engine, event, func, select
from sqlalchemy.orm import Session, sessionmaker
from test_proxy_writer import call_row, count

from polar_mq.infra.db import create_db_engine
from polar_mq.models import LlmCall
from polar_mq.proxy import DbCallWriter, create_proxy_app
from polar_mq.proxy.store.call_insert import CallInserter
from polar_mq.proxy.store.spill import (
    BAD_SUFFIX,
    REFUSED_DIR,
    REFUSED_FILE,
    SUFFIX,
    SpillBuffer,
    SpillLocked,
    SpillUnavailable,
)
from polar_mq.proxy.store.spill_records import encode_rows, read_segment
from polar_mq.proxy.store.writer import CallsNotStored
from polar_mq.testing.fake_vllm import create_fake_vllm_app
from tests.conftest import module_database

# The module's fixtures are one database of its own (it counts every call row: a session stack's
# proxy on the same xdist worker may write rows into the session database), so xdist may spread it.
pytestmark = [pytest.mark.anyio, pytest.mark.spread]
pg_url, pg_engine = module_database("polar_mq_proxy_spill")


class Outage:
    """Switchable database outage on one engine: every statement fails while `down` is set."""

    def __init__(self, engine: Engine) -> None:
        self.down = False
        self.refused = 0
        event.listen(engine, "before_cursor_execute", self._check)

    def _check(self, *_: Any) -> None:
        if self.down:
            self.refused += 1
            raise psycopg.OperationalError("server closed the connection unexpectedly")


@pytest.fixture
def engine(pg_url: str) -> Iterator[Engine]:
    eng = create_db_engine(pg_url, pool_size=2)
    yield eng
    eng.dispose()


def spilling_writer(engine: Engine, spill_dir: Path, **kwargs: Any) -> DbCallWriter:
    options: dict[str, Any] = {
        "batch_size": 16,
        "flush_interval_s": 0.01,
        "retry_max_wait_s": 0.2,
        "spill_after_s": 0.05,
        "flush_timeout_s": 10.0,
    }
    options.update(kwargs)
    return DbCallWriter(engine=engine, spill_dir=spill_dir, **options)


async def flush_within(writer: DbCallWriter, timeout_s: float) -> int:
    """`flush()` again until the rows are stored or `timeout_s` passes: a writer with a short
    flush timeout (to see the outage quickly) may need more than one on a loaded machine to
    replay its spill once the database is back."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await writer.flush()
        except CallsNotStored:
            if time.monotonic() > deadline:
                raise


def stored_ids(factory: sessionmaker[Session]) -> list[uuid.UUID]:
    with factory() as session:
        return list(session.scalars(select(LlmCall.id)))


# --- the buffer alone ----------------------------------------------------------------------


def test_round_trip_restores_types_and_counts(tmp_path: Path) -> None:
    spill = SpillBuffer(tmp_path / "spill", max_bytes=1 << 20)
    spill.open()
    rows = [call_row(i) for i in range(3)]
    assert spill.append(rows[:2]) and spill.append(rows[2:])
    assert spill.rows == 3 and spill.bytes == sum(p.stat().st_size for p in spill.segments())
    read = spill.oldest()
    assert read is not None and not read.corrupt
    assert read.rows == rows  # uuid, datetime, token lists and JSON all come back equal
    spill.remove(read)
    assert (spill.rows, spill.bytes, list((tmp_path / "spill").glob(f"*{SUFFIX}"))) == (0, 0, [])
    spill.close()
    assert not (tmp_path / "spill").exists()  # nothing left to replay: no trace


def test_overflow_drops_the_newest_batch_and_counts_it(tmp_path: Path) -> None:
    first = [call_row(i) for i in range(4)]
    spill = SpillBuffer(tmp_path, max_bytes=len(encode_rows(first)) + 100)
    spill.open()
    assert spill.append(first)
    assert not spill.append([call_row(9), call_row(10)])  # would pass max_bytes
    assert (spill.rows, spill.dropped_rows) == (4, 2)
    read = spill.oldest()
    assert read is not None and read.rows == first  # what was spilled before is kept


def test_segments_rotate_and_replay_oldest_first(tmp_path: Path) -> None:
    spill = SpillBuffer(tmp_path, max_bytes=1 << 20, segment_bytes=1)  # one batch per segment
    spill.open()
    batches = [[call_row(i)] for i in range(3)]
    for batch in batches:
        spill.append(batch)
    assert len(list(tmp_path.glob(f"*{SUFFIX}"))) == 3
    for batch in batches:
        read = spill.oldest()
        assert read is not None and read.rows == batch
        spill.remove(read)
    assert spill.oldest() is None


def test_a_restarted_buffer_finds_what_the_last_one_left(tmp_path: Path) -> None:
    rows = [call_row(i) for i in range(5)]
    first = SpillBuffer(tmp_path, max_bytes=1 << 20)
    first.open()
    first.append(rows)
    first.close()
    second = SpillBuffer(tmp_path, max_bytes=1 << 20)
    second.open()
    assert second.rows == 5
    read = second.oldest()
    assert read is not None and read.rows == rows
    second.append([call_row(6)])  # a new segment after the old one, never appended to it
    assert len(list(tmp_path.glob(f"*{SUFFIX}"))) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_corrupt_tail_record_loses_only_itself(tmp_path: Path, damage: str) -> None:
    kept = [call_row(i) for i in range(3)]
    spill = SpillBuffer(tmp_path, max_bytes=1 << 20)
    spill.open()
    spill.append(kept)
    spill.append([call_row(7)])
    spill.close()
    (path,) = tmp_path.glob(f"*{SUFFIX}")
    data = bytearray(path.read_bytes())
    if damage == "truncate":  # a crash in the middle of the last append
        data = data[:-10]
    else:  # a bad sector inside the last record's payload
        data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    reopened = SpillBuffer(tmp_path, max_bytes=1 << 20)
    reopened.open()
    read = reopened.oldest()
    assert read is not None and read.corrupt and read.rows == kept
    reopened.remove(read)
    assert not path.exists() and path.with_suffix(BAD_SUFFIX).exists()  # kept for inspection


def test_one_process_per_spill_directory(tmp_path: Path) -> None:
    owner = SpillBuffer(tmp_path, max_bytes=1 << 20)
    owner.open()
    with pytest.raises(SpillLocked, match="used by another process"):
        SpillBuffer(tmp_path, max_bytes=1 << 20).open()
    owner.close()
    SpillBuffer(tmp_path, max_bytes=1 << 20).open()


def test_an_unusable_directory_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(SpillUnavailable, match="POLAR_MQ_PROXY_SPILL_DIR"):
        SpillBuffer(tmp_path / "file" / "spill", max_bytes=1 << 20).open()


# --- the writer with a spill buffer on real PostgreSQL ---------------------------------------


async def test_outage_spills_flush_waits_and_replay_stores_each_row_once(
    engine: Engine, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> None:
    outage = Outage(engine)
    writer = spilling_writer(engine, tmp_path / "spill", flush_timeout_s=0.5)
    await writer.start()
    outage.down = True
    rows = [call_row(i) for i in range(100)]
    for row in rows:
        writer.submit(row)
    with pytest.raises(CallsNotStored, match="spilled to disk"):
        await writer.flush()  # never reports spilled rows as stored
    stats = writer.stats()
    assert stats["spilled_rows"] == 100 and stats["spill_bytes"] > 0 and stats["written"] == 0
    assert count(db_session_factory) == 0 and outage.refused > 0
    outage.down = False
    assert await flush_within(writer, 10) == 100
    stats = writer.stats()
    assert (stats["spilled_rows"], stats["spill_bytes"], stats["replayed"]) == (0, 0, 100)
    assert (stats["queued"], stats["failed"], stats["dropped_overflow"]) == (0, 0, 0)
    assert sorted(stored_ids(db_session_factory)) == sorted(r["id"] for r in rows)
    await writer.close()
    assert not (tmp_path / "spill").exists()


async def test_refused_rows_are_kept_counted_and_logged_and_never_block(
    engine: Engine,
    tmp_path: Path,
    db_session_factory: sessionmaker[Session],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A poison row (here longer than its column) in a live batch and in a replayed segment:
    each is kept in `refused/`, counted and logged with its rollout; every other row is stored,
    the spill empties (nothing retried forever), and the kept rows can be replayed later."""
    outage = Outage(engine)
    writer = spilling_writer(engine, tmp_path / "spill")
    await writer.start()
    live = [call_row(0), call_row(1, model="x" * 300), call_row(2)]
    for row in live:
        writer.submit(row)
    assert await writer.flush() == 2
    outage.down = True
    spilled = [call_row(3), call_row(4, backend="b" * 300), call_row(5)]
    for row in spilled:
        writer.submit(row)
    await asyncio.sleep(0.3)
    assert writer.stats()["spilled_rows"] == 3
    outage.down = False
    assert await asyncio.wait_for(writer.flush(), 10) == 4
    stats = writer.stats()
    assert (stats["refused"], stats["refused_kept"], stats["spilled_rows"]) == (2, 2, 0)
    poison = [live[1], spilled[1]]
    expected = sorted(r["id"] for r in live + spilled if r not in poison)
    assert sorted(stored_ids(db_session_factory)) == expected
    for row in poison:
        assert any(
            str(row["rollout_id"]) in r.getMessage() and r.levelname == "ERROR"
            for r in caplog.records
        ), row["rollout_id"]
    await writer.close()
    kept, _, corrupt = read_segment(tmp_path / "spill" / REFUSED_DIR / REFUSED_FILE)
    assert not corrupt and [r["id"] for r in kept] == [r["id"] for r in poison]
    assert kept[0]["model"] == "x" * 300 and kept[0]["request"] == live[1]["request"]


async def test_flush_keeps_waiting_through_a_short_outage(
    engine: Engine, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> None:
    outage = Outage(engine)
    writer = spilling_writer(engine, tmp_path)
    await writer.start()
    outage.down = True
    for i in range(20):
        writer.submit(call_row(i))
    flush = asyncio.ensure_future(writer.flush())
    await asyncio.sleep(0.3)
    assert not flush.done() and writer.stats()["spilled_rows"] == 20
    outage.down = False
    assert await asyncio.wait_for(flush, 10) == 20
    assert count(db_session_factory) == 20
    await writer.close()


async def test_restart_replays_the_spill_directory_exactly_once(
    engine: Engine, pg_url: str, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> None:
    spill_dir = tmp_path / "spill"
    outage = Outage(engine)
    outage.down = True
    first = spilling_writer(engine, spill_dir)
    await first.start()
    rows = [call_row(i) for i in range(50)]
    for row in rows:
        first.submit(row)
    await asyncio.wait_for(first.close(), 10)  # the database is down: rows stay on disk
    assert first.stats()["spilled_rows"] == 50 and first.stats()["failed"] == 0
    # Half of them had reached the database after all (a commit whose reply was lost).
    with engine.begin() as conn:
        outage.down = False
        CallInserter(engine).insert(conn, rows[:25])
    saved = tmp_path / "saved"
    shutil.copytree(spill_dir, saved, ignore=shutil.ignore_patterns("LOCK"))

    fresh = create_db_engine(pg_url)
    second = spilling_writer(fresh, spill_dir)
    await second.start()  # replays at start, before any new row arrives
    assert await asyncio.wait_for(second.flush(), 10) == 50
    await second.close()
    assert not spill_dir.exists()
    # A crash between the commit and the deletion of a segment: it is replayed again.
    shutil.copytree(saved, spill_dir)
    third = spilling_writer(fresh, spill_dir)
    await third.start()
    await asyncio.wait_for(third.flush(), 10)
    await third.close()
    fresh.dispose()
    assert sorted(stored_ids(db_session_factory)) == sorted(r["id"] for r in rows)
    with db_session_factory() as session:
        assert session.scalar(select(func.count(func.distinct(LlmCall.id)))) == 50


async def test_full_spill_drops_and_counts_while_serving(
    engine: Engine, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> None:
    outage = Outage(engine)
    outage.down = True
    writer = spilling_writer(  # about 60 rows fit
        engine, tmp_path, batch_size=10, spill_max_bytes=40_000, flush_timeout_s=0.5,
        answer_journal=False,  # rows answered from the journal are never dropped: its own test
    )  # fmt: skip
    await writer.start()
    for i in range(200):
        writer.submit(call_row(i))
    with pytest.raises(CallsNotStored):
        await writer.flush()
    stats = writer.stats()
    assert stats["dropped_overflow"] > 0
    assert stats["spilled_rows"] + stats["dropped_overflow"] == 200
    assert stats["spill_bytes"] <= 40_000
    outage.down = False
    await flush_within(writer, 10)
    assert count(db_session_factory) == stats["spilled_rows"]
    await writer.close()


async def test_admin_flush_answers_503_while_rows_are_spilled(
    engine: Engine, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> None:
    outage = Outage(engine)
    writer = spilling_writer(engine, tmp_path, flush_timeout_s=0.3)
    fake = create_fake_vllm_app()
    app = create_proxy_app(
        proxy_settings(), upstream_transport=httpx.ASGITransport(fake), sink=writer
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://proxy") as client,
    ):
        outage.down = True
        writer.submit(call_row())
        refused = await client.post("/admin/flush")
        assert refused.status_code == 503
        body = refused.json()
        assert body["error"]["code"] == "calls_not_stored" and body["spilled_rows"] == 1
        outage.down = False
        ok = await client.post("/admin/flush")
        assert ok.status_code == 200 and ok.json()["written"] == 1
    assert count(db_session_factory) == 1


def test_a_segment_with_only_a_torn_record_is_set_aside(tmp_path: Path) -> None:
    spill = SpillBuffer(tmp_path, max_bytes=1 << 20)
    spill.open()
    spill.append([call_row()])
    spill.close()
    (path,) = tmp_path.glob(f"*{SUFFIX}")
    path.write_bytes(path.read_bytes()[:6])  # a crash inside the first record's header
    reopened = SpillBuffer(tmp_path, max_bytes=1 << 20)
    reopened.open()
    assert reopened.rows == 0 and not reopened.empty  # still there: it must be cleared
    read = reopened.oldest()
    assert read is not None and read.corrupt and read.rows == []
    reopened.remove(read)
    assert reopened.empty and path.with_suffix(BAD_SUFFIX).exists()
