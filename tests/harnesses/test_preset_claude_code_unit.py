"""The `claude_code` preset's command line, environment and config files (no network, no install).

The shell wrapper is run for real against a stand-in `claude` that prints its arguments, so the
instruction's way through (`$POLAR_INSTRUCTION`, after `--`), the transcript copy and the exit
status are checked as the run-agent stage would see them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
from pathlib import Path

import pytest

from polar_mq.harnesses import get_harness
from polar_mq.harnesses.auxiliary import is_auxiliary
from polar_mq.harnesses.base import AgentContext
from polar_mq.harnesses.presets.claude_code import MCP_CONFIG, TRANSCRIPT
from polar_mq.harnesses.presets.harness import PresetHarness
from polar_mq.harnesses.presets.registry import get_preset

TRICKY = "--help me: say \"hi\" and $(touch pwned) `id` 'quoted'"
STAND_IN = """#!/bin/sh
python3 -c 'import json, sys; print(json.dumps({"type": "result", "argv": sys.argv[1:]}))' "$@"
echo "to stderr" >&2
exit 3
"""


def _ctx(tmp_path: Path, instruction: str = "Fix the bug.") -> AgentContext:
    workdir = tmp_path / "ws"
    workdir.mkdir(exist_ok=True)
    return AgentContext(
        rollout_id="r-1",
        instruction=instruction,
        task_file=str(workdir / "task.json"),
        workdir=str(workdir),
        proxy_base_url="http://127.0.0.1:8001/v1",
        api_key="tok",
        model="policy-model",
        harness_root=tmp_path / "harnesses",
    )


def _harness(**options: object) -> PresetHarness:
    harness = get_harness({"type": "claude_code", "options": options})
    assert isinstance(harness, PresetHarness)
    return harness


def _argv(harness: PresetHarness, ctx: AgentContext) -> list[str]:
    preset = harness.preset
    return preset.argv(harness.run(ctx))


def test_registered_with_its_package_family_and_declarations() -> None:
    preset = get_preset("claude_code")
    assert preset is not None
    assert preset.api_family == "messages"
    assert preset.package.name == "@anthropic-ai/claude-code"
    assert preset.package.ecosystem == "npm"
    assert preset.answer.file is None
    assert preset.artifacts == {"transcript": TRANSCRIPT}


def test_command_line_is_non_interactive_with_turn_limit_and_model(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    argv = _argv(_harness(max_turns=7, extra_args=["--effort", "low"]), ctx)
    assert argv[0].endswith("claude_code/2.1.332/node_modules/.bin/claude")
    pairs = dict(itertools.pairwise(argv))
    assert "--print" in argv
    assert pairs["--model"] == "policy-model"
    assert pairs["--max-turns"] == "7"
    assert pairs["--output-format"] == "stream-json" and "--verbose" in argv
    assert pairs["--permission-mode"] == "bypassPermissions"
    assert argv[-2:] == ["--", "Fix the bug."]  # the instruction can never be an option
    assert argv.index("--effort") < argv.index("--")  # extra args stay options
    assert "--mcp-config" not in argv and "--system-prompt" not in argv


def test_environment_keeps_state_in_the_workspace_and_traffic_off(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    env = _harness().env(ctx)
    assert env["CLAUDE_CONFIG_DIR"] == f"{ctx.workdir}/.polar/claude"
    assert env["HOME"] == f"{ctx.workdir}/.polar/home"
    for name in ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_TELEMETRY",
                 "DISABLE_AUTOUPDATER", "DISABLE_ERROR_REPORTING", "IS_SANDBOX"):  # fmt: skip
        assert env[name] == "1", name
    assert (
        env["ANTHROPIC_DEFAULT_HAIKU_MODEL"]
        == env["ANTHROPIC_SMALL_FAST_MODEL"]
        == ("policy-model")
    )
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8001"  # the proxy's root
    assert env["ANTHROPIC_API_KEY"] == env["ANTHROPIC_AUTH_TOKEN"] == "tok"


def test_the_jobs_token_budget_is_what_it_asks_for(tmp_path: Path) -> None:
    assert "CLAUDE_CODE_MAX_OUTPUT_TOKENS" not in _harness().env(_ctx(tmp_path))
    ctx = dataclasses.replace(_ctx(tmp_path), extra_env={"POLAR_AGENT_MAX_TOKENS": "512"})
    assert _harness().env(ctx)["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "512"


def test_user_env_cannot_take_the_proxy_wiring(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        get_harness({"type": "claude_code", "env": {"ANTHROPIC_BASE_URL": "http://elsewhere"}})


def test_mcp_servers_skills_system_prompt_and_tools(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    harness = _harness(
        mcp_servers={
            "files": {"command": "mcp-files", "args": ["--root", "."], "env": {"A": "1"}},
            "web": {"url": "http://127.0.0.1:9000/mcp"},
        },
        skills={"arith": "---\nname: arith\ndescription: sums\n---\nAdd carefully."},
        system_prompt="Be brief.",
        tools=["Bash", "Read"],
    )
    files = harness.files(ctx)
    config = json.loads(files[MCP_CONFIG])
    assert config == {
        "mcpServers": {
            "files": {"type": "stdio", "command": "mcp-files", "args": ["--root", "."],
                      "env": {"A": "1"}},
            "web": {"type": "http", "url": "http://127.0.0.1:9000/mcp"},
        }
    }  # fmt: skip
    assert files[".polar/claude/skills/arith/SKILL.md"].startswith("---\nname: arith")
    argv = _argv(harness, ctx)
    assert argv[argv.index("--mcp-config") + 1] == f"{ctx.workdir}/{MCP_CONFIG}"
    assert "--strict-mcp-config" in argv
    assert argv[argv.index("--system-prompt") + 1] == "Be brief."
    assert argv[argv.index("--tools") + 1] == "Bash,Read"
    assert _harness().files(ctx) == {}


@pytest.mark.parametrize(
    "options",
    [
        {"skills": {"../escape": "x"}},
        {"skills": {"a/b": "x"}},
        {"tools": []},
        {"system_prompt": ""},
        {"max_turns": 0},
        {"permission_mode": "default"},
    ],
)
def test_bad_options_are_refused_at_submission(options: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        get_harness({"type": "claude_code", "options": options})


def test_side_calls_are_the_calls_without_tools() -> None:
    rules = _harness().auxiliary_rules
    title = {"messages": [{"role": "user", "content": "Title?"}], "max_tokens": 32000}
    main = {**title, "tools": [{"type": "function", "function": {"name": "Bash"}}]}
    assert is_auxiliary(title, rules)
    assert not is_auxiliary(main, rules)


def test_the_wrapper_passes_the_instruction_verbatim_keeps_the_transcript_and_exit_status(
    tmp_path: Path,
) -> None:
    ctx = _ctx(tmp_path, TRICKY)
    harness = _harness(max_turns=3)
    run = harness.run(ctx)
    run.install.bin_dir.mkdir(parents=True)
    claude = run.install.bin_dir / "claude"
    claude.write_text(STAND_IN)
    claude.chmod(0o755)
    for path, text in harness.files(ctx).items():
        Path(ctx.workdir, path).parent.mkdir(parents=True, exist_ok=True)
        Path(ctx.workdir, path).write_text(text)
    env = {**os.environ, **harness.env(ctx)}
    proc = subprocess.run(
        ["/bin/sh", "-c", harness.command(ctx)],
        cwd=ctx.workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 3, proc.stderr  # claude's own status, not tee's
    printed = json.loads(proc.stdout)
    assert printed["argv"][-2:] == ["--", TRICKY]
    assert printed["argv"][:2] == ["--print", "--model"]
    assert "to stderr" in proc.stderr
    transcript = Path(ctx.workdir, TRANSCRIPT).read_text()
    assert json.loads(transcript) == printed  # the transcript is the event stream
    assert not Path(ctx.workdir, "pwned").exists()
    assert Path(run.home).is_dir()
