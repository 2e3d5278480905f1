"""The OpenAI Agents SDK (PyPI `openai-agents`), run by a small driver shipped with polar_mq.

How it is run: the SDK is a library, so the preset writes its driver
(`drivers/openai_agents_driver.py`) and a config into `<workspace>/.polar/` and runs

    <install>/venv/bin/python .polar/openai_agents_driver.py --max-turns N --api API \
        --config .polar/openai_agents.json

with the install's own Python. The driver builds one `Agent` with three function tools on the
workspace (`run_shell`: a shell command with a timeout, `read_file`, `write_file`) and the MCP
servers of `options.mcp_servers` (stdio or streamable HTTP, the SDK's own MCP classes), and runs
`Runner.run(agent, POLAR_INSTRUCTION, max_turns=options.max_turns)`. Its client is an
`AsyncOpenAI` on OPENAI_BASE_URL (the proxy) with OPENAI_API_KEY (the rollout token); the model is
POLAR_MODEL.

API family: `options.api = "responses"` (default) uses the SDK's default model class
(`OpenAIResponsesModel`, POST /v1/responses, which the proxy translates to chat for the engine);
`"chat"` uses `OpenAIChatCompletionsModel` (POST /v1/chat/completions).

Answer: the run's `final_output`, written by the driver to `.polar/openai_agents_answer.txt`.
Artifacts: `transcript` = `.polar/openai_agents_transcript.json` (the run's items as the SDK
replays them, `final_output`, and the error when it stopped early). Exit status 2 when it ran out
of turns (the SDK's MaxTurnsExceeded), 1 on other failures.

Side calls: none. Tracing export (which would call the vendor's endpoint) is off, both by
`set_tracing_disabled(True)` in the driver and OPENAI_AGENTS_DISABLE_TRACING=1. Skills: the SDK
has no skill format for a plain agent, so `options.skills` is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from polar_mq.harnesses.base import AnswerSource
from polar_mq.harnesses.presets.base import (
    STATE_DIR,
    Ecosystem,
    Package,
    Preset,
    PresetOptions,
    PresetRun,
)

DRIVER = Path(__file__).resolve().parent / "drivers" / "openai_agents_driver.py"
DRIVER_FILE = f"{STATE_DIR}/openai_agents_driver.py"
CONFIG_FILE = f"{STATE_DIR}/openai_agents.json"
ANSWER_FILE = f"{STATE_DIR}/openai_agents_answer.txt"
TRANSCRIPT_FILE = f"{STATE_DIR}/openai_agents_transcript.json"
DEFAULT_INSTRUCTIONS = (
    "You are a software agent working in a workspace directory. Use the tools to inspect and "
    "change files and to run commands. When the task is done, reply with the final answer."
)


class OpenAIAgentsOptions(PresetOptions):
    api: Literal["responses", "chat"] = Field(
        "responses", description="responses: the SDK's default model; chat: chat completions"
    )
    instructions: str = Field(DEFAULT_INSTRUCTIONS, description="the agent's system prompt")
    shell_timeout_s: float = Field(120.0, gt=0, le=3600, description="per run_shell command")


class OpenAIAgents(Preset):
    name: ClassVar[str] = "openai_agents"
    api_family: ClassVar[str] = "responses"
    package: ClassVar[Package] = Package(Ecosystem.PYPI, "openai-agents", "0.24.0")
    options_model: ClassVar[type[PresetOptions]] = OpenAIAgentsOptions
    takes_skills: ClassVar[bool] = False
    answer: ClassVar[AnswerSource] = AnswerSource(ANSWER_FILE, "the run's final_output")
    artifacts: ClassVar[dict[str, str]] = {"transcript": TRANSCRIPT_FILE}
    notes: ClassVar[str] = "driver script; options.api = responses (default) | chat"

    def argv(self, run: PresetRun) -> list[str]:
        options = _options(run)
        workdir = run.ctx.workdir
        return [
            run.install.python,
            f"{workdir}/{DRIVER_FILE}",
            "--max-turns",
            str(options.max_turns),
            "--api",
            options.api,
            "--config",
            f"{workdir}/{CONFIG_FILE}",
        ]

    def files(self, run: PresetRun) -> dict[str, str]:
        options = _options(run)
        config = {
            "instructions": options.instructions,
            "shell_timeout_s": options.shell_timeout_s,
            "answer_file": ANSWER_FILE,
            "transcript_file": TRANSCRIPT_FILE,
            "mcp_servers": {
                name: server.model_dump(exclude_none=True)
                for name, server in options.mcp_servers.items()
            },
        }
        return {DRIVER_FILE: DRIVER.read_text(), CONFIG_FILE: json.dumps(config, indent=1)}

    def env(self, run: PresetRun) -> dict[str, str]:
        return {
            "OPENAI_AGENTS_DISABLE_TRACING": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }


def _options(run: PresetRun) -> OpenAIAgentsOptions:
    options = run.options
    assert isinstance(options, OpenAIAgentsOptions), type(options)
    return options


PRESET = OpenAIAgents()
