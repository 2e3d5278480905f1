"""The OpenHands Software Agent SDK (PyPI `openhands-sdk` with `openhands-tools`), run by a small
driver shipped with polar_mq.

Python: every openhands-sdk release (1.0.0 to 1.58.2) requires Python >= 3.12, newer than the
worker's 3.11, so the package names `python="3.12"`: the install makes its venv with a
`python3.12` found on PATH, under /usr(/local)/bin or as a pyenv build, and fails with a message
naming the requirement when the node has none.

How it is run: the preset writes its driver (`drivers/openhands_sdk_driver.py`) and a config into
`<workspace>/.polar/` and runs

    <install>/venv/bin/python .polar/openhands_sdk_driver.py --max-iterations N \
        --config .polar/openhands_sdk.json

with the install's own Python. The driver builds the SDK's `Agent` with its `terminal` tool
(subprocess backend by default, `options.terminal_type`) and `file_editor` tool (plus the built-in
`finish` and `think`), an `LLM` of litellm's `openai/<POLAR_MODEL>` on OPENAI_BASE_URL (the proxy)
with OPENAI_API_KEY (the rollout token) in chat-completions mode, and runs a `Conversation` in the
workspace with `max_iteration_per_run = options.max_turns`. MCP servers (`options.mcp_servers`)
go into the agent's `mcp_config` (the SDK's own MCP server format); skills (`options.skills`) are
written as `$HOME/.agents/skills/<name>/SKILL.md` (HOME is inside the workspace) and loaded as
user skills. Public skills (fetched from the network), observability export (only with LMNR_*
variables, which are never set) and the startup banner are off; litellm uses its bundled model
cost map instead of fetching one.

Answer: the final response (the `finish` tool's message, else the agent's last plain message),
written by the driver to `.polar/openhands_answer.txt`. Artifacts: `transcript` =
`.polar/openhands_events.jsonl` (every conversation event as JSON, one a line). Exit status 2
when the iteration limit was reached or the SDK's stuck detector stopped it, 1 on other failures.

Side calls: none seen against the scripted engine (no condenser is configured, so no summaries).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from polar_mq.harnesses.base import AnswerSource
from polar_mq.harnesses.presets.base import (
    STATE_DIR,
    Ecosystem,
    Package,
    Preset,
    PresetOptions,
    PresetRun,
)

VERSION = "1.58.2"
DRIVER = Path(__file__).resolve().parent / "drivers" / "openhands_sdk_driver.py"
DRIVER_FILE = f"{STATE_DIR}/openhands_sdk_driver.py"
CONFIG_FILE = f"{STATE_DIR}/openhands_sdk.json"
ANSWER_FILE = f"{STATE_DIR}/openhands_answer.txt"
TRANSCRIPT_FILE = f"{STATE_DIR}/openhands_events.jsonl"
SKILLS_DIR = f"{STATE_DIR}/home/.agents/skills"
_SKILL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class OpenHandsOptions(PresetOptions):
    terminal_type: Literal["subprocess", "tmux"] = Field(
        "subprocess", description="the terminal tool's backend (tmux needs tmux in the runtime)"
    )
    num_retries: int = Field(2, ge=0, le=10, description="the SDK's retries of a failed LLM call")

    @field_validator("skills")
    @classmethod
    def _skill_names(cls, skills: dict[str, str]) -> dict[str, str]:
        for name in skills:
            if not _SKILL_NAME.fullmatch(name):
                raise ValueError(f"skill name {name!r}: letters, digits, '.', '_' and '-' only")
        return skills


class OpenHandsSdk(Preset):
    name: ClassVar[str] = "openhands_sdk"
    api_family: ClassVar[str] = "chat"
    package: ClassVar[Package] = Package(
        Ecosystem.PYPI,
        "openhands-sdk",
        VERSION,
        also=(f"openhands-tools=={VERSION}",),
        python="3.12",
    )
    options_model: ClassVar[type[PresetOptions]] = OpenHandsOptions
    answer: ClassVar[AnswerSource] = AnswerSource(
        ANSWER_FILE, "the finish tool's message, else the agent's last message"
    )
    artifacts: ClassVar[dict[str, str]] = {"transcript": TRANSCRIPT_FILE}
    notes: ClassVar[str] = "driver script; needs Python 3.12 on the node"

    def argv(self, run: PresetRun) -> list[str]:
        workdir = run.ctx.workdir
        return [
            run.install.python,
            f"{workdir}/{DRIVER_FILE}",
            "--max-iterations",
            str(run.options.max_turns),
            "--config",
            f"{workdir}/{CONFIG_FILE}",
        ]

    def files(self, run: PresetRun) -> dict[str, str]:
        options = run.options
        assert isinstance(options, OpenHandsOptions), type(options)
        config = {
            "answer_file": ANSWER_FILE,
            "transcript_file": TRANSCRIPT_FILE,
            "terminal_type": options.terminal_type,
            "num_retries": options.num_retries,
            "load_user_skills": bool(options.skills),
            "mcp_servers": {
                name: server.model_dump(exclude_none=True, exclude_defaults=True)
                for name, server in options.mcp_servers.items()
            },
        }
        files = {DRIVER_FILE: DRIVER.read_text(), CONFIG_FILE: json.dumps(config, indent=1)}
        for name, text in options.skills.items():
            files[f"{SKILLS_DIR}/{name}/SKILL.md"] = text
        return files

    def env(self, run: PresetRun) -> dict[str, str]:
        return {
            "OPENHANDS_SUPPRESS_BANNER": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }


PRESET = OpenHandsSdk()
