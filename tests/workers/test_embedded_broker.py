"""The demo's embedded broker (kombu's SQLAlchemy transport on SQLite) across processes.

kombu creates a queue's row on the first publish to it, guarded by a lock of one process only;
several processes publishing to new queues at once made kombu's own channel raise
`IntegrityError` and then fail every later publish of that process (3 runs of this test's
workload against kombu's channel: every one lost messages).

Each publish is a SQLite commit: on a loaded machine (the whole suite on a slow host) 600 of them
took over a minute, so the test publishes to 50 queues and waits up to 3 minutes.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from pathlib import Path

from kombu import Connection

from polar_mq.config import Settings
from polar_mq.workers.celery_app import create_celery

TRANSPORT = "polar_mq.workers.embedded_broker:Transport"
PUBLISHERS = 3
QUEUES = 50
"""Enough: kombu's own channel lost messages in 3 runs of 3 at 50 queues as at 200."""


def _publish_to_new_queues(url: str, start_at: float, errors: multiprocessing.Queue) -> None:
    """Publish one message to each of `QUEUES` new queues through one producer, as a stage worker
    does, from `start_at` on; put the errors' names (or nothing) on `errors`."""
    failed: list[str] = []
    with Connection(url, transport=TRANSPORT) as conn:
        producer = conn.Producer()
        while time.time() < start_at:
            time.sleep(0.001)
        for i in range(QUEUES):
            try:
                producer.publish({"i": i}, routing_key=f"q{i}", exchange="", declare=[])
            except Exception as exc:  # every failure is counted; the test names them
                failed.append(type(exc).__name__)
    errors.put(failed)


def test_processes_publishing_to_new_queues_at_once_lose_no_message(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'broker.db'}"
    with Connection(url, transport=TRANSPORT) as conn:  # tables created, as the demo's start does
        conn.Producer().publish({"warm": 1}, routing_key="warm", exchange="", declare=[])
    context = multiprocessing.get_context("fork")
    errors: multiprocessing.Queue = context.Queue()
    start_at = time.time() + 1.0  # every publisher connected before the first publish
    publishers = [
        context.Process(target=_publish_to_new_queues, args=(url, start_at, errors))
        for _ in range(PUBLISHERS)
    ]
    for p in publishers:
        p.start()
    failures = [errors.get(timeout=180) for _ in publishers]
    for p in publishers:
        p.join(timeout=10)
    assert failures == [[]] * PUBLISHERS
    with sqlite3.connect(tmp_path / "broker.db") as db:
        queues = db.execute("SELECT count(*) FROM kombu_queue WHERE name LIKE 'q%'").fetchone()[0]
        messages = db.execute("SELECT count(*) FROM kombu_message").fetchone()[0]
    assert (queues, messages) == (QUEUES, PUBLISHERS * QUEUES + 1)


def test_the_celery_app_on_an_embedded_url_uses_this_transport() -> None:
    app = create_celery(Settings(broker_url="sqla+sqlite:///unused.db"))
    assert app.conf.broker_transport == TRANSPORT
