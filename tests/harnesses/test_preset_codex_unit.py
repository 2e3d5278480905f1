"""The `codex` preset's command line and config (no install, no network)."""

from __future__ import annotations

import shlex
import tomllib

import pytest

from polar_mq.harnesses.auxiliary import is_auxiliary
from polar_mq.harnesses.presets.codex import CODEX_HOME, LAST_MESSAGE, TRANSCRIPT, toml_value
from tests.harnesses.preset_context import PROXY, WORKDIR, context, harness


def test_command_runs_codex_exec_non_interactively() -> None:
    h = harness("codex", options={"extra_args": ["--color", "never"]})
    ctx = context()
    argv = shlex.split(h.command(ctx))
    assert argv[:3] == ["mkdir", "-p", f"{WORKDIR}/.polar/home"]
    codex = argv.index("/cache/harnesses/codex/0.171.0/node_modules/.bin/codex")
    assert argv[codex - 4 : codex - 1][:2] == ["sh", "-c"]  # the transcript-keeping wrapper
    args = argv[codex + 1 :]
    assert args[0] == "exec"
    for flag in ("--skip-git-repo-check", "--json", "--dangerously-bypass-approvals-and-sandbox"):
        assert flag in args
    assert args[args.index("--output-last-message") + 1] == f"{WORKDIR}/{LAST_MESSAGE}"
    assert args[args.index("-C") + 1] == WORKDIR
    assert args[args.index("-m") + 1] == "my-model"
    assert args[-3:] == [ctx.instruction, "--color", "never"]  # one argument, never the shell's


def test_config_points_codex_at_the_proxy_with_the_rollout_token() -> None:
    h = harness("codex")
    ctx = context()
    files = h.files(ctx)
    config = tomllib.loads(files[f"{CODEX_HOME}/config.toml"])
    assert config["model"] == "my-model"
    assert config["model_provider"] == "polar"
    provider = config["model_providers"]["polar"]
    assert provider["base_url"] == PROXY
    assert provider["env_key"] == "OPENAI_API_KEY"
    assert provider["wire_api"] == "responses"
    assert config["approval_policy"] == "never"
    assert config["sandbox_mode"] == "danger-full-access"
    assert config["check_for_update_on_startup"] is False
    assert config["analytics"]["enabled"] is False
    assert config["features"]["unbounded_connection_retries"] is False
    assert config["agents"]["enabled"] is False  # multi-agent tools are a `namespace` tool
    assert config["web_search"] == "disabled"
    assert "model_instructions_file" not in config  # Codex's own instructions by default
    env = h.env(ctx)
    assert env["CODEX_HOME"] == f"{WORKDIR}/{CODEX_HOME}"
    assert env["HOME"].startswith(WORKDIR)
    assert env["OPENAI_API_KEY"] == "rollout-token"
    assert h.answer.file == LAST_MESSAGE
    assert h.artifacts == {"transcript": TRANSCRIPT}


def test_short_instructions_mcp_servers_and_skills_in_codex_format() -> None:
    h = harness(
        "codex",
        options={
            "instructions": "Be brief.",
            "mcp_servers": {
                "files": {"command": "npx", "args": ["-y", "srv"], "env": {"A": 'q"uote'}},
                "web api": {"url": "http://127.0.0.1:9000/mcp"},
            },
            "skills": {"review": "---\nname: review\ndescription: d\n---\nbody"},
        },
    )
    files = h.files(context())
    config = tomllib.loads(files[f"{CODEX_HOME}/config.toml"])
    assert files[config["model_instructions_file"].removeprefix(f"{WORKDIR}/")] == "Be brief."
    assert config["mcp_servers"]["files"] == {
        "command": "npx",
        "args": ["-y", "srv"],
        "env": {"A": 'q"uote'},
    }
    assert config["mcp_servers"]["web api"] == {"url": "http://127.0.0.1:9000/mcp"}
    assert files[f"{CODEX_HOME}/skills/review/SKILL.md"].startswith("---\nname: review")
    assert config["skills"]["include_instructions"] is True


def test_bad_skill_name_is_refused_at_submission() -> None:
    with pytest.raises(ValueError, match="skill name"):
        harness("codex", options={"skills": {"../escape": "x"}})


@pytest.mark.parametrize("text", ['a"b', "line\nbreak", "tab\t\\", "ünïcode 🎉", "\x01ctl"])
def test_toml_strings_round_trip(text: str) -> None:
    assert tomllib.loads(f"v = {toml_value(text)}")["v"] == text


def test_codex_declares_no_side_calls() -> None:
    h = harness("codex")
    request = {"messages": [{"role": "user", "content": "hi"}], "tools": []}
    assert not is_auxiliary(request, h.auxiliary_rules)
