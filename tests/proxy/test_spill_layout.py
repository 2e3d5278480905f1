"""Spill directories of a previous proxy layout are taken over, never left unreplayed.

A proxy that ran with `--workers 3` and comes back with 2 (or with 1, or the reverse) must
replay what every old process spilled: the buffers here are real segment files written by
`SpillBuffer`; the real-process case (a `--workers` proxy storing another layout's rows) is in
`test_proxy_workers.py`.
"""

from __future__ import annotations

import fcntl
from pathlib import Path

from test_proxy_writer import call_row

from polar_mq.proxy.store.spill import SUFFIX, SpillBuffer
from polar_mq.proxy.store.spill_layout import LOCK_NAME, orphan_spill_dirs, worker_spill_dir


def spill_rows(directory: Path, first: int, n: int) -> list[dict[str, object]]:
    """`n` rows spilled into `directory` by a process that then stopped (segments left)."""
    rows = [call_row(first + i) for i in range(n)]
    buffer = SpillBuffer(directory, max_bytes=1 << 20, segment_bytes=1)  # a segment per batch
    buffer.open()
    for row in rows:
        assert buffer.append([row])
    buffer.close()
    return rows


def replayed(buffer: SpillBuffer) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    while (read := buffer.oldest()) is not None:
        rows.extend(read.rows)
        buffer.remove(read)
    return rows


def test_which_directories_each_process_of_a_layout_takes_over(tmp_path: Path) -> None:
    for index in range(5):
        worker_spill_dir(tmp_path, index).mkdir()
    (tmp_path / "worker-x").mkdir()  # not a worker directory
    names = [p.name for p in orphan_spill_dirs(tmp_path)]
    assert names == [f"worker-{i}" for i in range(5)]  # a single proxy takes every one
    assert orphan_spill_dirs(tmp_path, 0, 2) == [
        tmp_path,
        tmp_path / "worker-2",
        tmp_path / "worker-4",
    ]
    assert orphan_spill_dirs(tmp_path, 1, 2) == [tmp_path / "worker-3"]
    assert orphan_spill_dirs(tmp_path, 2, 5) == []  # the layout that wrote them: nothing extra


def test_fewer_workers_replay_every_row_of_the_old_ones_exactly_once(tmp_path: Path) -> None:
    spilled = {i: spill_rows(worker_spill_dir(tmp_path, i), 10 * i, 3) for i in range(3)}
    seen: list[dict[str, object]] = []
    for index in range(2):  # the proxy came back with --workers 2
        own = worker_spill_dir(tmp_path, index)
        buffer = SpillBuffer(own, 1 << 20, adopt_from=orphan_spill_dirs(tmp_path, index, 2))
        buffer.open()
        seen += replayed(buffer)
        buffer.close()
    expected = [row for rows in spilled.values() for row in rows]
    assert sorted(r["seq"] for r in seen) == sorted(r["seq"] for r in expected)  # type: ignore[type-var]
    assert {r["id"] for r in seen} == {r["id"] for r in expected}
    assert not worker_spill_dir(tmp_path, 2).exists()  # emptied and removed


def test_a_single_proxy_takes_over_its_workers_and_workers_take_over_a_single(
    tmp_path: Path,
) -> None:
    first = spill_rows(worker_spill_dir(tmp_path, 0), 0, 2) + spill_rows(
        worker_spill_dir(tmp_path, 1), 2, 2
    )
    single = SpillBuffer(tmp_path, 1 << 20, adopt_from=orphan_spill_dirs(tmp_path))
    single.open()
    assert single.rows == 4
    single.close()  # stopped again before the database came back: the rows stay in `tmp_path`
    assert {p.name for p in tmp_path.iterdir()} >= {f"00000000000{i}{SUFFIX}" for i in range(4)}
    child = SpillBuffer(
        worker_spill_dir(tmp_path, 0), 1 << 20, adopt_from=orphan_spill_dirs(tmp_path, 0, 2)
    )
    child.open()  # --workers 2: child 0 takes what the single proxy left in the base directory
    assert {r["id"] for r in replayed(child)} == {r["id"] for r in first}
    assert not list(tmp_path.glob(f"*{SUFFIX}"))


def test_a_directory_a_running_proxy_owns_is_left_to_it(tmp_path: Path) -> None:
    rows = spill_rows(worker_spill_dir(tmp_path, 1), 0, 2)
    with (worker_spill_dir(tmp_path, 1) / LOCK_NAME).open("ab") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # an old proxy still running
        single = SpillBuffer(tmp_path, 1 << 20, adopt_from=orphan_spill_dirs(tmp_path))
        single.open()
        assert single.rows == 0
        single.close()
    assert len(list(worker_spill_dir(tmp_path, 1).glob(f"*{SUFFIX}"))) == len(rows)


def test_refused_rows_stay_for_the_operator(tmp_path: Path) -> None:
    old = worker_spill_dir(tmp_path, 3)
    spill_rows(old, 0, 1)
    refused = old / "refused" / "rows.seg"
    refused.parent.mkdir()
    refused.write_bytes(b"kept")
    buffer = SpillBuffer(worker_spill_dir(tmp_path, 0), 1 << 20, adopt_from=[old])
    buffer.open()
    assert buffer.rows == 1
    assert refused.read_bytes() == b"kept" and not list(old.glob(f"*{SUFFIX}"))
