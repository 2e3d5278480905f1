"""A worker node's `/metrics`: its stage workers' metrics summed, plus what is read at scrape.

`polar-mq worker` (the node's supervisor) serves one port (`POLAR_MQ_WORKER_METRICS_PORT`) for
every stage worker it runs. The stage workers are separate processes (and with `--pool-impl
prefork`, each has children), so they write their metrics to files in a directory of the node's
own (prometheus-client's multiprocess mode, `PROMETHEUS_MULTIPROC_DIR` in their environment) and
the supervisor sums them when scraped. The directory is emptied at start (a restarted node does
not count its previous life twice) and removed at exit; a stage worker that dies and is restarted
keeps its counts (its files stay).

Read at scrape time, in the supervisor:
- `polar_queue_depth{queue}`: messages waiting in each queue this node consumes (one broker
  round trip per queue; the broker being down leaves them out and sets `polar_node_broker_up` 0);
- `polar_warm_pool_runtimes{state}`: this node's warm runtimes (markers on disk) by state.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from polar_mq.config import Settings
from polar_mq.runtimes.warm_pool import STATES, WarmPool

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from celery import Celery

log = logging.getLogger(__name__)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class NodeCollector(Collector):
    """Queue depths and warm-pool runtimes, read when scraped."""

    def __init__(self, settings: Settings, queues: Sequence[str]) -> None:
        self.settings = settings
        self.queues = sorted(set(queues))
        self.warm_pool = WarmPool(settings.runtime_root, settings.warm_pool_max_per_node)
        self._celery: Celery | None = None

    def _app(self) -> Celery:
        if self._celery is None:
            from polar_mq.dispatch.celery_app import create_celery

            self._celery = create_celery(self.settings)
        return self._celery

    def collect(self) -> Iterator[Metric]:
        from polar_mq.dispatch.celery_app import queue_depth

        depth = GaugeMetricFamily(
            "polar_queue_depth",
            "Stage messages waiting in a queue this node consumes",
            labels=["queue"],
        )
        up = 1
        for queue in self.queues:
            count = queue_depth(self._app(), queue)
            if count is None:
                up = 0
                break
            depth.add_metric([queue], count)
        yield depth
        yield GaugeMetricFamily(
            "polar_node_broker_up", "Whether the queue depths could be read", value=up
        )
        census = self.warm_pool.census()
        runtimes = GaugeMetricFamily(
            "polar_warm_pool_runtimes", "This node's warm-pool runtimes by state", labels=["state"]
        )
        for state in STATES:
            runtimes.add_metric([state], census.counts.get(state, 0))
        yield runtimes
        yield GaugeMetricFamily(
            "polar_warm_pool_max",
            "Warm-pool runtimes this node keeps at most",
            value=self.settings.warm_pool_max_per_node,
        )


class SettledFilesCollector(MultiProcessCollector):
    """prometheus-client's multiprocess sum, minus the files a process is still creating.

    A stage worker (or a pool child) that starts creates its metrics file empty and only then
    sizes it; a scrape in that instant read the empty file and answered 500 (`struct.error`, seen
    in the suite when a node started its workers). Such a file holds no value yet, so it is left
    out of this scrape; a file removed between listing and reading (a dead process's, by
    `mark_process_dead`) makes the scrape list the directory again."""

    def __init__(self, registry: CollectorRegistry, path: str) -> None:
        self.directory = path  # before registering: an auto-describing registry collects then
        super().__init__(registry, path=path)  # type: ignore[no-untyped-call]

    def collect(self) -> Iterator[Metric]:
        attempts = 3
        for attempt in range(1, attempts + 1):
            files = [f for f in glob.glob(os.path.join(self.directory, "*.db")) if _sized(f)]
            try:
                return iter(self.merge(files, accumulate=True))  # type: ignore[no-untyped-call]
            except FileNotFoundError:
                if attempt == attempts:
                    raise
        raise AssertionError("unreachable")


def _sized(path: str) -> bool:
    """Whether the file has its header (an 8-byte used-size word), i.e. it is past creation."""
    try:
        return os.path.getsize(path) >= 8
    except OSError:
        return False


class NodeMetrics:
    """The node's metrics directory and HTTP server; `env` is what the stage workers need."""

    def __init__(self, settings: Settings, queues: Sequence[str], port: int) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix=f"polar-mq-metrics-{settings.node_name}-"))
        self.registry = CollectorRegistry(auto_describe=True)
        SettledFilesCollector(self.registry, path=str(self.directory))
        self.registry.register(NodeCollector(settings, queues))
        self.host = settings.metrics_host
        self.port = port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def env(self) -> dict[str, str]:
        """The stage workers' environment: this process's plus the metrics directory."""
        return {**os.environ, MULTIPROC_ENV: str(self.directory)}

    def start(self) -> NodeMetrics:
        self._server, self._thread = start_http_server(self.port, self.host, self.registry)
        log.info("node metrics on http://%s:%d/metrics", self.host, self.port)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        shutil.rmtree(self.directory, ignore_errors=True)


def serve_node_metrics(settings: Settings, queues: Sequence[str]) -> NodeMetrics | None:
    """Start the node's `/metrics` when `POLAR_MQ_WORKER_METRICS_PORT` is set; else None."""
    if settings.worker_metrics_port is None:
        return None
    metrics = NodeMetrics(settings, queues, settings.worker_metrics_port)
    try:
        return metrics.start()
    except OSError:  # the port is taken: no directory left behind
        metrics.stop()
        raise
