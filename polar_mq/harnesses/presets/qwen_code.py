"""Qwen Code (npm `@qwen-code/qwen-code`): `qwen` headless on the proxy's chat completions.

How it is run::

    sh -c '"$@"; ...keep the chat recording...' qwen-preset \
        qwen --auth-type openai -m MODEL --max-session-turns N --yolo INSTRUCTION

with `QWEN_HOME=<ws>/.polar/qwen` holding a generated `settings.json` (auth type `openai`, the
model, update checks, usage statistics and telemetry off, approval mode `yolo`, MCP servers) and
the proxy from `OPENAI_BASE_URL` / `OPENAI_API_KEY` (the rollout token). A positional prompt is
one-shot (headless): Qwen Code runs the task and exits; stdin is not a terminal and is not read.

- Turn limit: `options.max_turns` -> `--max-session-turns`.
- MCP servers: `mcpServers.NAME` = `{"command", "args", "env"}` or `{"httpUrl"}` (streamable HTTP).
  Skills: `<ws>/.polar/qwen/polar-skills/NAME/SKILL.md`, listed in `skills.directories`.
- `options.auto_memory` (default true, Qwen Code's own default): its background memory
  extraction after the task; false turns it off (`memory.enableManagedAutoMemory`), which saves
  those calls.
- Answer: the last assistant message of the main loop (the memory calls come after it).
- Artifacts: `transcript` = Qwen Code's chat recording (`$QWEN_HOME/projects/*/chats/*.jsonl`:
  every message, tool call and result), copied when it exits; `agent.log` = its text output.
- Side calls: the managed auto-memory extraction agent after the task (its system prompt names
  it the memory extraction agent): declared auxiliary.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from pydantic import Field, field_validator

from polar_mq.harnesses.auxiliary import AuxiliaryRule
from polar_mq.harnesses.presets.base import Ecosystem, Package, Preset, PresetOptions, PresetRun
from polar_mq.harnesses.presets.keep_file import then_copy

QWEN_HOME = ".polar/qwen"
TRANSCRIPT = f"{QWEN_HOME}/transcript.jsonl"
SKILLS = f"{QWEN_HOME}/polar-skills"
CHATS = '"$QWEN_HOME"/projects/*/chats/*.jsonl'
"""Qwen Code's chat recordings (one per session; the workspace's QWEN_HOME is fresh)."""
BACKGROUND_AGENTS = (
    "managed memory extraction subagent",
    "performing a managed memory dream",
    "reviewing this conversation to extract reusable skills",
)
"""Phrases of the system prompts of Qwen Code's background agents (memory, dream, auto-skill)."""
_SKILL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


class QwenCodeOptions(PresetOptions):
    auto_memory: bool = Field(
        True, description="Qwen Code's background memory extraction after the task"
    )

    @field_validator("skills")
    @classmethod
    def _skill_names(cls, skills: dict[str, str]) -> dict[str, str]:
        for name in skills:
            if not _SKILL_NAME.fullmatch(name):
                raise ValueError(f"skill name {name!r}: letters, digits, '-', '_' and '.' only")
        return skills


class QwenCodePreset(Preset):
    name = "qwen_code"
    api_family = "chat"
    package = Package(Ecosystem.NPM, "@qwen-code/qwen-code", "0.24.4")
    options_model = QwenCodeOptions
    auxiliary = tuple(AuxiliaryRule(system_contains=phrase) for phrase in BACKGROUND_AGENTS)
    artifacts: ClassVar[dict[str, str]] = {"transcript": TRANSCRIPT}
    notes = "declares Node >= 22; runs on Node 20 in our tests"

    def argv(self, run: PresetRun) -> list[str]:
        return [
            *then_copy(CHATS, f'"$POLAR_WORKDIR"/{TRANSCRIPT}', "qwen-preset"),
            run.install.program("qwen"),
            "--auth-type", "openai",
            "-m", run.ctx.model,
            "--max-session-turns", str(run.options.max_turns),
            "--yolo",
            run.ctx.instruction,
        ]  # fmt: skip

    def settings(self, run: PresetRun) -> dict[str, Any]:
        """Qwen Code's user settings (`$QWEN_HOME/settings.json`)."""
        options = run.options
        assert isinstance(options, QwenCodeOptions)
        mcp: dict[str, Any] = {}
        for name, server in options.mcp_servers.items():
            if server.url is not None:
                mcp[name] = {"httpUrl": server.url}
            else:
                mcp[name] = {"command": server.command, "args": list(server.args)}
                if server.env:
                    mcp[name]["env"] = dict(server.env)
        settings: dict[str, Any] = {
            "general": {"enableAutoUpdate": False},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "security": {"auth": {"selectedType": "openai"}},
            "model": {"name": run.ctx.model, "maxSessionTurns": options.max_turns},
            "tools": {"approvalMode": "yolo"},
            "memory": {"enableManagedAutoMemory": options.auto_memory},
        }
        if mcp:
            settings["mcpServers"] = mcp
        if options.skills:
            settings["skills"] = {"directories": [f"{run.ctx.workdir}/{SKILLS}"]}
        return settings

    def files(self, run: PresetRun) -> dict[str, str]:
        files = {f"{QWEN_HOME}/settings.json": json.dumps(self.settings(run), indent=2)}
        for name, text in run.options.skills.items():
            files[f"{SKILLS}/{name}/SKILL.md"] = text
        return files

    def env(self, run: PresetRun) -> dict[str, str]:
        return {"QWEN_HOME": f"{run.ctx.workdir}/{QWEN_HOME}"}


PRESET = QwenCodePreset()
