"""CommandHarness: placeholders are shell-safe, the proxy wiring is complete and authoritative."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from polar_mq.harnesses import (
    PROXY_ENV_VARS,
    AgentContext,
    CommandHarness,
    get_harness,
    reference_command,
)
from polar_mq.spec import HarnessSpec, RuntimeSpec

HOSTILE = 'It\'s "quoted"; $(touch pwned) `id` & a\nnewline {model}'


def make_ctx(**overrides: object) -> AgentContext:
    fields: dict[str, object] = {
        "rollout_id": "r-1",
        "instruction": "What is 6*7?",
        "task_file": "/work/task.json",
        "workdir": "/work dir",
        "proxy_base_url": "http://127.0.0.1:8010/v1",
        "api_key": "tok-abc",
        "model": "smollm2",
        "extra_env": {},
    }
    fields.update(overrides)
    return AgentContext(**fields)  # type: ignore[arg-type]


def _run(harness: CommandHarness, ctx: AgentContext, cwd: Path) -> str:
    """The command through /bin/sh with the agent's environment, as runtimes run it."""
    out = subprocess.run(
        ["/bin/sh", "-c", harness.command(ctx)],
        capture_output=True, text=True, check=True, cwd=cwd, env=harness.env(ctx),
    )  # fmt: skip
    assert not list(cwd.iterdir()), "the hostile value ran as code"
    return out.stdout


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("printf '%s|%s|%s' {instruction} {workdir} {model}", "{i}|/work dir|smollm2"),
        ('printf "%s" "{instruction}"', "{i}"),
        ('printf "%s" "before {instruction} after"', "before {i} after"),
        ("printf '%s' 'before {instruction} after'", "before {i} after"),
        ('printf "%s" "$(printf "%s" {instruction})"', "{i}"),
        ('printf "%s" "$(printf "%s" "{instruction}")"', "{i}"),
        ("printf '%s' \"`printf '%s' '{model}'`\"", "smollm2"),
        ("echo {instruction} | cat", "{i}\n"),
        ('printf "%s" \\"{model}', '"smollm2'),
    ],
)
def test_placeholders_are_never_shell_code_in_any_quoting(
    tmp_path: Path, template: str, expected: str
) -> None:
    ctx = make_ctx(instruction=HOSTILE)
    got = _run(CommandHarness(template), ctx, tmp_path)
    assert got == expected.replace("{i}", HOSTILE)


def test_every_placeholder_and_foreign_braces() -> None:
    harness = CommandHarness(
        "run {rollout_id} {task_file} {workdir} {model} ${HOME} {unknown} awk '{print $1}'"
    )
    assert harness.command(make_ctx()) == (
        'run "${POLAR_ROLLOUT_ID}" "${POLAR_TASK_FILE}" "${POLAR_WORKDIR}" "${POLAR_MODEL}" '
        "${HOME} {unknown} awk '{print $1}'"
    )


def test_env_wires_the_proxy() -> None:
    env = CommandHarness("true").env(make_ctx(proxy_base_url="http://proxy:8010/v1/"))
    assert env == {
        "OPENAI_BASE_URL": "http://proxy:8010/v1",
        "OPENAI_API_KEY": "tok-abc",
        "ANTHROPIC_BASE_URL": "http://proxy:8010",
        "ANTHROPIC_API_KEY": "tok-abc",
        "ANTHROPIC_AUTH_TOKEN": "tok-abc",
        "GEMINI_API_KEY": "tok-abc",
        "GOOGLE_API_KEY": "tok-abc",
        "GOOGLE_GEMINI_BASE_URL": "http://proxy:8010",
        "POLAR_ROLLOUT_ID": "r-1",
        "POLAR_INSTRUCTION": "What is 6*7?",
        "POLAR_TASK_FILE": "/work/task.json",
        "POLAR_WORKDIR": "/work dir",
        "POLAR_MODEL": "smollm2",
        "POLAR_PYTHON": sys.executable,
    }
    assert set(env) == PROXY_ENV_VARS


def test_user_and_extra_env() -> None:
    harness = CommandHarness("true", {"MODEL_NAME": "openai/{model}", "LEVEL": "user"})
    env = harness.env(make_ctx(extra_env={"LEVEL": "rollout", "OPENAI_API_KEY": "leak"}))
    assert env["MODEL_NAME"] == "openai/smollm2"  # placeholders in env values, unquoted
    assert env["LEVEL"] == "rollout"  # the rollout's extra env beats the harness default
    assert env["OPENAI_API_KEY"] == "tok-abc"  # the proxy wiring always wins


def test_reserved_and_invalid_env_are_refused() -> None:
    with pytest.raises(ValueError, match="may not set OPENAI_BASE_URL"):
        CommandHarness("agent", {"OPENAI_BASE_URL": "http://elsewhere"})
    with pytest.raises(ValueError, match="str to str"):
        CommandHarness("agent", {"N": 3})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="non-empty 'command'"):
        CommandHarness("   ")


def test_get_harness_command_and_reference() -> None:
    harness = get_harness({"type": "command", "command": "my-agent {instruction}", "env": {}})
    assert harness.command(make_ctx()) == 'my-agent "${POLAR_INSTRUCTION}"'

    reference = get_harness({"type": "reference", "env": {"POLAR_AGENT_TOOLS": "native"}})
    assert reference.command(make_ctx()) == '"${POLAR_PYTHON}" -m polar_mq.agents.tool_agent'
    assert reference_command().endswith("-m polar_mq.agents.tool_agent")
    assert sys.executable in reference_command()
    assert reference.env(make_ctx())["POLAR_AGENT_TOOLS"] == "native"


def test_reference_agent_runs_with_the_runtimes_interpreter(tmp_path: Path) -> None:
    """Per runtime kind: the worker's interpreter for local, the image's python3 for docker."""
    from polar_mq.runtimes import get_runtime, runtime_from_spec

    reference = get_harness({"type": "reference"})
    local = get_runtime("local", "rt-1", tmp_path)
    assert local.python == sys.executable
    docker = runtime_from_spec(RuntimeSpec(kind="docker", image="img"), "rt-1", tmp_path)
    assert docker.python == "python3"
    assert reference.env(make_ctx(python=docker.python))["POLAR_PYTHON"] == "python3"
    custom = runtime_from_spec(
        RuntimeSpec(kind="docker", image="img", python="/opt/venv/bin/python"), "rt-1", tmp_path
    )
    env = reference.env(make_ctx(python=custom.python))
    assert env["POLAR_PYTHON"] == "/opt/venv/bin/python"
    assert reference.command(make_ctx()).startswith('"${POLAR_PYTHON}" -m')
    with pytest.raises(ValueError, match="python"):
        runtime_from_spec(RuntimeSpec(kind="local", python="python3"), "rt-1", tmp_path)
    command = get_harness({"type": "command", "command": "{python} agent.py"})
    assert command.command(make_ctx()) == '"${POLAR_PYTHON}" agent.py'
    assert command.env(make_ctx(python="/usr/bin/python3"))["POLAR_PYTHON"] == "/usr/bin/python3"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "swe-magic"}, "unknown harness type 'swe-magic'; known types: command, ref"),
        ({"type": None}, "type: Input should be a valid string"),
        ({"type": "command"}, "non-empty 'command'"),
        ({"type": "command", "command": "x", "cmd": "y"}, "unknown key\\(s\\) 'cmd'"),
        ({"type": "reference", "command": "x"}, "unknown key\\(s\\) 'command'"),
        ({"type": "command", "command": "x", "env": ["A=1"]}, "env: Input should be a valid dict"),
        ({"type": "command", "command": "x", "env": {"A": 1}}, "env.A: Input should be"),
        ("command", "harness spec must be a mapping, got str"),
    ],
)
def test_get_harness_rejects_bad_specs(spec: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        get_harness(spec)


def test_typed_and_mapping_specs_build_the_same_harness() -> None:
    """A job's typed spec and a library caller's mapping are one spec; `{}` is the reference
    agent, as an empty `harness` of a job is."""
    ctx = make_ctx()
    typed = get_harness(HarnessSpec(type="command", command="run {model}", env={"A": "1"}))
    mapped = get_harness({"type": "command", "command": "run {model}", "env": {"A": "1"}})
    assert (typed.command(ctx), typed.env(ctx)) == (mapped.command(ctx), mapped.env(ctx))
    assert get_harness({}).command(ctx) == get_harness(HarnessSpec()).command(ctx)
    assert "tool_agent" in get_harness({}).command(ctx)
    with pytest.raises(ValidationError, match="unknown key\\(s\\) 'artifacts' in 'reference'"):
        HarnessSpec(type="reference", artifacts={"a": "b"})  # the model refuses it too
    with pytest.raises(ValidationError, match="auto_install"):
        HarnessSpec.model_validate({"type": "aider", "auto_install": "yes"})  # strict
