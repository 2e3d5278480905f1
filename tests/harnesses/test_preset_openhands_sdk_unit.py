"""The `openhands_sdk` preset: command line, config, skills, environment, and its Python 3.12
requirement (an install on a node without 3.12 fails naming it). No install, no network."""

from __future__ import annotations

import ast
import json
import shlex
from pathlib import Path

import pytest

from polar_mq.harnesses import get_harness
from polar_mq.harnesses.presets import install as install_module
from polar_mq.harnesses.presets.harness import PresetHarness
from polar_mq.harnesses.presets.install import InstallError, install
from polar_mq.harnesses.presets.openhands_sdk import (
    ANSWER_FILE,
    CONFIG_FILE,
    DRIVER,
    DRIVER_FILE,
    PRESET,
    TRANSCRIPT_FILE,
)
from tests.harnesses.test_command import make_ctx

ROOT = Path("/opt/harnesses")


def _harness(options: dict[str, object] | None = None) -> PresetHarness:
    harness = get_harness({"type": "openhands_sdk", "options": options or {}})
    assert isinstance(harness, PresetHarness)
    return harness


def test_package_pins_sdk_and_tools_and_asks_for_python_3_12() -> None:
    package = PRESET.package
    assert (package.name, package.default_version) == ("openhands-sdk", "1.58.2")
    assert package.also == ("openhands-tools==1.58.2",)
    assert package.python == "3.12"
    assert PRESET.api_family == "chat"


def test_command_runs_the_driver_with_the_iteration_limit() -> None:
    ctx = make_ctx(workdir="/ws", harness_root=ROOT)
    command = _harness({"max_turns": 9}).command(ctx)
    assert command.startswith("mkdir -p /ws/.polar/home && exec ")
    assert shlex.split(command.split(" && exec ", 1)[1]) == [
        "/opt/harnesses/openhands_sdk/1.58.2/venv/bin/python",
        f"/ws/{DRIVER_FILE}",
        "--max-iterations",
        "9",
        "--config",
        f"/ws/{CONFIG_FILE}",
    ]


def test_config_mcp_and_skills_in_the_sdk_formats() -> None:
    ctx = make_ctx(workdir="/ws", harness_root=ROOT)
    options = {
        "mcp_servers": {
            "fs": {"command": "mcp-fs", "args": ["/ws"], "env": {"A": "1"}},
            "web": {"url": "http://127.0.0.1:9/mcp"},
        },
        "skills": {"lint-first": "---\nname: lint-first\ndescription: x\n---\nRun ruff."},
    }
    files = _harness(options).files(ctx)
    assert files[DRIVER_FILE] == DRIVER.read_text()
    config = json.loads(files[CONFIG_FILE])
    assert config["answer_file"] == ANSWER_FILE and config["transcript_file"] == TRANSCRIPT_FILE
    assert config["terminal_type"] == "subprocess" and config["load_user_skills"] is True
    assert config["mcp_servers"] == {
        "fs": {"command": "mcp-fs", "args": ["/ws"], "env": {"A": "1"}},
        "web": {"url": "http://127.0.0.1:9/mcp"},
    }
    skill = ".polar/home/.agents/skills/lint-first/SKILL.md"
    assert files[skill].endswith("Run ruff.")
    assert all(path.startswith(".polar/") for path in files)
    assert json.loads(_harness().files(ctx)[CONFIG_FILE])["load_user_skills"] is False


def test_env_quiets_the_sdk_and_keeps_the_proxy_wiring() -> None:
    env = _harness().env(make_ctx(workdir="/ws", harness_root=ROOT))
    assert env["OPENHANDS_SUPPRESS_BANNER"] == "1"
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert not any(key.startswith("LMNR_") for key in env)
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:8010/v1"
    assert env["OPENAI_API_KEY"] == "tok-abc" and env["POLAR_MODEL"] == "smollm2"
    assert env["HOME"] == "/ws/.polar/home"


@pytest.mark.parametrize(
    "options",
    [{"skills": {"../escape": "x"}}, {"skills": {"a/b": "x"}}, {"terminal_type": "powershell"}],
)
def test_bad_options_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="openhands_sdk"):
        _harness(options)


def test_install_without_python_3_12_fails_naming_the_requirement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(install_module, "python_candidates", lambda _version: [])
    with pytest.raises(InstallError, match=r"openhands-sdk needs Python 3\.12"):
        install(tmp_path, "openhands_sdk", PRESET.package, "1.58.2")
    assert not (tmp_path / "openhands_sdk" / "1.58.2" / "installed.json").exists()


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
        "openhands", "pydantic", "argparse", "json", "os", "pathlib", "sys", "traceback",
        "typing",
    }  # fmt: skip
