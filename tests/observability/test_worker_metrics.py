"""Worker-side metrics without a stack: queue depths read from Redis, outcome labels, warm hits,
and the proxy's line per call."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from polar_mq.config import Settings
from polar_mq.dispatch.celery_app import create_celery, publish_messages
from polar_mq.lifecycle.messages import StageMessage, queue_name
from polar_mq.lifecycle.stages import Stage
from polar_mq.observability.stage_metrics import observe_outcome, outcome_of, stage_metrics
from polar_mq.proxy.store.call_log import CallLogSink
from polar_mq.proxy.store.sink import MemoryCallSink
from polar_mq.workers.node_metrics import NodeCollector
from tests.e2e.stack import REDIS_E2E_URL


def test_queue_depth_is_read_from_the_broker_at_scrape(tmp_path: Path) -> None:
    prefix = f"obs{uuid.uuid4().hex[:8]}"
    settings = Settings(
        broker_url=REDIS_E2E_URL, queue_prefix=prefix, pool="p", runtime_root=tmp_path
    )
    app = create_celery(settings)
    queue = queue_name(prefix, Stage.PREPARE, "p", None)
    try:
        publish_messages(app, [StageMessage(Stage.PREPARE, uuid.uuid4(), "p") for _ in range(3)])
        registry = CollectorRegistry()
        registry.register(NodeCollector(settings, [queue]))
        text = generate_latest(registry).decode()
        assert f'polar_queue_depth{{queue="{queue}"}} 3.0' in text
        assert "polar_node_broker_up 1.0" in text
        assert 'polar_warm_pool_runtimes{state="idle"} 0.0' in text
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
        app.close()


def test_an_unreachable_broker_is_reported_not_raised(tmp_path: Path) -> None:
    settings = Settings(broker_url="redis://127.0.0.1:1/0", runtime_root=tmp_path)
    registry = CollectorRegistry()
    registry.register(NodeCollector(settings, ["polar.prepare.default"]))
    assert "polar_node_broker_up 0.0" in generate_latest(registry).decode()


@pytest.mark.parametrize(
    ("result", "outcome"),
    [
        ("done", "done"), ("skipped:completed", "skipped"), ("failed:runtime_error", "failed"),
        ("retry:2", "retry"), ("restart:requeued", "restart"), ("lease_lost", "lease_lost"),
        (RuntimeError("boom"), "error"), (None, "error"),
    ],
)  # fmt: skip
def test_outcome_labels(result: object, outcome: str) -> None:
    assert outcome_of(result) == outcome


def test_warm_pool_hits_and_misses_are_told_apart() -> None:
    takes = stage_metrics().warm_pool
    before = {r: takes.labels(r)._value.get() for r in ("hit", "miss")}
    observe_outcome(
        Stage.PREPARE,
        {"runtime_id": "warm-" + "a" * 12 + "-" + "1" * 12, "runtime": {"source": "pool"}},
    )
    observe_outcome(
        Stage.PREPARE,
        {"runtime_id": "warm-" + "a" * 12 + "-" + "2" * 12, "runtime": {"source": "cold"}},
    )
    observe_outcome(Stage.PREPARE, {"runtime_id": "abc-1", "runtime": {"source": "cold"}})
    observe_outcome(Stage.BUILD, {"runtime": {"source": "pool"}})
    assert takes.labels("hit")._value.get() == before["hit"] + 1
    assert takes.labels("miss")._value.get() == before["miss"] + 1


def test_the_proxy_logs_a_rollouts_first_call_and_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = MemoryCallSink()
    sink = CallLogSink(inner)
    rid = uuid.uuid4()
    row = {"rollout_id": rid, "attempt": 1, "api_type": "chat", "complete": True, "latency_ms": 5.0}
    with caplog.at_level(logging.INFO, logger="polar_mq.proxy.calls"):
        sink.submit({**row, "seq": 0, "status_code": 200})
        sink.submit({**row, "seq": 1, "status_code": 200})
        sink.submit({**row, "seq": 2, "status_code": 502, "complete": False})
    assert len(inner.rows) == 3
    assert [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records] == [
        ("INFO", "call 0"), ("WARNING", "call 2"),
    ]  # fmt: skip
    assert {getattr(r, "rollout_id", None) for r in caplog.records} == {str(rid)}


def test_a_taken_metrics_port_stops_the_node_with_a_message(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        env = {
            **os.environ,
            "POLAR_MQ_WORKER_METRICS_PORT": str(port),
            "POLAR_MQ_RUNTIME_ROOT": str(tmp_path),
        }
        argv = [sys.executable, "-m", "polar_mq.cli", "worker", "--stages", "build"]
        argv += ["--no-janitor", "--no-warm-pool"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, said
    assert f"cannot serve node metrics on port {port}" in said
    assert "Traceback" not in said


WRITE_A_COUNTER = """
from prometheus_client import Counter
Counter("polar_demo_total", "a stage worker's count").inc(5)
"""


def test_a_metrics_file_still_being_created_is_left_out_of_the_scrape(tmp_path: Path) -> None:
    """A worker that starts creates its file empty, then sizes it: a scrape in between answered
    500 (`struct.error`) before the node's collector left such files out."""
    from prometheus_client.multiprocess import MultiProcessCollector

    from polar_mq.workers.node_metrics import SettledFilesCollector

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", WRITE_A_COUNTER], env=env, check=True, timeout=60)
    (tmp_path / "counter_99999.db").touch()  # a process between creating and sizing its file
    plain = CollectorRegistry()
    MultiProcessCollector(plain, path=str(tmp_path))
    with pytest.raises(Exception, match="unpack"):
        generate_latest(plain)
    registry = CollectorRegistry()
    SettledFilesCollector(registry, path=str(tmp_path))
    assert "polar_demo_total 5.0" in generate_latest(registry).decode()


def test_a_file_removed_while_scraping_makes_the_scrape_list_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prometheus_client.multiprocess import MultiProcessCollector

    from polar_mq.workers.node_metrics import SettledFilesCollector

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", WRITE_A_COUNTER], env=env, check=True, timeout=60)
    real_merge = MultiProcessCollector.merge
    calls: list[list[str]] = []

    def merge_racing_a_dead_process(files: list[str], accumulate: bool = True) -> object:
        calls.append(list(files))
        if len(calls) == 1:
            raise FileNotFoundError(files[0])
        return real_merge(files, accumulate)

    monkeypatch.setattr(MultiProcessCollector, "merge", staticmethod(merge_racing_a_dead_process))
    registry = CollectorRegistry()
    SettledFilesCollector(registry, path=str(tmp_path))
    assert "polar_demo_total 5.0" in generate_latest(registry).decode()
    assert len(calls) == 2
