"""Structured logs: the rollout context on every line, JSON off a terminal, files gathered back."""

from __future__ import annotations

import io
import json
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar_mq.observability.context import bind, current, log_context, pop, push
from polar_mq.observability.log_files import parse_rollout_id, rollout_lines
from polar_mq.observability.logs import OURS, configure_logging

log = logging.getLogger("polar_mq.tests.observability")


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    ours_level = logging.getLogger("polar_mq").level
    yield
    for handler in [h for h in root.handlers if getattr(h, OURS, False)]:
        root.removeHandler(handler)
        handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("polar_mq").setLevel(ours_level)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_context_nests_and_is_undone() -> None:
    rid = uuid.uuid4()
    with log_context(rollout_id=rid, stage="prepare"):
        bind(job_id="j", attempt=2)
        assert current() == {
            "rollout_id": rid,
            "stage": "prepare",
            "job_id": "j",
            "attempt": 2,
        }
        token = push(stage="build")
        assert current()["stage"] == "build"
        pop(token)
        assert current()["stage"] == "prepare"
    assert current() == {}


def test_json_lines_carry_the_context_and_go_to_a_file(tmp_path: Path) -> None:
    stream = io.StringIO()
    path = configure_logging("worker", "INFO", tmp_path, stream)
    assert path == tmp_path / f"worker-{os.getpid()}.jsonl"
    rid = uuid.uuid4()
    with log_context(rollout_id=rid, stage="run_agent", attempt=1, job_id="j1"):
        log.info("agent started")
    log.info("no rollout here")
    log.debug("below the level")
    logging.getLogger("some.library").info("library chatter at INFO is dropped")
    console = [json.loads(line) for line in stream.getvalue().splitlines()]
    stored = [json.loads(line) for line in path.read_text().splitlines()]
    assert console == stored
    assert [r["message"] for r in stored] == ["agent started", "no rollout here"]
    first = stored[0]
    assert first["rollout_id"] == str(rid) and first["stage"] == "run_agent"
    assert first["attempt"] == 1 and first["job_id"] == "j1"
    assert first["process"] == "worker" and first["level"] == "INFO" and first["pid"] == os.getpid()
    assert "rollout_id" not in stored[1]


def test_a_terminal_gets_text_and_a_second_setup_replaces_the_first(tmp_path: Path) -> None:
    configure_logging("api", "INFO", None, io.StringIO())
    terminal = Terminal()
    configure_logging("api", "WARNING", None, terminal)
    with log_context(rollout_id="r1", stage="build"):
        log.warning("slow build")
    log.info("not shown at WARNING")
    lines = terminal.getvalue().splitlines()
    assert len(lines) == 1
    assert "WARNING" in lines[0] and "slow build" in lines[0]
    assert lines[0].endswith("[rollout_id=r1 stage=build]")
    assert len([h for h in logging.getLogger().handlers if getattr(h, OURS, False)]) == 1


def test_a_rollouts_lines_are_gathered_in_time_order(tmp_path: Path) -> None:
    rid, other = uuid.uuid4(), uuid.uuid4()

    def line(at: str, process: str, rollout: uuid.UUID, message: str) -> str:
        record = {"timestamp": at, "process": process, "rollout_id": str(rollout)}
        return json.dumps({**record, "message": message})

    (tmp_path / "worker-1.jsonl").write_text(
        line("2026-01-01T00:00:03+00:00", "worker", rid, "third") + "\n"
        + line("2026-01-01T00:00:01+00:00", "worker", rid, "first") + "\n"
        + '{"rollout_id": "' + str(rid) + '", broken\n'
        + line("2026-01-01T00:00:02+00:00", "worker", other, "another rollout") + "\n"
    )  # fmt: skip
    nested = tmp_path / "node-b"
    nested.mkdir()
    (nested / "proxy-2.jsonl").write_text(
        line("2026-01-01T00:00:02.5+00:00", "proxy", rid, "second") + "\n"
    )
    found = rollout_lines(rid, tmp_path)
    assert [f.record["message"] for f in found] == ["first", "second", "third"]
    assert rollout_lines(uuid.uuid4(), tmp_path) == []


def test_rollout_ids_are_checked() -> None:
    assert parse_rollout_id(" 00000000-0000-0000-0000-000000000001 ").int == 1
    with pytest.raises(ValueError, match="not a rollout id"):
        parse_rollout_id("1234")
