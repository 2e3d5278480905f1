"""Every third-party preset under `bwrap` with the network it gets by default: `proxy_only`.

The job names no `runtime.network`; an untrusted preset under bwrap is then stored (and run) with
`proxy_only` (docs/hardening.md): the sandbox has loopback only and reaches the proxy through the
in-sandbox forwarder, nothing else. Each harness runs its shell tool (writing a file the diff
shows) and answers; the answer is graded by `exact_match`. The install is bound read-only and
node comes from the host. No `NO_REGISTRY`-style environment: whatever a harness tries to reach
on its own (update checks, registries, telemetry) simply is not there, and it must still finish.
smolagents, mini_swe_agent and aider have their own bwrap/proxy_only cases in their test files.
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.e2e.preset_support import (
    PresetStack,
    assert_captured,
    explain,
    install_preset,
    run_preset,
)

pytestmark = pytest.mark.e2e

SIDE = {"when": {"no_tools": True}, "text": "ANSWER: 7"}
QWEN_MEMORY = {"when": {"system_contains": "memory extraction subagent"}, "text": "ANSWER: 7"}
OPENCODE_TITLE = {"when": {"system_contains": "You are a title generator"}, "text": "ANSWER: 7"}
SHELL: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {
    # preset -> (its shell tool call writing result.txt, its side-call rules)
    "claude_code": (
        {"tool": "Bash", "arguments": {"command": "echo 42 > result.txt", "description": "save"}},
        [SIDE],
    ),
    "codex": ({"tool": "exec_command", "arguments": {"cmd": "echo 42 > result.txt"}}, []),
    "gemini_cli": (
        {"tool": "run_shell_command", "arguments": {"command": "echo 42 > result.txt"}},
        [SIDE],
    ),
    "qwen_code": (
        {"tool": "run_shell_command", "arguments": {"command": "echo 42 > result.txt"}},
        [QWEN_MEMORY],
    ),
    "opencode": (
        {"tool": "bash", "arguments": {"command": "echo 42 > result.txt", "description": "save"}},
        [OPENCODE_TITLE],
    ),
    "openai_agents": ({"tool": "run_shell", "arguments": {"command": "echo 42 > result.txt"}}, []),
    "openhands_sdk": (
        {
            "tool": "terminal",
            "arguments": {"command": "echo 42 > result.txt", "security_risk": "LOW"},
        },
        [],
    ),
}
FINAL = {
    "openhands_sdk": {"tool": "finish", "arguments": {"message": "Done. ANSWER: 42"}},
}


@pytest.mark.parametrize("preset", sorted(SHELL))
def test_preset_runs_under_bwrap_with_the_default_proxy_only_network(
    preset: str, preset_stack: PresetStack, db_session_factory: sessionmaker[Session]
) -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed")
    install_preset(preset)
    shell, side = SHELL[preset]
    tag = preset_stack.plan(
        f"proxy_only_{preset}",
        {
            "turns": [shell, FINAL.get(preset, {"text": "ANSWER: 42"})],
            "side": side,
            "after": "ANSWER: 7",
        },
    )
    run = run_preset(
        preset_stack,
        db_session_factory,
        {"type": preset, "options": {"max_turns": 5}},
        [{"instruction": f"{tag} What is 6*7? Put it in result.txt.", "answer": "42"}],
        evaluator="exact_match",
        runtime={"kind": "bwrap", "prepare": {"commands": ["git init -q"]}},
        timeouts={"agent_s": 240},
    )
    assert run.runtime["network"] == "proxy_only", run.runtime  # the default, not asked for
    assert_captured(run, min_calls=2)
    rollout = run.rollouts[0]
    calls = run.calls[rollout.id]
    main = [c for c in calls if c.purpose != "auxiliary"]
    print(f"{preset} (bwrap, proxy_only): {len(calls)} calls in {run.seconds:.1f}s")
    assert len(main) == 2, explain(run)
    diff = run.artifacts[rollout.id]["workspace.diff"].decode()
    assert "result.txt" in diff and "+42" in diff, explain(run)  # the tool really ran inside
    assert rollout.reward == 1.0, explain(run)
