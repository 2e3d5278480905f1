"""One logging setup per process: JSON lines off a terminal, a JSON-lines file per process.

Every polar_mq process (API, proxy, worker node, stage worker, sweeper) calls `configure_logging`
once at start. Lines go to stderr as before, as JSON when stderr is not a terminal (containers,
log shippers) and as readable text on one; with `POLAR_MQ_LOG_DIR` set each process also appends
JSON lines to `<dir>/<process>-<pid>.jsonl`, the files `polar-mq logs ROLLOUT` reads. Every line
carries the rollout fields bound in its context (`polar_mq.observability.context`).

The `polar_mq` loggers log at `POLAR_MQ_LOG_LEVEL` (default INFO); other libraries at WARNING, so
a debug level shows our own detail without every SQL statement and HTTP header.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from typing import IO, Any

from pythonjsonlogger.orjson import OrjsonFormatter

from polar_mq.observability.context import FIELDS, ContextFilter

OURS = "_polar_mq_handler"
"""Marks the handlers installed here, so a second call (a forked pool child) replaces them."""
LIBRARY_LEVEL = logging.WARNING


class JsonLines(OrjsonFormatter):
    """One JSON object per line: timestamp, level, logger, message, process, then bound fields."""

    def __init__(self, process: str) -> None:
        super().__init__(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger"},
            static_fields={"process": process, "host": socket.gethostname()},
            timestamp=True,
        )

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        super().add_fields(log_data, record, message_dict)
        log_data["pid"] = record.process


class Text(logging.Formatter):
    """Human-readable lines, the bound rollout fields at the end: `[rollout_id=… stage=…]`."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        bound = [f"{key}={getattr(record, key)}" for key in FIELDS if hasattr(record, key)]
        return f"{line} [{' '.join(bound)}]" if bound else line


def log_file(log_dir: Path, process: str, pid: int | None = None) -> Path:
    """Where `process` (this pid by default) writes its JSON lines under `log_dir`."""
    return log_dir / f"{process}-{pid or os.getpid()}.jsonl"


def configure_logging(
    process: str,
    level: str | int = "INFO",
    log_dir: Path | None = None,
    stream: IO[str] | None = None,
) -> Path | None:
    """Install this process's handlers (replacing earlier ones); the JSON-lines file, if any.

    `process` names the process in every line and in the file name (api, proxy, node, worker,
    sweeper). `stream` defaults to stderr; its being a terminal picks text over JSON.
    """
    stream = stream if stream is not None else sys.stderr
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, OURS, False)]:
        root.removeHandler(handler)
        handler.close()
    handlers: list[logging.Handler] = []
    console = logging.StreamHandler(stream)
    console.setFormatter(Text() if _is_terminal(stream) else JsonLines(process))
    handlers.append(console)
    path = None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        path = log_file(log_dir, process)
        file_handler = logging.FileHandler(path, encoding="utf-8", delay=True)  # at 1st line
        file_handler.setFormatter(JsonLines(process))
        handlers.append(file_handler)
    for handler in handlers:
        handler.addFilter(ContextFilter())
        setattr(handler, OURS, True)
        root.addHandler(handler)
    root.setLevel(LIBRARY_LEVEL)
    logging.getLogger("polar_mq").setLevel(_level(level))
    return path


def configure_from_settings(process: str, settings: Any) -> Path | None:
    """`configure_logging` with the level and directory of `settings` (a `Settings`)."""
    return configure_logging(process, settings.log_level, settings.log_dir)


def _level(level: str | int) -> int:
    if isinstance(level, int):
        return level
    value = logging.getLevelName(level.strip().upper())
    return value if isinstance(value, int) else logging.INFO


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real stream
        return False
