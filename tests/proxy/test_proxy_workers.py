"""`polar-mq proxy --workers N` as real processes: one port, N servers, one supervisor.

Each worker logs its calls with its own writer and spill subdirectory; `/admin/flush` answers for
all of them; a worker that dies is restarted; SIGTERM drains them all.
"""

from __future__ import annotations

import os
import signal
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from backends_support import FakeProcess, auth, wait_until
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session
from test_spill_layout import spill_rows
from workers_support import (
    chat_body,
    fake_engines,
    live_rollouts,
    stored_calls,
    worker_proxy,
)

from polar_mq.models import LlmCall
from polar_mq.proxy.backends.rendezvous import order_of
from polar_mq.proxy.store.spill_layout import worker_spill_dir
from tests.conftest import module_database

# The module's fixtures are one database: each test starts its own proxy, so xdist may spread them.
pytestmark = pytest.mark.spread


pg_url, pg_engine = module_database("polar_mq_workers")  # it counts every row


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


def test_admin_calls_reach_every_worker_and_a_restarted_one_replays_them(
    pg_url: str, pg_engine: Engine, tmp_path: Path
) -> None:
    with (
        fake_engines(3) as (a, b, c),
        worker_proxy(pg_url, tmp_path, [a.url, b.url], pause_max_wait_s=2.0) as proxy,
    ):
        first, second = proxy.pinned(0), proxy.pinned(1)
        rollouts = iter(live_rollouts(pg_engine, 20))

        # Paused through worker 0: calls on worker 1 wait too, and go ahead on the resume (also
        # through worker 0: `second`'s one connection is busy with the held call).
        paused = first.admin("/admin/pause")
        assert paused.status_code == 200, paused.text
        assert paused.json() == {"paused": [a.url, b.url], "in_flight": 0, "drained": True}
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(second.chat, next(rollouts))
            wait_until(lambda: sum(x["waiting"] for x in proxy.backends().values()) == 1)
            assert first.admin("/admin/resume").status_code == 200  # worker 0 resumes 1 too
            assert held.result().status_code == 200
        assert first.admin("/admin/pause").status_code == 200
        # held, then refused, as by a paused single proxy (both at once: each waits out the bound)
        with ThreadPoolExecutor(2) as pool:
            calls = [pool.submit(c.chat, next(rollouts)) for c in (first, second)]
            for refused in (call.result() for call in calls):
                assert refused.status_code == 503, refused.text
                assert refused.json()["error"]["code"] == "backend_paused"
        assert second.admin("/admin/resume").status_code == 200

        # A policy version and a new backend set through one worker serve on both.
        assert second.admin("/admin/policy_version", {"version": 7}).json() == {
            a.url: 7,
            b.url: 7,
        }
        added = first.admin("/admin/backends", {"action": "add", "url": c.url, "name": "c"})
        assert added.status_code == 200, added.text
        for name in (a.url, b.url):
            assert second.admin("/admin/backends", {"action": "drain", "name": name}).is_success
        view = proxy.backends()
        assert {n: (x["draining"], x["policy_version"]) for n, x in view.items()} == {
            a.url: (True, 7),
            b.url: (True, 7),
            "c": (False, 7),  # joined at the version the others serve
        }
        newcomers = [next(rollouts) for _ in range(4)]
        for i, rollout in enumerate(newcomers):
            assert (first, second)[i % 2].chat(rollout).status_code == 200

        # Worker 1 dies (its rows stored first: a SIGKILL loses the writer's queue); its
        # successor replays the journal before it serves.
        proxy.flush()
        os.kill(second.pid, signal.SIGKILL)
        wait_until(lambda: second.pid not in proxy.pids() and len(proxy.pids()) == 2, 60)
        successor = proxy.pinned(1)
        late = next(rollouts)
        assert successor.chat(late).status_code == 200
        proxy.flush()
        served = [
            (call.backend, call.policy_version)
            for rollout in [*newcomers, late]
            for call in stored_calls(pg_engine, rollout)
        ]
        assert served == [("c", 7)] * 5
        assert proxy.stop() == 0


def test_one_rollouts_calls_keep_their_order_across_workers(
    pg_url: str, pg_engine: Engine, tmp_path: Path
) -> None:
    with fake_engines(1) as fakes, worker_proxy(pg_url, tmp_path, [f.url for f in fakes]) as proxy:
        clients = [proxy.pinned(0), proxy.pinned(1)]
        (rollout,) = live_rollouts(pg_engine, 1)
        plan = [0, 1, 0, 1, 1, 0, 0, 1, 0, 1]  # which worker serves each call, in turn
        for turn, worker in enumerate(plan):
            assert clients[worker].chat(rollout, f"call {turn}").status_code == 200
        proxy.flush()
        calls = stored_calls(pg_engine, rollout)
        assert [c.seq for c in calls] == list(range(len(plan)))  # distinct, gap-free
        texts = [c.request["messages"][0]["content"] for c in calls]
        assert texts == [f"call {turn}" for turn in range(len(plan))]  # in the order made
        assert proxy.stop() == 0


def test_a_proxy_back_with_another_worker_count_replays_every_old_spill(
    pg_url: str, pg_engine: Engine, tmp_path: Path
) -> None:
    """Rows spilled by worker 2 of a `--workers 3` proxy, then by a `--workers 2` one, are stored
    by whichever layout comes next (they used to wait forever in a directory nobody owned)."""
    spill = tmp_path / "spill"
    old = spill_rows(worker_spill_dir(spill, 2), 0, 3)
    with fake_engines(1) as fakes:
        with worker_proxy(pg_url, tmp_path, [f.url for f in fakes], workers=2) as proxy:
            wait_until(lambda: stored_ids(pg_engine, old) == {r["id"] for r in old}, 30)
            assert proxy.stop() == 0
        assert not worker_spill_dir(spill, 2).exists()
        older = spill_rows(worker_spill_dir(spill, 0), 10, 2)
        older += spill_rows(worker_spill_dir(spill, 1), 20, 2)
        with worker_proxy(pg_url, tmp_path, [f.url for f in fakes], workers=1) as proxy:
            wait_until(lambda: stored_ids(pg_engine, older) == {r["id"] for r in older}, 30)
            assert proxy.stop() == 0  # a single proxy drains, then exits cleanly
    assert not list(spill.glob("worker-*"))


def stored_ids(engine: Engine, rows: list[dict[str, Any]]) -> set[uuid.UUID]:
    with Session(engine) as session:
        query = select(LlmCall.id).where(LlmCall.id.in_([r["id"] for r in rows]))
        return set(session.scalars(query))


def test_sigterm_lets_a_stream_in_flight_finish_and_stores_it(
    pg_url: str, pg_engine: Engine, tmp_path: Path
) -> None:
    """One proxy process: SIGTERM mid-stream stops new connections, the stream runs to its end,
    the call is stored, then the process exits."""
    (rollout,) = live_rollouts(pg_engine, 1)
    body = {**chat_body(), "stream": True}
    with FakeProcess(token_delay_ms=60) as fake:
        proxy_cm = worker_proxy(pg_url, tmp_path, [fake.url], workers=1)
        with proxy_cm as proxy, httpx.Client(base_url=proxy.url, timeout=30) as client:
            with client.stream(
                "POST", "/v1/chat/completions", json=body, headers=auth(rollout)
            ) as response:
                lines = response.iter_lines()
                assert next(lines).startswith("data: ")
                proxy.proc.send_signal(signal.SIGTERM)
                rest = list(lines)
            assert "data: [DONE]" in rest
            proxy.proc.wait(60)
            with pytest.raises(httpx.TransportError):
                httpx.get(f"{proxy.url}/healthz", timeout=2)
    (call,) = stored_calls(pg_engine, rollout)
    assert call.complete and call.stream
