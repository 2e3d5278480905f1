"""Rollout contexts and a preset harness for command-line / config unit tests (no install):
`context()` with fixed paths, `preset_ctx(tmp_path)` with a workspace under a test's tmp_path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polar_mq.harnesses.base import AgentContext
from polar_mq.harnesses.presets.harness import PresetHarness
from polar_mq.harnesses.presets.registry import get_preset
from polar_mq.spec import HarnessSpec

WORKDIR = "/work/rollout/workspace"
PROXY = "http://127.0.0.1:8401/v1"


def context(instruction: str = "Fix the bug; it's in 'a b'.txt") -> AgentContext:
    return AgentContext(
        rollout_id="r-1",
        instruction=instruction,
        task_file=f"{WORKDIR}/task.json",
        workdir=WORKDIR,
        proxy_base_url=PROXY,
        api_key="rollout-token",
        model="my-model",
        harness_root=Path("/cache/harnesses"),
    )


def harness(name: str, **spec: Any) -> PresetHarness:
    preset = get_preset(name)
    assert preset is not None, name
    return PresetHarness(preset, HarnessSpec.model_validate({"type": name, **spec}))


def preset_ctx(tmp_path: Path, **overrides: object) -> AgentContext:
    fields: dict[str, object] = {
        "rollout_id": "r-1",
        "instruction": 'It\'s $(id) `x` & "6*7"?',
        "task_file": str(tmp_path / "ws" / "task.json"),
        "workdir": str(tmp_path / "ws"),
        "proxy_base_url": "http://127.0.0.1:8010/v1",
        "api_key": "tok-abc",
        "model": "smollm2",
        "harness_root": tmp_path / "harnesses",
    }
    fields.update(overrides)
    return AgentContext(**fields)  # type: ignore[arg-type]
