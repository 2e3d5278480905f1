"""The preset framework: spec validation, command/env/config of a preset, the install cache,
the prepare-time install check and the bwrap/docker placement (a test preset, no registry)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest

import polar_mq.harnesses as harnesses
from polar_mq.harnesses import AgentContext, PresetHarness, get_harness
from polar_mq.harnesses.auxiliary import AuxiliaryRule, is_auxiliary
from polar_mq.harnesses.presets import install as installer
from polar_mq.harnesses.presets.base import (
    AnswerSource,
    Ecosystem,
    Package,
    Preset,
    PresetOptions,
    PresetRun,
)
from polar_mq.harnesses.presets.setup import (
    IMAGE_HARNESS_ROOT,
    HarnessMissing,
    ensure_installed,
    harness_root_for,
    sandbox_binds,
)
from polar_mq.spec import HarnessSpec, RuntimeSpec

HOSTILE = "it's $(touch owned) `id`"


class EchoOptions(PresetOptions):
    greeting: str = "hello"


class EchoPreset(Preset):
    """A preset whose "harness" is a Python script of its own venv (no registry needed)."""

    name = "echo_test"
    api_family = "chat"
    package = Package(Ecosystem.PYPI, "six", "1.17.0")
    options_model = EchoOptions
    answer = AnswerSource("out/answer.txt", "out/answer.txt")
    auxiliary = (AuxiliaryRule(system_contains="title"),)
    artifacts: ClassVar[dict[str, str]] = {"transcript": "out/log.json"}

    def argv(self, run: PresetRun) -> list[str]:
        options = run.options
        assert isinstance(options, EchoOptions)
        return [run.install.python, "-c", "import sys; print(sys.argv[1:])", options.greeting,
                run.ctx.instruction, str(options.max_turns)]  # fmt: skip

    def files(self, run: PresetRun) -> dict[str, str]:
        return {".polar/echo.toml": f'model = "{run.ctx.model}"\n'}

    def env(self, run: PresetRun) -> dict[str, str]:
        return {"ECHO_CONFIG": f"{run.state_dir}/echo.toml"}


@pytest.fixture()
def echo(monkeypatch: pytest.MonkeyPatch) -> Preset:
    preset = EchoPreset()
    known = {"echo_test": preset}
    monkeypatch.setattr(harnesses, "get_preset", known.get)
    monkeypatch.setattr(harnesses, "presets", lambda: known)
    return preset


def ctx(tmp_path: Path, **overrides: Any) -> AgentContext:
    values: dict[str, Any] = {
        "rollout_id": "r-1", "instruction": HOSTILE, "task_file": str(tmp_path / "task.json"),
        "workdir": str(tmp_path), "proxy_base_url": "http://127.0.0.1:9/v1", "api_key": "tok",
        "model": "m", "harness_root": tmp_path / "cache",
    }  # fmt: skip
    values.update(overrides)
    return AgentContext(**values)


def test_spec_is_validated_at_construction(echo: Preset) -> None:
    for spec, message in [
        ({"type": "echo_test", "nope": 1}, "unknown key"),
        ({"type": "echo_test", "version": "1.0; rm -rf /"}, "version"),
        ({"type": "echo_test", "options": {"max_turns": 0}}, "max_turns"),
        ({"type": "echo_test", "options": {"unknown": 1}}, "unknown"),
        ({"type": "echo_test", "env": {"OPENAI_API_KEY": "x"}}, "may not set"),
        ({"type": "echo_test", "auto_install": "yes"}, "auto_install"),
        ({"type": "echo_test", "auxiliary_calls": [{}]}, "at least one condition"),
        ({"type": "echo_test", "options": {"mcp_servers": {"x": {}}}}, "command"),
        ({"type": "nope"}, "known types: command, reference, echo_test"),
    ]:
        with pytest.raises(ValueError, match=message):
            get_harness(spec)


def test_command_env_and_files(echo: Preset, tmp_path: Path) -> None:
    harness = get_harness(
        {"type": "echo_test", "options": {"greeting": "hi", "max_turns": 7},
         "env": {"MINE": "1"}, "auxiliary_calls": [{"max_tokens_at_most": 8}]}
    )  # fmt: skip
    assert isinstance(harness, PresetHarness) and harness.version == "1.17.0"
    context = ctx(tmp_path)
    env = harness.env(context)
    install = tmp_path / "cache" / "echo_test" / "1.17.0"
    assert env["PATH"].startswith(f"{install}/venv/bin:")
    assert env["HOME"] == f"{tmp_path}/.polar/home"
    assert env["ECHO_CONFIG"] == f"{tmp_path}/.polar/echo.toml" and env["MINE"] == "1"
    assert env["OPENAI_API_KEY"] == "tok"  # the proxy wiring always wins
    assert harness.files(context) == {".polar/echo.toml": 'model = "m"\n'}
    assert harness.answer.file == "out/answer.txt"
    assert harness.artifacts == {"transcript": "out/log.json"}
    assert len(harness.auxiliary_rules) == 2  # the preset's and the job's
    # the instruction is one quoted argument: it never runs as shell code
    command = harness.command(context).replace(f"{install}/venv/bin/python", sys.executable)
    out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, **env}, check=True)  # fmt: skip
    assert out.stdout.strip() == str(["hi", HOSTILE, "7"])
    assert not (tmp_path / "owned").exists() and (tmp_path / ".polar" / "home").is_dir()


def test_auxiliary_rules_match_every_condition() -> None:
    rule = AuxiliaryRule(system_contains="title", no_tools=True, max_tokens_at_most=50)
    base = {"messages": [{"role": "system", "content": "Write a title"},
                         {"role": "user", "content": "chat"}], "max_tokens": 20}  # fmt: skip
    assert is_auxiliary(base, [rule])
    assert not is_auxiliary({**base, "tools": [{"type": "function"}]}, [rule])
    assert not is_auxiliary({**base, "max_tokens": 51}, [rule])
    assert not is_auxiliary({**base, "max_tokens": None}, [rule])
    parts = [{"role": "system", "content": [{"type": "text", "text": "a title"}]}]
    assert is_auxiliary({"messages": parts, "max_completion_tokens": 5}, [rule])
    user = AuxiliaryRule(user_contains="summarize")
    assert is_auxiliary({"messages": [{"role": "user", "content": "please summarize"}]}, [user])
    assert not is_auxiliary({"messages": [{"role": "user", "content": "hi"}]}, [user])


@pytest.mark.slow  # a real pip install in a fresh venv: not for --quick
def test_install_is_cached_locked_and_checked_at_prepare(echo: Preset, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    spec = HarnessSpec(type="echo_test")
    with pytest.raises(HarnessMissing, match=r"polar-mq harness install echo_test@1\.17\.0"):
        ensure_installed(root, spec, "node-1")
    reports: list[installer.InstallReport] = []
    threads = [
        threading.Thread(
            target=lambda: reports.append(
                installer.install(root, "echo_test", echo.package, "1.17.0")
            )
        )
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r.cached for r in reports) == [False, True]  # one installed, one waited
    assert installer.installed_versions(root, "echo_test") == ["1.17.0"]
    python = reports[0].install.python
    assert subprocess.run([python, "-c", "import six"], check=False).returncode == 0
    assert ensure_installed(root, spec, "node-1") == "echo_test@1.17.0"
    assert ensure_installed(root, HarnessSpec(type="reference"), "node-1") is None


@pytest.mark.slow  # a real pip install in a fresh venv: not for --quick
def test_failed_install_leaves_nothing_usable(echo: Preset, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    missing = Package(Ecosystem.PYPI, "polar-mq-no-such-package-x9", "0.0.1")
    with pytest.raises(installer.InstallError, match="exited"):
        installer.install(root, "echo_test", missing, "0.0.1")
    assert installer.find_install(root, "echo_test", missing, "0.0.1") is None
    with pytest.raises(HarnessMissing, match="failed"):
        spec = HarnessSpec(type="echo_test", version="0.0.1", auto_install=True)
        ensure_installed(root, spec, "n")


def test_placement_per_runtime_kind(echo: Preset, tmp_path: Path) -> None:
    node = tmp_path / "cache"
    bwrap, echo_spec = RuntimeSpec(kind="bwrap"), HarnessSpec(type="echo_test")
    assert harness_root_for(RuntimeSpec(kind="docker", image="i"), node) == IMAGE_HARNESS_ROOT
    assert harness_root_for(bwrap, node) == node
    assert sandbox_binds(bwrap, echo_spec, node) == (str(node / "echo_test" / "1.17.0"),)
    assert sandbox_binds(RuntimeSpec(kind="local"), echo_spec, node) == ()
    assert sandbox_binds(bwrap, HarnessSpec(type="reference"), node) == ()
    # a venv made from another interpreter (a preset needing a newer Python): its prefix too
    venv = node / "echo_test" / "1.17.0" / "venv"
    venv.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /opt/py312/bin\nversion = 3.12.1\n")
    binds = sandbox_binds(bwrap, echo_spec, node)
    assert binds == (str(node / "echo_test" / "1.17.0"), "/opt/py312")
    (venv / "pyvenv.cfg").write_text(f"home = {sys.base_prefix}/bin\n")  # the worker's own
    assert sandbox_binds(bwrap, echo_spec, node) == binds[:1]
    (venv / "pyvenv.cfg").write_text("home = /bin\n")  # never the whole root
    assert sandbox_binds(bwrap, echo_spec, node) == binds[:1]


def test_harness_cli_list_and_errors(tmp_path: Path) -> None:
    env = {**os.environ, "POLAR_MQ_HARNESS_ROOT": str(tmp_path / "cache")}
    cli = [sys.executable, "-m", "polar_mq.cli", "harness"]
    listed = subprocess.run([*cli, "list"], capture_output=True, text=True, env=env, check=False)
    assert listed.returncode == 0, listed.stderr
    assert "preset" in listed.stdout and "API family" in listed.stdout
    unknown = subprocess.run(
        [*cli, "install", "no_such_preset"], capture_output=True, text=True, env=env, check=False
    )
    assert unknown.returncode == 2 and "unknown preset 'no_such_preset'" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    nothing = subprocess.run(
        [*cli, "install"], capture_output=True, text=True, env=env, check=False
    )
    assert nothing.returncode == 2 and "--all" in nothing.stderr


def test_a_preset_without_mcp_or_skills_refuses_them(
    echo: Preset, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(EchoPreset, "takes_mcp", False)
    mcp = {"mcp_servers": {"m": {"url": "http://m"}}}
    with pytest.raises(ValueError, match=r"the echo_test preset takes no mcp_servers$"):
        get_harness({"type": "echo_test", "options": mcp})
    get_harness({"type": "echo_test", "options": {"skills": {"s": "# S"}}})  # still taken
