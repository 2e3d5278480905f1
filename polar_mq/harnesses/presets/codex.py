"""OpenAI Codex CLI (npm `@openai/codex`): `codex exec` on the proxy's Responses API.

How it is run::

    sh -c '"$@"; ...keep the session file...' codex-preset \
        codex exec --skip-git-repo-check --json --dangerously-bypass-approvals-and-sandbox \
            --output-last-message <ws>/.polar/codex/last_message.txt -C <ws> -m MODEL INSTRUCTION

with `CODEX_HOME=<ws>/.polar/codex` holding a generated `config.toml`: a model provider `polar`
(`base_url` = the proxy, `env_key = "OPENAI_API_KEY"` = the rollout token, `wire_api =
"responses"`, so Codex streams `POST /v1/responses` with `store: false` and the whole history each
turn), approvals `never` and sandbox `danger-full-access` (the runtime is the sandbox; Codex's own
Landlock/bwrap sandbox needs namespaces a worker may not have), no update check, no analytics, and
a few retries instead of Codex's default of waiting for the network forever
(`features.unbounded_connection_retries = false`). Features that cannot work offline or that the
proxy's Responses translation cannot carry are off: web search, apps, plugins, image generation,
multi-agent (sent as a `namespace` tool), goals, `request_user_input` (nobody answers), view_image.
With a model name Codex's catalog does not know (the usual case for RL), Codex uses fallback
metadata and offers `exec_command` + `write_stdin` (no freeform `apply_patch`).

- Turn limit: Codex has none; `options.max_turns` is not applied (bound the run with the job's
  `timeouts.agent_s`). An answer cut at the token limit fails Codex's turn (exit 1).
- `options.instructions`: replaces Codex's ~17 KB base instructions (`model_instructions_file`), for
  small-context models; `options.environment_context: false` (the default) leaves out the
  `<environment_context>` message.
- MCP servers: `[mcp_servers.NAME]` tables (`command`/`args`/`env` or `url`). Skills:
  `$CODEX_HOME/skills/NAME/SKILL.md` (skill instructions are only in the prompt when there are).
- Answer: the file `--output-last-message` writes (Codex's final message).
- Artifacts: `transcript` = Codex's session rollout file (every response item, tool call and
  output), copied when Codex exits; `agent.log` holds the `--json` event stream.
- Side calls: none observed (no title or memory call in `exec`); a long session may make a
  compaction call, which is part of the agent's own loop.
"""

from __future__ import annotations

import json
import re
from typing import ClassVar

from pydantic import Field, field_validator

from polar_mq.harnesses.base import AnswerSource
from polar_mq.harnesses.presets.base import Ecosystem, Package, Preset, PresetOptions, PresetRun
from polar_mq.harnesses.presets.keep_file import then_copy

CODEX_HOME = ".polar/codex"
LAST_MESSAGE = f"{CODEX_HOME}/last_message.txt"
TRANSCRIPT = f"{CODEX_HOME}/transcript.jsonl"
INSTRUCTIONS = f"{CODEX_HOME}/instructions.md"
PROVIDER = "polar"
DISABLED_FEATURES = (
    "apps",
    "browser_use",
    "computer_use",
    "enable_request_compression",
    "goals",
    "image_generation",
    "plugins",
    "shell_snapshot",
    "skill_search",
    "sleep_tool",
    "tool_suggest",
    "unbounded_connection_retries",
    "view_image",
)
"""Off: network-only features, tools the proxy cannot carry, and retrying forever."""

SESSION_FILES = '"$CODEX_HOME"/sessions/*/*/*/rollout-*.jsonl'
"""Codex's session rollout files (one per run: the workspace's CODEX_HOME is fresh)."""
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SKILL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


class CodexOptions(PresetOptions):
    instructions: str | None = Field(
        None,
        description="replaces Codex's base instructions (model_instructions_file); small contexts",
    )
    environment_context: bool = Field(
        False, description="send Codex's <environment_context> message (cwd, shell, date)"
    )
    request_max_retries: int = Field(2, ge=0, le=20)
    stream_max_retries: int = Field(2, ge=0, le=20)

    @field_validator("skills")
    @classmethod
    def _skill_names(cls, skills: dict[str, str]) -> dict[str, str]:
        for name in skills:
            if not _SKILL_NAME.fullmatch(name):
                raise ValueError(f"skill name {name!r}: letters, digits, '-', '_' and '.' only")
        return skills


def toml_value(value: object) -> str:
    """A TOML value for a string, bool, int, list of those, or a table of strings (inline)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON strings are TOML basic strings
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items())
        return "{" + items + "}"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else toml_value(key)


def toml_table(name: str, values: dict[str, object]) -> list[str]:
    return ["", f"[{name}]", *(f"{toml_key(k)} = {toml_value(v)}" for k, v in values.items())]


class CodexPreset(Preset):
    name = "codex"
    api_family = "responses"
    package = Package(Ecosystem.NPM, "@openai/codex", "0.171.0")
    options_model = CodexOptions
    answer = AnswerSource(LAST_MESSAGE, "Codex's final message (codex exec --output-last-message)")
    artifacts: ClassVar[dict[str, str]] = {"transcript": TRANSCRIPT}
    notes = "no turn limit in codex exec: max_turns is not applied, use timeouts.agent_s"

    def argv(self, run: PresetRun) -> list[str]:
        workdir = run.ctx.workdir
        return [
            *then_copy(SESSION_FILES, f'"$POLAR_WORKDIR"/{TRANSCRIPT}', "codex-preset"),
            run.install.program("codex"), "exec",
            "--skip-git-repo-check",
            "--json",
            "--dangerously-bypass-approvals-and-sandbox",
            "--output-last-message", f"{workdir}/{LAST_MESSAGE}",
            "-C", workdir,
            "-m", run.ctx.model,
            run.ctx.instruction,
        ]  # fmt: skip

    def files(self, run: PresetRun) -> dict[str, str]:
        options = run.options
        assert isinstance(options, CodexOptions)
        top: dict[str, object] = {
            "model": run.ctx.model,
            "model_provider": PROVIDER,
            "approval_policy": "never",
            "sandbox_mode": "danger-full-access",
            "check_for_update_on_startup": False,
            "web_search": "disabled",
            "include_environment_context": options.environment_context,
        }
        files: dict[str, str] = {}
        if options.instructions is not None:
            files[INSTRUCTIONS] = options.instructions
            top["model_instructions_file"] = f"{run.ctx.workdir}/{INSTRUCTIONS}"
        lines = [f"{toml_key(k)} = {toml_value(v)}" for k, v in top.items()]
        lines += toml_table("agents", {"enabled": False})  # sub-agents: a `namespace` tool
        lines += toml_table("analytics", {"enabled": False})
        features: dict[str, object] = dict.fromkeys(DISABLED_FEATURES, False)
        lines += toml_table("features", features)
        lines += toml_table("skills", {"include_instructions": bool(options.skills)})
        lines += toml_table("tools.experimental_request_user_input", {"enabled": False})
        lines += toml_table(
            f"model_providers.{PROVIDER}",
            {
                "name": "polar_mq proxy",
                "base_url": run.ctx.proxy_base_url,
                "env_key": "OPENAI_API_KEY",
                "wire_api": "responses",
                "request_max_retries": options.request_max_retries,
                "stream_max_retries": options.stream_max_retries,
            },
        )
        for name, server in options.mcp_servers.items():
            table: dict[str, object]
            if server.url is not None:
                table = {"url": server.url}
            else:
                table = {"command": server.command, "args": list(server.args)}
                if server.env:
                    table["env"] = dict(server.env)
            lines += toml_table(f"mcp_servers.{toml_key(name)}", table)
        files[f"{CODEX_HOME}/config.toml"] = "\n".join(lines) + "\n"
        for name, text in options.skills.items():
            files[f"{CODEX_HOME}/skills/{name}/SKILL.md"] = text
        return files

    def env(self, run: PresetRun) -> dict[str, str]:
        return {"CODEX_HOME": f"{run.ctx.workdir}/{CODEX_HOME}"}


PRESET = CodexPreset()
