"""A rollout context for preset unit tests (no network, no install)."""

from __future__ import annotations

from pathlib import Path

from polar_mq.harnesses import AgentContext


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
