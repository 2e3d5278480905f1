"""smolagents (PyPI `smolagents[openai]`): a library, run by a small driver we ship.

How it is run: the driver (drivers/smolagents_driver.py, copied into the workspace as
`.polar/smolagents/driver.py`, so it runs wherever the install's interpreter runs) is started with
the install's own python: `python .polar/smolagents/driver.py --agent tool_calling|code
--max-steps <max_turns> --tool python_interpreter --answer ... --transcript ...`. It builds
`OpenAIServerModel(model_id=POLAR_MODEL, api_base=OPENAI_BASE_URL, api_key=OPENAI_API_KEY)` (the
proxy and the rollout token) and a `ToolCallingAgent` (default; native tool calls) or a
`CodeAgent` (`options.agent: "code"`: the model writes Python in `<code>` blocks, run by
smolagents' local restricted interpreter), and runs it on POLAR_INSTRUCTION. Tools: smolagents'
defaults that need no network (`options.tools`, default `["python_interpreter"]`; `final_answer`
is always there). Nothing is interactive and smolagents has no telemetry of its own.

Answer: the value the agent passed to its `final_answer` tool (or, out of steps, the answer
smolagents asks the model for in one last call), written to `.polar/smolagents/answer.txt`.
Artifacts: `transcript` (the run result: output, state success | max_steps_error, every memory
step with the model's input and output, tool calls, observations and errors, token usage).
`options.tool_choice: auto` replaces the `tool_choice: required` smolagents sends with every
ToolCallingAgent call (a model kwarg, which smolagents lets override its own): the engine then
need not force a call, and the proxy's token-in path takes the call (docs/tito.md).
Side calls: none by default (a `planning_interval` would add planning calls; it is not set).
CodeAgent's system prompt is long (8.5k characters, over 2k tokens: too long for a 2k-context
model); ToolCallingAgent's is 3.7k characters.
"""

from __future__ import annotations

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

DRIVER_SOURCE = Path(__file__).parent / "drivers" / "smolagents_driver.py"
SMOL_DIR = f"{STATE_DIR}/smolagents"
DRIVER = f"{SMOL_DIR}/driver.py"
ANSWER = f"{SMOL_DIR}/answer.txt"
TRANSCRIPT = f"{SMOL_DIR}/transcript.json"
Tool = Literal["python_interpreter"]
"""smolagents' default tools that need no network (the driver's TOOLS)."""


def _default_tools() -> list[Tool]:
    return ["python_interpreter"]


class SmolagentsOptions(PresetOptions):
    agent: Literal["tool_calling", "code"] = Field(
        "tool_calling", description="ToolCallingAgent (native tool calls) or CodeAgent"
    )
    tools: list[Tool] = Field(
        default_factory=_default_tools,
        description="smolagents default tools that need no network (final_answer is implied)",
    )
    authorized_imports: list[str] = Field(
        default_factory=list, description="CodeAgent: modules its code may import beyond the base"
    )
    instructions: str | None = Field(None, description="added to the agent's system prompt")
    tool_choice: Literal["required", "auto"] = Field(
        "required", description="ToolCallingAgent: the tool_choice it sends (smolagents': required)"
    )


class Smolagents(Preset):
    name: ClassVar[str] = "smolagents"
    api_family: ClassVar[str] = "chat"
    package: ClassVar[Package] = Package(Ecosystem.PYPI, "smolagents", "1.26.0", "[openai]")
    options_model: ClassVar[type[PresetOptions]] = SmolagentsOptions
    takes_mcp: ClassVar[bool] = False
    takes_skills: ClassVar[bool] = False
    answer: ClassVar[AnswerSource] = AnswerSource(
        ANSWER, "the value given to the final_answer tool (written by the driver)"
    )
    artifacts: ClassVar[dict[str, str]] = {"transcript": TRANSCRIPT}
    notes: ClassVar[str] = "library run by a shipped driver; CodeAgent prompts are long"

    def argv(self, run: PresetRun) -> list[str]:
        options = run.options
        assert isinstance(options, SmolagentsOptions)
        workdir = run.ctx.workdir
        argv = [
            run.install.python,
            f"{workdir}/{DRIVER}",
            "--agent",
            options.agent,
            "--max-steps",
            str(options.max_turns),
            "--answer",
            f"{workdir}/{ANSWER}",
            "--transcript",
            f"{workdir}/{TRANSCRIPT}",
        ]
        for tool in options.tools:
            argv += ["--tool", tool]
        for module in options.authorized_imports:
            argv += ["--authorized-import", module]
        if options.instructions is not None:
            argv += ["--instructions", options.instructions]
        if options.tool_choice != "required":
            argv += ["--tool-choice", options.tool_choice]
        return argv

    def files(self, run: PresetRun) -> dict[str, str]:
        return {DRIVER: DRIVER_SOURCE.read_text()}

    def env(self, run: PresetRun) -> dict[str, str]:
        return {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}


PRESET = Smolagents()
