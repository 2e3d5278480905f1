"""The `openai_agents` preset's command line, config and environment (no install, no network)."""

from __future__ import annotations

import ast
import json
import shlex
from pathlib import Path

import pytest

from polar_mq.harnesses import get_harness
from polar_mq.harnesses.presets.harness import PresetHarness
from polar_mq.harnesses.presets.openai_agents import (
    ANSWER_FILE,
    CONFIG_FILE,
    DRIVER,
    DRIVER_FILE,
    TRANSCRIPT_FILE,
)
from tests.harnesses.test_command import make_ctx

ROOT = Path("/opt/harnesses")


def _harness(options: dict[str, object] | None = None) -> PresetHarness:
    harness = get_harness({"type": "openai_agents", "options": options or {}})
    assert isinstance(harness, PresetHarness)
    return harness


def test_command_runs_the_driver_with_the_install_python() -> None:
    ctx = make_ctx(workdir="/ws", harness_root=ROOT)
    harness = _harness({"max_turns": 7})
    argv = shlex.split(harness.command(ctx).split(" && exec ", 1)[1])
    assert argv == [
        "/opt/harnesses/openai_agents/0.24.0/venv/bin/python",
        f"/ws/{DRIVER_FILE}",
        "--max-turns",
        "7",
        "--api",
        "responses",
        "--config",
        f"/ws/{CONFIG_FILE}",
    ]
    assert harness.command(ctx).startswith("mkdir -p /ws/.polar/home && exec ")


def test_chat_api_and_version_override() -> None:
    ctx = make_ctx(workdir="/ws", harness_root=ROOT)
    harness = get_harness(
        {"type": "openai_agents", "version": "0.23.1", "options": {"api": "chat"}}
    )
    command = harness.command(ctx)
    assert "/opt/harnesses/openai_agents/0.23.1/venv/bin/python" in command
    assert "--api chat" in command


def test_files_are_the_driver_and_its_config() -> None:
    ctx = make_ctx(workdir="/ws", harness_root=ROOT)
    mcp = {"fs": {"command": "mcp-fs", "args": ["/ws"]}, "web": {"url": "http://127.0.0.1:9/mcp"}}
    files = _harness({"mcp_servers": mcp, "instructions": "Be brief."}).files(ctx)
    assert set(files) == {DRIVER_FILE, CONFIG_FILE}
    assert files[DRIVER_FILE] == DRIVER.read_text()
    config = json.loads(files[CONFIG_FILE])
    assert config["instructions"] == "Be brief."
    assert config["answer_file"] == ANSWER_FILE and config["transcript_file"] == TRANSCRIPT_FILE
    assert config["mcp_servers"] == {
        "fs": {"command": "mcp-fs", "args": ["/ws"], "env": {}},
        "web": {"url": "http://127.0.0.1:9/mcp", "args": [], "env": {}},
    }
    assert all(path.startswith(".polar/") for path in files)


def test_env_turns_tracing_off_and_keeps_the_proxy_wiring() -> None:
    ctx = make_ctx(workdir="/ws", harness_root=ROOT)
    env = _harness().env(ctx)
    assert env["OPENAI_AGENTS_DISABLE_TRACING"] == "1"
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:8010/v1"
    assert env["OPENAI_API_KEY"] == "tok-abc" and env["POLAR_MODEL"] == "smollm2"
    assert env["HOME"] == "/ws/.polar/home"
    assert env["PATH"].startswith("/opt/harnesses/openai_agents/0.24.0/venv/bin:")


def test_answer_and_artifacts_are_declared() -> None:
    harness = _harness()
    assert harness.answer.file == ANSWER_FILE
    assert harness.artifacts == {"transcript": TRANSCRIPT_FILE}
    assert harness.auxiliary_rules == ()


@pytest.mark.parametrize(
    "options",
    [{"api": "completions"}, {"skills": {"x": "# X"}}, {"shell_timeout_s": 0}, {"max_turns": 0}],
)
def test_bad_options_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="openai_agents"):
        _harness(options)


def test_driver_imports_only_the_sdk_and_the_stdlib() -> None:
    tree = ast.parse(DRIVER.read_text())
    roots = {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    } | {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert "polar_mq" not in roots
    assert roots - {"__future__"} <= {
        "agents", "openai", "argparse", "asyncio", "contextlib", "json", "os", "pathlib",
        "subprocess", "sys", "traceback", "typing",
    }  # fmt: skip
