"""`polar-mq proxy --workers N` as real processes: one port, N servers, one supervisor.

Each worker logs its calls with its own writer and spill subdirectory; `/admin/flush` answers for
all of them; a worker that dies is restarted; SIGTERM drains them all.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

from backends_support import wait_until
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session
from workers_support import fake_engines, live_rollouts, stored_calls, worker_proxy

from polar_mq.models import LlmCall
from polar_mq.proxy.backends.rendezvous import order_of


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


def test_each_rollout_sticks_to_one_backend_whichever_worker_serves_it(
    pg_url: str, pg_engine: Engine, tmp_path: Path
) -> None:
    """100 rollouts, each call alternating between the two workers, against 3 engines."""
    with fake_engines(3) as fakes, worker_proxy(pg_url, tmp_path, [f.url for f in fakes]) as proxy:
        clients = [proxy.pinned(0), proxy.pinned(1)]
        rollouts = live_rollouts(pg_engine, 100)
        for turn in range(4):
            for i, rollout in enumerate(rollouts):
                assert clients[(i + turn) % 2].chat(rollout).status_code == 200
        for client in clients:
            client.check_worker()  # each client stayed on its worker throughout
        assert proxy.flush()["written"] == 400
        with Session(pg_engine) as session:
            rows = session.execute(
                select(LlmCall.rollout_id, LlmCall.backend).where(LlmCall.rollout_id.in_(rollouts))
            ).all()
        backends: dict[uuid.UUID, set[str]] = {}
        for rollout, backend in rows:
            backends.setdefault(rollout, set()).add(backend)
        assert len(rows) == 400 and len(backends) == 100
        assert all(len(used) == 1 for used in backends.values())
        weights = dict.fromkeys((f.url for f in fakes), 1.0)
        assert all(used == {order_of(r, weights)[0]} for r, used in backends.items())
        assert {b for used in backends.values() for b in used} == set(weights)  # all 3 used
        assert proxy.stop() == 0
