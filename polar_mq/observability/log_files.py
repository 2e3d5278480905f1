"""Gathering one rollout's lines back from the JSON-lines files of every process.

Every process writes `<process>-<pid>.jsonl` under `POLAR_MQ_LOG_DIR` (see `logs`); on a
cluster that is a shared volume, or the files are copied into one directory (subdirectories
are searched too). A line is the rollout's when its `rollout_id` field says so; lines are
returned in time order across files. A line that is not JSON (a crashed process's half line)
is skipped.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

PATTERN = "*.jsonl"
EPOCH = datetime.fromtimestamp(0, UTC)


class LogDirMissing(Exception):
    """The log directory does not exist (or is not a directory)."""


@dataclass(frozen=True, slots=True)
class LogLine:
    at: datetime
    record: dict[str, Any]
    file: Path


def parse_rollout_id(text: str) -> uuid.UUID:
    """The rollout id in `text`; ValueError with a message for anything else."""
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a rollout id (a UUID)") from None


def rollout_lines(rollout_id: uuid.UUID, log_dir: Path) -> list[LogLine]:
    """Every line about `rollout_id` in the files under `log_dir`, oldest first."""
    if not log_dir.is_dir():
        raise LogDirMissing(f"log directory {log_dir} does not exist")
    wanted = str(rollout_id)
    needle = wanted.encode()
    found = [
        LogLine(_timestamp(record), record, path)
        for path in sorted(log_dir.rglob(PATTERN))
        for record in _records(path, needle)
        if record.get("rollout_id") == wanted
    ]
    found.sort(key=lambda line: line.at)
    return found


def _records(path: Path, needle: bytes) -> Iterator[dict[str, Any]]:
    try:
        with path.open("rb") as lines:
            for raw in lines:
                if needle not in raw:  # cheap test before parsing
                    continue
                try:
                    record = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(record, dict):
                    yield record
    except OSError:  # rotated away or unreadable: the other files still tell the story
        return


def _timestamp(record: dict[str, Any]) -> datetime:
    try:
        at = datetime.fromisoformat(str(record.get("timestamp")))
    except ValueError:
        return EPOCH
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def format_line(line: LogLine) -> str:
    """One line for a terminal: time, process, level, logger, message, stage and attempt."""
    r = line.record
    where = " ".join(f"{key}={r[key]}" for key in ("stage", "attempt") if key in r)
    text = (
        f"{line.at.isoformat(timespec='milliseconds')} {r.get('process', '?')}[{r.get('pid', '?')}]"
        f" {r.get('level', '?')} {r.get('logger', '?')}: {r.get('message', '')}"
    )
    if where:
        text += f" ({where})"
    if r.get("exc_info"):
        text += "\n" + str(r["exc_info"])
    return text
