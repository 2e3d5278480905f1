"""Celery's signals, connected once when the Celery app is built: logging and stage metrics.

- `setup_logging`: the stage worker logs through `configure_logging` (JSON lines, the log
  directory) instead of Celery's own setup; a forked pool child gets its own file
  (`worker_process_init`).
- `task_prerun` / `task_postrun`: the stage's log context and metrics (`stage_metrics`).

Signals are process-wide; connecting them in a process that never runs a worker (the API
publishes through a Celery app too) has no effect.
"""

from __future__ import annotations

from typing import Any

from polar_mq.config import Settings
from polar_mq.observability.logs import configure_from_settings
from polar_mq.observability.stage_metrics import install_stage_signals

PROCESS = "worker"


def install_celery_hooks(settings: Settings) -> None:
    from celery import signals

    def setup(**_: Any) -> None:
        configure_from_settings(PROCESS, settings)

    signals.setup_logging.connect(setup, weak=False, dispatch_uid="polar_mq.logging")
    signals.worker_process_init.connect(setup, weak=False, dispatch_uid="polar_mq.logging.child")
    install_stage_signals()
