"""mini_swe_agent preset: command line, workspace config, environment and answer wrapper."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from polar_mq.harnesses import get_harness
from polar_mq.harnesses.presets.harness import PresetHarness
from polar_mq.harnesses.presets.mini_swe_agent import CONFIG_FILE, SUBMISSION, TRAJECTORY
from tests.harnesses.preset_context import preset_ctx


def harness(options: dict[str, object] | None = None) -> PresetHarness:
    built = get_harness({"type": "mini_swe_agent", "options": options or {"max_turns": 7}})
    assert isinstance(built, PresetHarness)
    return built


def mini_args(command: str) -> list[str]:
    """The `mini` argv inside the wrapper command line."""
    argv = shlex.split(command.split(" && exec ", 1)[1])
    assert argv[:2] == ["/bin/sh", "-c"]
    start = next(i for i, a in enumerate(argv) if a.endswith("/venv/bin/mini"))
    return argv[start:]


def test_command_line_is_non_interactive_with_limits_and_workspace_paths(tmp_path: Path) -> None:
    ctx = preset_ctx(tmp_path)
    argv = mini_args(harness().command(ctx))
    ws = ctx.workdir
    assert argv[argv.index("-m") + 1] == "openai/smollm2"
    assert argv[argv.index("-t") + 1] == ctx.instruction  # passed as one argument, unexpanded
    assert "-y" in argv and "--exit-immediately" in argv
    configs = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
    assert configs == ["mini.yaml", f"{ws}/{CONFIG_FILE}", "agent.step_limit=7"]
    assert argv[argv.index("-o") + 1] == f"{ws}/{TRAJECTORY}"
    assert harness().artifacts == {"trajectory": TRAJECTORY}
    assert harness().answer.file == SUBMISSION


def test_extra_args_go_to_mini(tmp_path: Path) -> None:
    command = harness({"extra_args": ["-c", "agent.wall_time_limit_seconds=60"]}).command(
        preset_ctx(tmp_path)
    )
    assert mini_args(command)[-2:] == ["-c", "agent.wall_time_limit_seconds=60"]


def test_config_file_sets_templates_and_kwargs(tmp_path: Path) -> None:
    ctx = preset_ctx(tmp_path)
    options = {
        "system_template": "You run bash.",
        "instance_template": "Task: {{task}}",
        "model_kwargs": {"max_tokens": 64},
        "command_timeout": 5,
        "config": "mini_textbased.yaml",
    }
    built = harness(options)
    config = json.loads(built.files(ctx)[CONFIG_FILE])  # JSON is valid YAML
    assert config["agent"]["system_template"] == "You run bash."
    assert config["agent"]["instance_template"] == "Task: {{task}}"
    assert config["agent"]["cost_limit"] == 0 and config["agent"]["mode"] == "yolo"
    assert config["model"] == {"cost_tracking": "ignore_errors", "model_kwargs": {"max_tokens": 64}}
    assert config["environment"] == {"cwd": ctx.workdir, "timeout": 5}
    assert "mini_textbased.yaml" in mini_args(built.command(ctx))


def test_environment_keeps_state_in_the_workspace_and_proxy_wins(tmp_path: Path) -> None:
    ctx = preset_ctx(tmp_path)
    env = harness().env(ctx)
    assert env["MSWEA_CONFIGURED"] == "true"
    assert env["MSWEA_GLOBAL_CONFIG_DIR"].startswith(f"{ctx.workdir}/.polar/")
    assert env["HOME"].startswith(f"{ctx.workdir}/.polar/")
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert env["MSWEA_COST_TRACKING"] == "ignore_errors"
    assert env["OPENAI_BASE_URL"] == env["OPENAI_API_BASE"] == "http://127.0.0.1:8010/v1"
    assert env["OPENAI_API_KEY"] == "tok-abc"


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ({"exit_status": "Submitted", "submission": "42\n"}, "42\n"),
        ({"exit_status": "Submitted", "submission": "  \n"}, None),
        ({"exit_status": "LimitsExceeded", "submission": ""}, None),
    ],
)
def test_wrapper_keeps_a_submission_as_the_answer_and_mini_exit_status(
    tmp_path: Path, info: dict[str, str], expected: str | None
) -> None:
    """The wrapper runs mini's argv ("$@"), then copies a non-empty submission."""
    from polar_mq.harnesses.presets.mini_swe_agent import _WRAPPER

    traj, out = tmp_path / "traj.json", tmp_path / "answer.txt"
    fake_mini = f"import json; open({str(traj)!r}, 'w').write(json.dumps({{'info': {info!r}}}))"
    fake_mini += "; raise SystemExit(3)"
    argv = ["/bin/sh", "-c", _WRAPPER, "w", sys.executable, str(traj), str(out)]
    proc = subprocess.run([*argv, sys.executable, "-c", fake_mini], check=False)
    assert proc.returncode == 3
    assert (out.read_text() if out.exists() else None) == expected


def test_wrapper_without_trajectory_writes_nothing(tmp_path: Path) -> None:
    from polar_mq.harnesses.presets.mini_swe_agent import _WRAPPER

    out = tmp_path / "answer.txt"
    argv = ["/bin/sh", "-c", _WRAPPER, "w", sys.executable, str(tmp_path / "none"), str(out)]
    assert subprocess.run([*argv, "true"], check=False).returncode == 0
    assert not out.exists()


def test_bad_options_are_rejected() -> None:
    with pytest.raises(ValueError, match="command_timeout"):
        get_harness({"type": "mini_swe_agent", "options": {"command_timeout": 0}})
    with pytest.raises(ValueError, match="nope"):
        get_harness({"type": "mini_swe_agent", "options": {"nope": 1}})
    with pytest.raises(ValueError, match="takes no skills"):
        get_harness({"type": "mini_swe_agent", "options": {"skills": {"a": "b"}}})
