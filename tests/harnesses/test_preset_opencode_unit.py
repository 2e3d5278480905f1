"""The `opencode` preset's command line and config (no install, no network)."""

from __future__ import annotations

import json
import shlex

import pytest

from polar_mq.harnesses.auxiliary import is_auxiliary
from polar_mq.harnesses.presets.opencode import TRANSCRIPT
from tests.harnesses.preset_context import WORKDIR, context, harness


def test_command_runs_opencode_with_the_proxy_model() -> None:
    h = harness("opencode", options={"title": "fixed"})
    ctx = context()
    argv = shlex.split(h.command(ctx))
    program = argv.index("/cache/harnesses/opencode/1.18.33/node_modules/.bin/opencode")
    assert argv[program - 4 : program - 2] == ["sh", "-c"]
    assert TRANSCRIPT in argv[program - 2]  # stdout (the JSON events) is the transcript
    args = argv[program + 1 :]
    assert args[0] == "run"
    assert {"--pure", "--auto", "--print-logs"} <= set(args)
    assert args[args.index("--format") + 1] == "json"
    assert args[args.index("--dir") + 1] == WORKDIR
    assert args[args.index("-m") + 1] == "polar/my-model"
    assert args[args.index("--title") + 1] == "fixed"
    assert args[-1] == ctx.instruction


def test_config_names_an_openai_compatible_provider_reading_the_proxy_env() -> None:
    h = harness("opencode", options={"max_turns": 7})
    env = h.env(context())
    config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    provider = config["provider"]["polar"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {
        "baseURL": "{env:OPENAI_BASE_URL}",
        "apiKey": "{env:OPENAI_API_KEY}",
    }
    assert list(provider["models"]) == ["my-model"]
    assert config["model"] == "polar/my-model"
    assert config["agent"]["build"]["steps"] == 7
    assert config["autoupdate"] is False and config["share"] == "disabled"
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        assert env[var].startswith(f"{WORKDIR}/.polar/opencode/")
    assert env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"
    assert env["OPENCODE_DISABLE_AUTOUPDATE"] == "1"
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:8401/v1"
    assert "--title" not in shlex.split(h.command(context()))


def test_mcp_servers_and_skills_in_opencode_format() -> None:
    h = harness(
        "opencode",
        options={
            "mcp_servers": {
                "files": {"command": "npx", "args": ["srv"], "env": {"A": "1"}},
                "remote": {"url": "http://127.0.0.1:9000/mcp"},
            },
            "skills": {"review": "---\nname: review\n---\n"},
        },
    )
    config = json.loads(h.env(context())["OPENCODE_CONFIG_CONTENT"])
    assert config["mcp"]["files"] == {
        "type": "local",
        "command": ["npx", "srv"],
        "environment": {"A": "1"},
        "enabled": True,
    }
    assert config["mcp"]["remote"] == {
        "type": "remote",
        "url": "http://127.0.0.1:9000/mcp",
        "enabled": True,
    }
    files = h.files(context())
    assert files == {
        ".polar/opencode/config/opencode/skills/review/SKILL.md": "---\nname: review\n---\n"
    }


def test_title_call_is_auxiliary_and_the_main_loop_is_not() -> None:
    rules = harness("opencode").auxiliary_rules
    title = {
        "messages": [
            {"role": "system", "content": "You are a title generator. You output ONLY a title."},
            {"role": "user", "content": "Generate a title for this conversation:\n"},
        ],
        "max_tokens": 32000,
    }
    main = {
        "messages": [
            {"role": "system", "content": "You are opencode, an interactive CLI tool"},
            {"role": "user", "content": "fix it"},
        ],
        "tools": [{"type": "function", "function": {"name": "bash"}}],
    }
    assert is_auxiliary(title, rules)
    assert not is_auxiliary(main, rules)


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="skill name"):
        harness("opencode", options={"skills": {"a/b": "x"}})
    with pytest.raises(ValueError, match="bad 'opencode' options"):
        harness("opencode", options={"unknown": 1})
