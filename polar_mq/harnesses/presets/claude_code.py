"""Claude Code (npm `@anthropic-ai/claude-code`): Anthropic Messages, streamed.

How it is run (one shell line, `sh -c`, from the workspace)::

    claude --print --model MODEL --max-turns N --output-format stream-json --verbose
           --permission-mode bypassPermissions [--mcp-config .polar/claude/mcp.json
           --strict-mcp-config] [--system-prompt TEXT] [--tools T,..] [EXTRA_ARGS]
           -- "$POLAR_INSTRUCTION" | tee .polar/claude/transcript.jsonl

- Endpoint and key: `ANTHROPIC_BASE_URL` (the proxy's root) and `ANTHROPIC_API_KEY` /
  `ANTHROPIC_AUTH_TOKEN` (the rollout token), set for every harness. It first probes `HEAD /`,
  then posts `/v1/messages?beta=true` with 48-78 KB of prompt and tool definitions and
  `max_tokens` 32000 unless told: with a job `sampling.max_tokens` it is told that budget
  (`CLAUDE_CODE_MAX_OUTPUT_TOKENS`; the proxy enforces it either way). An answer cut at the budget
  makes it ask the model to go on, up to three times, then exit 1 ("exceeded the output token
  maximum"): give it a budget its answers fit in. Every model alias it may pick for itself
  (haiku/sonnet/opus class, sub-agents) is pointed at `ctx.model`.
- Config and state: `CLAUDE_CONFIG_DIR=<workspace>/.polar/claude` (settings, session jsonl,
  skills), HOME is `<workspace>/.polar/home`. Telemetry, error reporting, auto-update, the bug
  command and all non-essential traffic are off (`CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC` and
  friends). Permission prompts: `bypassPermissions`; Claude Code refuses that as root unless
  `IS_SANDBOX=1`, which is set (a rollout workspace is the sandbox).
- The instruction is the last argument, after `--`, so an instruction starting with `-` is never
  taken for an option (it comes from `$POLAR_INSTRUCTION`, so it never passes through the shell).
- Turn limit: `--max-turns options.max_turns` (it exits 1 with "Reached max turns" past it).
- MCP servers: `options.mcp_servers` as `{"mcpServers": {...}}` in `.polar/claude/mcp.json`
  (`--mcp-config`, `--strict-mcp-config`: no other MCP source). Skills: `options.skills` as
  `.polar/claude/skills/<name>/SKILL.md` (offered through its `Skill` tool).
- Every tool is sent inline (`ENABLE_TOOL_SEARCH=false`): deferred tools (MCP tools by default)
  rely on a server-side tool search that an engine behind the proxy does not have.
- Prompt size: `options.system_prompt` replaces its long default system prompt and
  `options.tools` limits its built-in tools (e.g. `["Bash"]`), for models with a short context.

Answer: the result text, i.e. the last assistant message of the main loop (side calls excluded).
Artifacts: `transcript` = the `stream-json` event stream (init, every assistant message, every
tool result, the final `result` with turns and errors), also printed to the agent log.
Side calls (stored as auxiliary, never samples): requests without tools (session titles, topic
detection, quota/haiku probes, summaries: the main loop always offers its tools, so
`options.tools` cannot be empty). 2.1.332 made none in `--print` mode in our runs, with or without
non-essential traffic. A `max_tokens` rule would not do: the rules see the request after the
job's budget was applied.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field, field_validator

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
from polar_mq.harnesses.presets.keep_file import tee_keeping_status

CONFIG_DIR = f"{STATE_DIR}/claude"
TRANSCRIPT = f"{CONFIG_DIR}/transcript.jsonl"
MCP_CONFIG = f"{CONFIG_DIR}/mcp.json"
_STATUS = f"{CONFIG_DIR}/exit_status"
_MODEL_VARS = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
)
_QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_BUG_COMMAND": "1",
    "DISABLE_COST_WARNINGS": "1",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    "IS_SANDBOX": "1",
    "ENABLE_TOOL_SEARCH": "false",
}


_SKILL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_skill_names(skills: dict[str, str]) -> dict[str, str]:
    """Skill names become directory names: one safe path component each."""
    for name in skills:
        if not _SKILL_NAME.fullmatch(name) or ".." in name:
            raise ValueError(f"skill name {name!r} must be letters, digits, '_', '-', '.'")
    return skills


class ClaudeCodeOptions(PresetOptions):
    """Claude Code's options on top of the common ones."""

    system_prompt: str | None = Field(
        None, min_length=1, description="replaces the default system prompt (--system-prompt)"
    )
    tools: list[str] | None = Field(
        None,
        min_length=1,
        description="built-in tools offered (--tools), e.g. ['Bash']; default: all (never none:"
        " a call without tools is taken for a side call)",
    )

    _skills = field_validator("skills")(check_skill_names)


class ClaudeCode(Preset):
    name = "claude_code"
    api_family = "messages"
    package = Package(Ecosystem.NPM, "@anthropic-ai/claude-code", "2.1.332")
    options_model: ClassVar[type[PresetOptions]] = ClaudeCodeOptions
    answer = AnswerSource(None, "the result text: the main loop's last assistant message")
    auxiliary = (AuxiliaryRule(no_tools=True),)
    artifacts: ClassVar[Mapping[str, str]] = {"transcript": TRANSCRIPT}
    notes = "native binary; bypassPermissions as root needs IS_SANDBOX=1 (set)"

    def argv(self, run: PresetRun) -> list[str]:
        return [*self._options(run, run.options.extra_args), "--", run.ctx.instruction]

    def _options(self, run: PresetRun, extra: list[str]) -> list[str]:
        options = run.options
        assert isinstance(options, ClaudeCodeOptions)
        args = [
            run.install.program("claude"),
            "--print",
            "--model", run.ctx.model,
            "--max-turns", str(options.max_turns),
            "--output-format", "stream-json",
            "--verbose",
            "--permission-mode", "bypassPermissions",
        ]  # fmt: skip
        if options.mcp_servers:
            args += ["--mcp-config", f"{run.ctx.workdir}/{MCP_CONFIG}", "--strict-mcp-config"]
        if options.system_prompt is not None:
            args += ["--system-prompt", options.system_prompt]
        if options.tools is not None:
            args += ["--tools", ",".join(options.tools)]
        return [*args, *extra]

    def command(self, run: PresetRun) -> str:
        """Claude Code with its event stream copied to the transcript, keeping its exit status.

        The instruction comes from `$POLAR_INSTRUCTION` (set for every harness), after `--`."""
        program = [*self._options(run, run.options.extra_args), "--"]
        return tee_keeping_status(program, run.ctx.workdir, CONFIG_DIR, TRANSCRIPT, _STATUS)

    def files(self, run: PresetRun) -> dict[str, str]:
        files: dict[str, str] = {}
        if run.options.mcp_servers:
            servers = {name: _mcp_entry(s) for name, s in run.options.mcp_servers.items()}
            files[MCP_CONFIG] = json.dumps({"mcpServers": servers}, indent=2)
        for name, text in run.options.skills.items():
            files[f"{CONFIG_DIR}/skills/{name}/SKILL.md"] = text
        return files

    def env(self, run: PresetRun) -> dict[str, str]:
        env = {
            "CLAUDE_CONFIG_DIR": f"{run.ctx.workdir}/{CONFIG_DIR}",
            **_QUIET,
            **dict.fromkeys(_MODEL_VARS, run.ctx.model),
        }
        budget = run.ctx.extra_env.get("POLAR_AGENT_MAX_TOKENS")
        if budget is not None:  # ask for the job's budget (the proxy enforces it anyway)
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = budget
        return env


def _mcp_entry(server: McpServer) -> dict[str, object]:
    if server.url is not None:
        return {"type": "http", "url": server.url}
    return {"type": "stdio", "command": server.command, "args": server.args, "env": server.env}


PRESET = ClaudeCode()
