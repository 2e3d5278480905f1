"""`polar-mq proxy --workers N` as real processes: one port, N servers, one supervisor.

Each worker logs its calls with its own writer and spill subdirectory; `/admin/flush` answers for
all of them; a worker that dies is restarted; SIGTERM drains them all.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from backends_support import wait_until
from sqlalchemy import Engine
from workers_support import fake_engines, live_rollouts, stored_calls, worker_proxy


def test_two_workers_serve_one_port_and_flush_together(
    pg_url: str, pg_engine: Engine, tmp_path: Path
) -> None:
    with fake_engines(1) as fakes, worker_proxy(pg_url, tmp_path, [f.url for f in fakes]) as proxy:
        first, second = proxy.pinned(0), proxy.pinned(1)
        assert first.pid != second.pid
        rollouts = live_rollouts(pg_engine, 2)
        for rollout, client in zip(rollouts, (first, second), strict=True):
            for _ in range(3):
                assert client.chat(rollout).status_code == 200
        flushed = proxy.flush()
        assert flushed["written"] == 6  # both processes' rows, stored before the answer
        for rollout in rollouts:
            assert [c.seq for c in stored_calls(pg_engine, rollout)] == [0, 1, 2]
        spill = tmp_path / "spill"
        assert sorted(p.name for p in spill.iterdir()) == ["worker-0", "worker-1"]

        os.kill(second.pid, signal.SIGKILL)  # the supervisor starts worker 1 again
        wait_until(lambda: second.pid not in proxy.pids() and len(proxy.pids()) == 2, 60)
        again = proxy.pinned(1)
        assert again.pid != second.pid
        assert again.chat(rollouts[1]).status_code == 200
        assert proxy.flush()["written"] == 3 + 1  # worker 0, and the new worker 1 (its own count)
        assert proxy.stop() == 0
    assert "Traceback" not in proxy.log.read_text()
