"""The `qwen_code` preset's command line and settings (no install, no network)."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from polar_mq.harnesses.auxiliary import is_auxiliary
from polar_mq.harnesses.presets.keep_file import then_copy
from polar_mq.harnesses.presets.qwen_code import QWEN_HOME, TRANSCRIPT
from tests.harnesses.preset_context import WORKDIR, context, harness


def test_command_runs_qwen_headless_with_a_turn_limit() -> None:
    h = harness("qwen_code", options={"max_turns": 12})
    ctx = context()
    argv = shlex.split(h.command(ctx))
    program = argv.index("/cache/harnesses/qwen_code/0.24.4/node_modules/.bin/qwen")
    args = argv[program + 1 :]
    assert args[args.index("--auth-type") + 1] == "openai"
    assert args[args.index("-m") + 1] == "my-model"
    assert args[args.index("--max-session-turns") + 1] == "12"
    assert "--yolo" in args
    assert args[-1] == ctx.instruction
    assert h.artifacts == {"transcript": TRANSCRIPT}


def test_settings_live_in_the_workspace() -> None:
    h = harness(
        "qwen_code",
        options={
            "auto_memory": False,
            "mcp_servers": {
                "files": {"command": "npx", "args": ["srv"]},
                "remote": {"url": "http://127.0.0.1:9000/mcp"},
            },
            "skills": {"review": "---\nname: review\n---\n"},
        },
    )
    ctx = context()
    files = h.files(ctx)
    settings = json.loads(files[f"{QWEN_HOME}/settings.json"])
    assert settings["security"]["auth"]["selectedType"] == "openai"
    assert settings["model"]["name"] == "my-model"
    assert settings["general"]["enableAutoUpdate"] is False
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert settings["telemetry"]["enabled"] is False
    assert settings["memory"]["enableManagedAutoMemory"] is False
    assert settings["mcpServers"] == {
        "files": {"command": "npx", "args": ["srv"]},
        "remote": {"httpUrl": "http://127.0.0.1:9000/mcp"},
    }
    (skills_dir,) = settings["skills"]["directories"]
    assert f"{skills_dir.removeprefix(WORKDIR + '/')}/review/SKILL.md" in files
    env = h.env(ctx)
    assert env["QWEN_HOME"] == f"{WORKDIR}/{QWEN_HOME}"
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:8401/v1"
    assert env["OPENAI_API_KEY"] == "rollout-token"


def test_memory_agents_are_auxiliary_and_the_main_loop_is_not() -> None:
    rules = harness("qwen_code").auxiliary_rules
    tools = [{"type": "function", "function": {"name": "write_file"}}]
    memory = {
        "messages": [
            {
                "role": "system",
                "content": "You are now acting as the managed memory extraction subagent for ...",
            },
            {"role": "user", "content": "Managed memory has TWO directories."},
        ],
        "tools": tools,
    }
    main = {
        "messages": [
            {"role": "system", "content": "You are Qwen Code, a non-interactive CLI agent"},
            {"role": "user", "content": "What is 6*7?"},
        ],
        "tools": tools,
    }
    assert is_auxiliary(memory, rules)
    assert not is_auxiliary(main, rules)


def test_then_copy_keeps_the_newest_file_and_the_exit_status(tmp_path: Path) -> None:
    (tmp_path / "chats").mkdir()
    (tmp_path / "chats" / "old.jsonl").write_text("old")
    time.sleep(0.01)
    script = "printf new > chats/new.jsonl; exit 3"
    argv = [*then_copy('"$D"/chats/*.jsonl', '"$D"/kept.jsonl', "t"), "sh", "-c", script]
    proc = subprocess.run(argv, cwd=tmp_path, env={"D": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 3
    assert (tmp_path / "kept.jsonl").read_text() == "new"


def test_then_copy_without_a_file_copies_nothing(tmp_path: Path) -> None:
    argv = [*then_copy('"$D"/none/*.jsonl', '"$D"/kept.jsonl', "t"), "true"]
    proc = subprocess.run(argv, cwd=tmp_path, env={"D": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0
    assert not (tmp_path / "kept.jsonl").exists()


def test_bad_skill_name_is_refused() -> None:
    with pytest.raises(ValueError, match="skill name"):
        harness("qwen_code", options={"skills": {"..": "x"}})
