"""Gemini CLI (npm `@google/gemini-cli`): Gemini `streamGenerateContent`, headless.

How it is run (one shell line, `sh -c`, from the workspace)::

    gemini --model MODEL --approval-mode yolo --skip-trust --output-format stream-json
           [EXTRA_ARGS] --prompt "$POLAR_INSTRUCTION" | tee .polar/gemini/transcript.jsonl

- Endpoint and key: `GOOGLE_GEMINI_BASE_URL` (the proxy's root; plain http is allowed for
  loopback only, which is where the proxy is) and `GEMINI_API_KEY` (the rollout token), set for
  every harness; the settings select the `gemini-api-key` auth type, so it never asks to log in.
- Config and state: `GEMINI_CLI_HOME=<workspace>/.polar/gemini`, so its user settings are
  `.polar/gemini/.gemini/settings.json` (written before it starts) and its session files, skills
  and caches live there too. Usage statistics, telemetry, auto-update and update notifications,
  checkpointing and folder trust are off.
- Permission prompts: `--approval-mode yolo` (every tool call approved); `--skip-trust` trusts the
  workspace for the session.
- Turn limit: `model.maxSessionTurns = options.max_turns` in its settings (it exits 53 past it).
- The instruction is the value of `--prompt`, from `$POLAR_INSTRUCTION` (never through the
  shell's parser); stdin is `/dev/null`, so nothing is appended to it.
- MCP servers: `options.mcp_servers` in the settings' `mcpServers` (a URL server as `httpUrl`,
  streamable HTTP); skills: `options.skills` as `.polar/gemini/.gemini/skills/<name>/SKILL.md`.

Answer: the last assistant message of the main loop (what it prints as its response).
Artifacts: `transcript` = its `stream-json` event stream (init, user and assistant messages,
tool uses and results, errors, the final result with stats), also printed to the agent log.
Side calls (stored as auxiliary, never samples): requests that offer no tools (its model-routing
classifier, next-speaker and loop-detection checks, history compression, tool-output summaries:
the main loop always offers its tools).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import field_validator

from polar_mq.harnesses.auxiliary import AuxiliaryRule
from polar_mq.harnesses.base import AnswerSource
from polar_mq.harnesses.presets.base import (
    STATE_DIR,
    Ecosystem,
    McpServer,
    Package,
    Preset,
    PresetOptions,
    PresetRun,
)
from polar_mq.harnesses.presets.claude_code import check_skill_names
from polar_mq.harnesses.presets.keep_file import tee_keeping_status

GEMINI_HOME = f"{STATE_DIR}/gemini"
SETTINGS = f"{GEMINI_HOME}/.gemini/settings.json"
TRANSCRIPT = f"{GEMINI_HOME}/transcript.jsonl"
_STATUS = f"{GEMINI_HOME}/exit_status"


class GeminiCliOptions(PresetOptions):
    _skills = field_validator("skills")(check_skill_names)


class GeminiCli(Preset):
    name = "gemini_cli"
    api_family = "gemini"
    package = Package(Ecosystem.NPM, "@google/gemini-cli", "0.61.0")
    options_model: ClassVar[type[PresetOptions]] = GeminiCliOptions
    answer = AnswerSource(None, "the last assistant message of the main loop (its response)")
    auxiliary = (AuxiliaryRule(no_tools=True),)
    artifacts: ClassVar[Mapping[str, str]] = {"transcript": TRANSCRIPT}
    notes = "turn limit via settings model.maxSessionTurns (exit 53 past it)"

    def _options(self, run: PresetRun) -> list[str]:
        return [
            run.install.program("gemini"),
            "--model", run.ctx.model,
            "--approval-mode", "yolo",
            "--skip-trust",
            "--output-format", "stream-json",
            *run.options.extra_args,
        ]  # fmt: skip

    def argv(self, run: PresetRun) -> list[str]:
        return [*self._options(run), "--prompt", run.ctx.instruction]

    def command(self, run: PresetRun) -> str:
        """Gemini CLI with its event stream copied to the transcript, keeping its exit status."""
        program = [*self._options(run), "--prompt"]
        return tee_keeping_status(program, run.ctx.workdir, GEMINI_HOME, TRANSCRIPT, _STATUS)

    def files(self, run: PresetRun) -> dict[str, str]:
        settings: dict[str, Any] = {
            "general": {
                "enableAutoUpdate": False,
                "enableAutoUpdateNotification": False,
                "checkpointing": {"enabled": False},
            },
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "security": {
                "auth": {"selectedType": "gemini-api-key"},
                "folderTrust": {"enabled": False},
            },
            "model": {"maxSessionTurns": run.options.max_turns},
        }
        if run.options.mcp_servers:
            settings["mcpServers"] = {
                name: _mcp_entry(server) for name, server in run.options.mcp_servers.items()
            }
        files = {SETTINGS: json.dumps(settings, indent=2)}
        for name, text in run.options.skills.items():
            files[f"{GEMINI_HOME}/.gemini/skills/{name}/SKILL.md"] = text
        return files

    def env(self, run: PresetRun) -> dict[str, str]:
        return {
            "GEMINI_CLI_HOME": f"{run.ctx.workdir}/{GEMINI_HOME}",
            "GEMINI_TELEMETRY_ENABLED": "false",
            "GEMINI_CLI_NO_RELAUNCH": "true",
            "NO_BROWSER": "true",
        }


def _mcp_entry(server: McpServer) -> dict[str, object]:
    if server.url is not None:
        return {"httpUrl": server.url, "trust": True}
    return {"command": server.command, "args": server.args, "env": server.env, "trust": True}


PRESET = GeminiCli()
