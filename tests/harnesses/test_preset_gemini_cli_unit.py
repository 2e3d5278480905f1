"""The `gemini_cli` preset's command line, environment and settings (no network, no install).

The shell wrapper is run for real against a stand-in `gemini` that prints its arguments.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from polar_mq.harnesses import get_harness
from polar_mq.harnesses.auxiliary import is_auxiliary
from polar_mq.harnesses.base import AgentContext
from polar_mq.harnesses.presets.gemini_cli import SETTINGS, TRANSCRIPT
from polar_mq.harnesses.presets.harness import PresetHarness
from polar_mq.harnesses.presets.registry import get_preset

TRICKY = '-y do it: "quoted" $(touch pwned) `id`'
STAND_IN = """#!/bin/sh
python3 -c 'import json, sys; print(json.dumps({"type": "result", "argv": sys.argv[1:]}))' "$@"
exit 53
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
    harness = get_harness({"type": "gemini_cli", "options": options})
    assert isinstance(harness, PresetHarness)
    return harness


def test_registered_with_its_package_family_and_declarations() -> None:
    preset = get_preset("gemini_cli")
    assert preset is not None
    assert preset.api_family == "gemini"
    assert (preset.package.ecosystem, preset.package.name) == ("npm", "@google/gemini-cli")
    assert preset.answer.file is None
    assert preset.artifacts == {"transcript": TRANSCRIPT}


def test_command_line_is_headless_yolo_with_model(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    harness = _harness(extra_args=["--debug"])
    argv = harness.preset.argv(harness.run(ctx))
    assert argv[0].endswith("gemini_cli/0.61.0/node_modules/.bin/gemini")
    assert argv[argv.index("--model") + 1] == "policy-model"
    assert argv[argv.index("--approval-mode") + 1] == "yolo"
    assert argv[argv.index("--output-format") + 1] == "stream-json"
    assert "--skip-trust" in argv
    assert argv[-2:] == ["--prompt", "Fix the bug."]
    assert argv.index("--debug") < argv.index("--prompt")


def test_settings_turn_limit_auth_and_everything_quiet(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    settings = json.loads(_harness(max_turns=9).files(ctx)[SETTINGS])
    assert settings["model"]["maxSessionTurns"] == 9
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["security"]["folderTrust"]["enabled"] is False
    assert settings["general"]["enableAutoUpdate"] is False
    assert settings["general"]["enableAutoUpdateNotification"] is False
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert settings["telemetry"]["enabled"] is False
    assert "mcpServers" not in settings
    assert SETTINGS == ".polar/gemini/.gemini/settings.json"


def test_environment_keeps_state_in_the_workspace(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    env = _harness().env(ctx)
    assert env["GEMINI_CLI_HOME"] == f"{ctx.workdir}/.polar/gemini"
    assert env["HOME"] == f"{ctx.workdir}/.polar/home"
    assert env["GEMINI_TELEMETRY_ENABLED"] == "false"
    assert env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:8001"
    assert env["GEMINI_API_KEY"] == "tok"


def test_mcp_servers_and_skills_in_its_own_format(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    files = _harness(
        mcp_servers={
            "files": {"command": "mcp-files", "args": ["."]},
            "web": {"url": "http://127.0.0.1:9000/mcp"},
        },
        skills={"arith": "---\nname: arith\ndescription: sums\n---\nAdd."},
    ).files(ctx)
    servers = json.loads(files[SETTINGS])["mcpServers"]
    assert servers["files"] == {"command": "mcp-files", "args": ["."], "env": {}, "trust": True}
    assert servers["web"] == {"httpUrl": "http://127.0.0.1:9000/mcp", "trust": True}
    assert files[".polar/gemini/.gemini/skills/arith/SKILL.md"].endswith("Add.")


@pytest.mark.parametrize(
    "options", [{"skills": {"..": "x"}}, {"max_turns": 0}, {"approval_mode": "default"}]
)
def test_bad_options_are_refused_at_submission(options: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        get_harness({"type": "gemini_cli", "options": options})


def test_side_calls_are_the_calls_without_tools() -> None:
    rules = _harness().auxiliary_rules
    check = {"messages": [{"role": "user", "content": "Who speaks next?"}]}
    main = {**check, "tools": [{"type": "function", "function": {"name": "run_shell_command"}}]}
    assert is_auxiliary(check, rules) and not is_auxiliary(main, rules)


def test_the_wrapper_passes_the_instruction_verbatim_and_keeps_the_exit_status(
    tmp_path: Path,
) -> None:
    ctx = _ctx(tmp_path, TRICKY)
    harness = _harness()
    run = harness.run(ctx)
    run.install.bin_dir.mkdir(parents=True)
    gemini = run.install.bin_dir / "gemini"
    gemini.write_text(STAND_IN)
    gemini.chmod(0o755)
    proc = subprocess.run(
        ["/bin/sh", "-c", harness.command(ctx)],
        cwd=ctx.workdir,
        env={**os.environ, **harness.env(ctx)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 53, proc.stderr  # its turn-limit status survives the tee
    printed = json.loads(proc.stdout)
    assert printed["argv"][-2:] == ["--prompt", TRICKY]
    assert json.loads(Path(ctx.workdir, TRANSCRIPT).read_text()) == printed
    assert not Path(ctx.workdir, "pwned").exists()
