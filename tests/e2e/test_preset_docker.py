"""Presets under the docker runtime: baked into an image by scripts/build_preset_image.sh.

The image gets qwen_code (an npm install and the host's node copied in) and smolagents (a venv
built inside the image from wheels fetched on the host); the rollouts run them in containers
through the real pipeline and proxy, on the node's network and with `network: proxy_only` (the
container has loopback only; the presets reach the proxy through the in-container forwarder,
docs/hardening.md). An image without the job's preset fails the rollout at prepare with the
command that builds one, before any agent runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.e2e.preset_support import PresetStack, assert_captured, explain, run_preset

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
IMAGE = "polar-mq-presets:test"
PRESETS = ("qwen_code", "smolagents")


@pytest.fixture(scope="module")
def preset_image() -> str:
    try:
        from polar_mq.runtimes.docker import docker_available
    except ImportError:
        pytest.skip("docker SDK missing")
    if (why := docker_available()) is not None:
        pytest.skip(why)
    build = subprocess.run(
        ["bash", "scripts/build_preset_image.sh", *PRESETS],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=1200,
        env={**os.environ, "IMAGE": IMAGE, "PYTHON": sys.executable},
    )  # fmt: skip
    if build.returncode != 0:
        pytest.skip(f"preset image not built here: {(build.stdout + build.stderr)[-1500:]}")
    return IMAGE


def _runtime(image: str, network: str = "host") -> dict[str, object]:
    return {"kind": "docker", "image": image, "network": network}


@pytest.mark.parametrize("network", ["host", "proxy_only"])
def test_presets_run_inside_the_image(
    preset_stack: PresetStack,
    db_session_factory: sessionmaker[Session],
    preset_image: str,
    network: str,
) -> None:
    smol = preset_stack.plan(
        f"docker_smolagents_{network}",
        {"turns": [{"tool": "python_interpreter", "arguments": {"code": "print(6 * 7)"}},
                   {"tool": "final_answer", "arguments": {"answer": "42"}}], "after": "41"},
    )  # fmt: skip
    qwen = preset_stack.plan(
        f"docker_qwen_{network}",
        {"turns": [{"tool": "run_shell_command", "arguments": {"command": "echo 42 > r.txt"}},
                   {"text": "ANSWER: 42"}],
         "side": [{"when": {"system_contains": "memory extraction subagent"}, "text": "no"}],
         "after": "ANSWER: 7"},
    )  # fmt: skip
    for harness, tag in (({"type": "smolagents"}, smol), ({"type": "qwen_code"}, qwen)):
        run = run_preset(
            preset_stack,
            db_session_factory,
            {**harness, "options": {"max_turns": 4}},
            [{"instruction": f"{tag} What is 6*7?", "answer": "42"}],
            evaluator="exact_match",
            runtime=_runtime(preset_image, network),
            timeouts={"agent_s": 240},
        )
        assert_captured(run, min_calls=2)
        (rollout,) = run.rollouts
        assert rollout.reward == 1.0, explain(run)
        main = [c for c in run.calls[rollout.id] if c.purpose == "agent"]
        assert len(main) >= 2 and "transcript" in run.artifacts[rollout.id], explain(run)
        assert "6 * 7" in str(main[1].request["messages"]) or "42" in str(main[1].request)
        calls = len(run.calls[rollout.id])
        print(f"{harness['type']} in docker ({network}): {calls} calls, {run.seconds:.1f}s")


def test_an_image_without_the_preset_fails_at_prepare(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session], preset_image: str
) -> None:
    run = run_preset(
        preset_stack,
        db_session_factory,
        {"type": "aider"},  # not in the image
        [{"instruction": "What is 6*7?", "answer": "42"}],
        runtime=_runtime(preset_image),
    )
    (rollout,) = run.rollouts
    assert rollout.status == "failed" and rollout.termination_reason == "runtime_error"
    assert rollout.error is not None and "build_preset_image.sh aider@" in rollout.error
    assert not run.calls[rollout.id]
