"""opencode (npm `opencode-ai`): `opencode run` with the proxy as an OpenAI-compatible provider.

How it is run::

    sh -c 'exec "$@" > <ws>/.polar/opencode/transcript.jsonl' opencode-preset \
        opencode run --pure --auto --format json --print-logs --log-level WARN \
            --dir <ws> -m polar/MODEL INSTRUCTION

with the config in `OPENCODE_CONFIG_CONTENT` (the highest-precedence config layer, so a
repository's own `opencode.json` cannot re-point the model): a provider `polar` using the
`@ai-sdk/openai-compatible` adapter with `baseURL`/`apiKey` read from `{env:OPENAI_BASE_URL}` /
`{env:OPENAI_API_KEY}` (the proxy and the rollout token) and the one model `MODEL`;
`agent.build.steps` = `options.max_turns` (opencode's own iteration limit: the last step is
forced to be text only); `autoupdate` off, sharing disabled. `--auto` approves every permission
request (the runtime is the sandbox). opencode's data, config, cache and state directories
(`XDG_*_HOME`) are under `<ws>/.polar/opencode/`; the models.dev catalogue fetch, LSP downloads
and default plugins are off (`OPENCODE_DISABLE_*`).

No network beyond the proxy: opencode 1.18 bundles the `@ai-sdk/openai-compatible` adapter, so it
installs nothing at run time (its cache directory stays without `node_modules`; the e2e test checks
it).

- Turn limit: `options.max_turns` -> `agent.build.steps`.
- MCP servers: `mcp.NAME` = `{"type": "local", "command": [command, *args], "environment"}` or
  `{"type": "remote", "url"}`. Skills: `<XDG_CONFIG_HOME>/opencode/skills/NAME/SKILL.md`.
- `options.title`: a fixed session title (`--title`), which spares the title call.
- Answer: the last assistant message of the main loop.
- Artifacts: `transcript` = the `--format json` event stream (stdout); `agent.log` = opencode's
  log (stderr).
- Side calls: a title-generation call before the first step (system prompt "You are a title
  generator", no tools): declared auxiliary.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from pydantic import Field, field_validator

from polar_mq.harnesses.auxiliary import AuxiliaryRule
from polar_mq.harnesses.presets.base import Ecosystem, Package, Preset, PresetOptions, PresetRun

STATE = ".polar/opencode"
TRANSCRIPT = f"{STATE}/transcript.jsonl"
PROVIDER = "polar"
TITLE_SYSTEM = "You are a title generator"
_SKILL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_TO_TRANSCRIPT = (
    'mkdir -p "$POLAR_WORKDIR/' + STATE + '" && exec "$@" > "$POLAR_WORKDIR/' + TRANSCRIPT + '"'
)
DISABLED = (
    "OPENCODE_DISABLE_AUTOUPDATE",
    "OPENCODE_DISABLE_MODELS_FETCH",
    "OPENCODE_DISABLE_LSP_DOWNLOAD",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS",
    "OPENCODE_DISABLE_SHARE",
)


class OpencodeOptions(PresetOptions):
    title: str | None = Field(
        None, min_length=1, description="a fixed session title (no title-generation call)"
    )

    @field_validator("skills")
    @classmethod
    def _skill_names(cls, skills: dict[str, str]) -> dict[str, str]:
        for name in skills:
            if not _SKILL_NAME.fullmatch(name):
                raise ValueError(f"skill name {name!r}: letters, digits, '-', '_' and '.' only")
        return skills


class OpencodePreset(Preset):
    name = "opencode"
    api_family = "chat"
    package = Package(Ecosystem.NPM, "opencode-ai", "1.18.33")
    options_model = OpencodeOptions
    auxiliary = (AuxiliaryRule(system_contains=TITLE_SYSTEM, no_tools=True),)
    artifacts: ClassVar[dict[str, str]] = {"transcript": TRANSCRIPT}
    notes = "provider adapter bundled: nothing is installed at run time"

    def argv(self, run: PresetRun) -> list[str]:
        options = run.options
        assert isinstance(options, OpencodeOptions)
        title = ["--title", options.title] if options.title is not None else []
        return [
            "sh", "-c", _TO_TRANSCRIPT, "opencode-preset",
            run.install.program("opencode"), "run",
            "--pure",
            "--auto",
            "--format", "json",
            "--print-logs", "--log-level", "WARN",
            "--dir", run.ctx.workdir,
            "-m", f"{PROVIDER}/{run.ctx.model}",
            *title,
            run.ctx.instruction,
        ]  # fmt: skip

    def config(self, run: PresetRun) -> dict[str, Any]:
        """opencode's config (`OPENCODE_CONFIG_CONTENT`)."""
        mcp: dict[str, Any] = {}
        for name, server in run.options.mcp_servers.items():
            if server.url is not None:
                mcp[name] = {"type": "remote", "url": server.url, "enabled": True}
            else:
                mcp[name] = {
                    "type": "local",
                    "command": [server.command, *server.args],
                    "environment": dict(server.env),
                    "enabled": True,
                }
        config: dict[str, Any] = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "polar_mq proxy",
                    "options": {
                        "baseURL": "{env:OPENAI_BASE_URL}",
                        "apiKey": "{env:OPENAI_API_KEY}",
                    },
                    "models": {run.ctx.model: {"name": run.ctx.model}},
                }
            },
            "model": f"{PROVIDER}/{run.ctx.model}",
            "autoupdate": False,
            "share": "disabled",
            "agent": {"build": {"steps": run.options.max_turns}},
        }
        if mcp:
            config["mcp"] = mcp
        return config

    def files(self, run: PresetRun) -> dict[str, str]:
        return {
            f"{STATE}/config/opencode/skills/{name}/SKILL.md": text
            for name, text in run.options.skills.items()
        }

    def env(self, run: PresetRun) -> dict[str, str]:
        state = f"{run.ctx.workdir}/{STATE}"
        return {
            "OPENCODE_CONFIG_CONTENT": json.dumps(self.config(run)),
            "XDG_CONFIG_HOME": f"{state}/config",
            "XDG_DATA_HOME": f"{state}/data",
            "XDG_CACHE_HOME": f"{state}/cache",
            "XDG_STATE_HOME": f"{state}/state",
            **dict.fromkeys(DISABLED, "1"),
        }


PRESET = OpencodePreset()
