"""The demo's embedded broker (kombu's SQLAlchemy transport on SQLite) across processes.

kombu creates a queue's row on the first publish to it, guarded by a lock of one process only;
several processes publishing to new queues at once made kombu's own channel raise
`IntegrityError` and then fail every later publish of that process (3 runs of this test's
workload against kombu's channel: every one lost messages).

The publishers are separate interpreters, as the demo's workers are: forked children of a test
process inherit whatever lock another thread of it held at the fork, and one of them hung CI for
the whole wait. Each publisher connects, says so, and publishes only when every one has connected;
whatever it raises is reported by name, so a failure reads as one, never as a timeout.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

from kombu import Connection

from polar_mq.config import Settings
from polar_mq.dispatch.celery_app import create_celery

TRANSPORT = "polar_mq.dispatch.embedded_broker:Transport"
PUBLISHERS = 3
QUEUES = 50
"""Enough: kombu's own channel lost messages in 3 runs of 3 at 50 queues as at 200."""

PUBLISHER = f"""
import json, sys
failed = []
try:
    from kombu import Connection
    with Connection(sys.argv[1], transport={TRANSPORT!r}) as conn:
        producer = conn.Producer()
        conn.default_channel  # connected: the barrier below waits for every publisher
        print("ready", flush=True)
        sys.stdin.readline()
        for i in range({QUEUES}):
            try:
                producer.publish({{"i": i}}, routing_key=f"q{{i}}", exchange="", declare=[])
            except Exception as exc:  # every failure is counted; the test names them
                failed.append(type(exc).__name__)
except Exception as exc:
    failed.append("setup: " + repr(exc))
print(json.dumps(failed), flush=True)
"""


def test_processes_publishing_to_new_queues_at_once_lose_no_message(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'broker.db'}"
    with Connection(url, transport=TRANSPORT) as conn:  # tables created, as the demo's start does
        conn.Producer().publish({"warm": 1}, routing_key="warm", exchange="", declare=[])
    publishers = [
        subprocess.Popen(
            [sys.executable, "-c", PUBLISHER, url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(PUBLISHERS)
    ]
    try:
        readiness = [p.stdout.readline().strip() for p in publishers if p.stdout]
        for p in publishers:
            if p.stdin:
                p.stdin.write("go\n")
                p.stdin.flush()  # communicate() closes it
        outputs = [p.communicate(timeout=180) for p in publishers]
    finally:
        for p in publishers:
            p.kill()
    assert readiness == ["ready"] * PUBLISHERS, [err for _, err in outputs]
    failures = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert failures == [[]] * PUBLISHERS
    with sqlite3.connect(tmp_path / "broker.db") as db:
        queues = db.execute("SELECT count(*) FROM kombu_queue WHERE name LIKE 'q%'").fetchone()[0]
        messages = db.execute("SELECT count(*) FROM kombu_message").fetchone()[0]
    assert (queues, messages) == (QUEUES, PUBLISHERS * QUEUES + 1)


def test_the_celery_app_on_an_embedded_url_uses_this_transport() -> None:
    app = create_celery(Settings(broker_url="sqla+sqlite:///unused.db"))
    assert app.conf.broker_transport == TRANSPORT
