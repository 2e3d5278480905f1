"""smolagents preset: driver command line, shipped driver file, options."""

from __future__ import annotations

import ast
import shlex
from pathlib import Path

import pytest

from polar_mq.harnesses import get_harness
from polar_mq.harnesses.presets.harness import PresetHarness
from polar_mq.harnesses.presets.smolagents import ANSWER, DRIVER, DRIVER_SOURCE, TRANSCRIPT
from tests.harnesses.preset_context import preset_ctx


def harness(options: dict[str, object] | None = None) -> PresetHarness:
    built = get_harness({"type": "smolagents", "options": options or {}})
    assert isinstance(built, PresetHarness)
    return built


def argv_of(built: PresetHarness, tmp_path: Path) -> list[str]:
    return shlex.split(built.command(preset_ctx(tmp_path)).split(" && exec ", 1)[1])


def test_driver_runs_with_the_install_python_and_limits(tmp_path: Path) -> None:
    ctx = preset_ctx(tmp_path)
    argv = argv_of(harness({"max_turns": 6}), tmp_path)
    assert argv[0] == f"{tmp_path}/harnesses/smolagents/1.26.0/venv/bin/python"
    assert argv[1] == f"{ctx.workdir}/{DRIVER}"
    assert argv[argv.index("--agent") + 1] == "tool_calling"
    assert argv[argv.index("--max-steps") + 1] == "6"
    assert argv[argv.index("--tool") + 1] == "python_interpreter"
    assert argv[argv.index("--answer") + 1] == f"{ctx.workdir}/{ANSWER}"
    assert argv[argv.index("--transcript") + 1] == f"{ctx.workdir}/{TRANSCRIPT}"
    assert ctx.instruction not in argv  # the driver reads POLAR_INSTRUCTION
    env = harness().env(ctx)
    assert env["POLAR_INSTRUCTION"] == ctx.instruction and env["POLAR_MODEL"] == "smollm2"
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:8010/v1"


def test_code_agent_and_options(tmp_path: Path) -> None:
    options = {"agent": "code", "tools": [], "authorized_imports": ["math"], "instructions": "Hi"}
    argv = argv_of(harness(options), tmp_path)
    assert argv[argv.index("--agent") + 1] == "code"
    assert "--tool" not in argv
    assert argv[argv.index("--authorized-import") + 1] == "math"
    assert argv[argv.index("--instructions") + 1] == "Hi"


def test_tool_choice_option_reaches_smolagents_request(tmp_path: Path) -> None:
    """`tool_choice: auto` replaces smolagents' `required` in the body it sends (docs/tito.md);
    checked with the installed smolagents when the node has it."""
    import subprocess

    assert "--tool-choice" not in argv_of(harness(), tmp_path)  # smolagents' own default
    argv = argv_of(harness({"tool_choice": "auto"}), tmp_path)
    assert argv[argv.index("--tool-choice") + 1] == "auto"
    python = Path.home() / ".cache/polar_mq/harnesses/smolagents/1.26.0/venv/bin/python"
    if not python.exists():
        pytest.skip("smolagents not installed here")
    probe = f"""
import os, runpy
from smolagents import ChatMessage, PythonInterpreterTool
driver = runpy.run_path({str(DRIVER_SOURCE)!r})
os.environ.update(POLAR_MODEL="m", OPENAI_BASE_URL="http://x/v1", OPENAI_API_KEY="k")
for choice in ("required", "auto"):
    args = driver["parse_args"](["--tool-choice", choice, "--answer", "a", "--transcript", "t"])
    model = driver["build_agent"](args).model
    body = model._prepare_completion_kwargs(
        [ChatMessage(role="user", content="hi")], tools_to_call_from=[PythonInterpreterTool()]
    )
    print(body["tool_choice"])
"""
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["required", "auto"], out.stderr[-2000:]


def test_driver_is_shipped_into_the_workspace(tmp_path: Path) -> None:
    files = harness().files(preset_ctx(tmp_path))
    assert files == {DRIVER: DRIVER_SOURCE.read_text()}
    harness_answer = harness().answer
    assert harness_answer.file == ANSWER
    assert harness().artifacts == {"transcript": TRANSCRIPT}


def test_driver_imports_only_smolagents_and_the_stdlib() -> None:
    tree = ast.parse(DRIVER_SOURCE.read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    assert "polar_mq" not in roots
    assert roots - {"__future__", "argparse", "json", "os", "sys", "traceback", "pathlib",
                    "typing"} == {"smolagents"}  # fmt: skip


def test_driver_is_a_python_3_11_script() -> None:
    compile(DRIVER_SOURCE.read_text(), str(DRIVER_SOURCE), "exec")


def test_bad_options_are_rejected() -> None:
    with pytest.raises(ValueError, match="agent"):
        get_harness({"type": "smolagents", "options": {"agent": "managed"}})
    with pytest.raises(ValueError, match="tools"):
        get_harness({"type": "smolagents", "options": {"tools": ["web_search"]}})
    with pytest.raises(ValueError, match="tool_choice"):
        get_harness({"type": "smolagents", "options": {"tool_choice": "none"}})
    with pytest.raises(ValueError, match="takes no mcp_servers"):
        get_harness({"type": "smolagents", "options": {"mcp_servers": {"x": {"url": "http://x"}}}})


def test_harness_list_shows_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`[openai]` is printed as text, not swallowed as rich markup."""
    from typer.testing import CliRunner

    from polar_mq.cli.harness import harness_app

    monkeypatch.setenv("POLAR_MQ_HARNESS_ROOT", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(harness_app, ["list"])
    assert result.exit_code == 0, result.output
    assert "pypi:smolagents[openai]" in result.output
