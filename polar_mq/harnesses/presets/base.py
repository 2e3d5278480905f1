"""What a preset is: one real third-party harness, run unmodified, described once.

A preset says how its harness is installed (npm or PyPI, a pinned default version), the command
line that runs it non-interactively on one task (permission prompts off, turn limit from
`options`), the config files it needs (written inside the rollout's workspace, under `.polar/`,
never the worker's home), where its answer and transcript end up, and how to recognise the side
calls it makes for itself. `PresetHarness` (harness.py) turns that into the generic harness
interface the run-agent stage already drives.
"""

from __future__ import annotations

import shlex
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from polar_mq.harnesses.auxiliary import AuxiliaryRule
from polar_mq.harnesses.base import AgentContext, AnswerSource

STATE_DIR = ".polar"
"""Inside the workspace: the harness's HOME and config. Left out of the workspace diff."""


class Ecosystem(StrEnum):
    NPM = "npm"
    PYPI = "pypi"


@dataclass(frozen=True, slots=True)
class Package:
    """Where the harness comes from. `also`: further pinned requirements installed beside it.
    `python`: for a PyPI harness that needs a newer interpreter than the worker's, the Python
    version its venv is made with ("3.12"); empty means the worker's own interpreter."""

    ecosystem: Ecosystem
    name: str
    default_version: str
    extras: str = ""
    also: tuple[str, ...] = ()
    python: str = ""


@dataclass(frozen=True, slots=True)
class Install:
    """A completed install on this node: its directory and where its programs are."""

    directory: Path
    bin_dir: Path

    @classmethod
    def at(cls, directory: Path, ecosystem: Ecosystem) -> Install:
        bin_dir = directory / ("node_modules/.bin" if ecosystem is Ecosystem.NPM else "venv/bin")
        return cls(directory, bin_dir)

    def program(self, name: str) -> str:
        return str(self.bin_dir / name)

    @property
    def python(self) -> str:
        """The install's own interpreter (Python presets: drivers run with it)."""
        return self.program("python")


class McpServer(BaseModel):
    """An MCP server the harness may use: a local command (stdio) or a URL (HTTP)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    url: str | None = None

    def model_post_init(self, _context: object) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP server needs exactly one of 'command' or 'url'")


class PresetOptions(BaseModel):
    """Options every preset takes; a preset may add its own by subclassing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turns: int = Field(30, ge=1, le=10_000, description="agent turns / steps before it stops")
    extra_args: list[str] = Field(default_factory=list, description="appended to the command line")
    mcp_servers: dict[str, McpServer] = Field(default_factory=dict)
    skills: dict[str, str] = Field(
        default_factory=dict, description="skill name -> its SKILL.md text (harnesses with skills)"
    )


@dataclass(frozen=True, slots=True)
class PresetRun:
    """One rollout's view of a preset: the context, the install and the validated options."""

    ctx: AgentContext
    install: Install
    options: PresetOptions
    version: str

    @property
    def state_dir(self) -> str:
        return f"{self.ctx.workdir}/{STATE_DIR}"

    @property
    def home(self) -> str:
        return f"{self.state_dir}/home"


class Preset(ABC):
    """One harness. Subclasses set the class attributes and `argv`."""

    name: ClassVar[str]
    api_family: ClassVar[str]
    """chat | messages | responses | gemini: what the harness speaks to the proxy."""
    package: ClassVar[Package]
    options_model: ClassVar[type[PresetOptions]] = PresetOptions
    answer: ClassVar[AnswerSource] = AnswerSource(
        None, "the last assistant message of the main loop"
    )
    auxiliary: ClassVar[tuple[AuxiliaryRule, ...]] = ()
    artifacts: ClassVar[Mapping[str, str]] = {}
    """Artifact name -> workspace-relative path of a file the harness writes (its transcript)."""
    takes_mcp: ClassVar[bool] = True
    takes_skills: ClassVar[bool] = True
    """False: the harness has no MCP client / skill format; a job that names some is refused."""
    notes: ClassVar[str] = ""
    trusted: ClassVar[bool] = False
    """False (every preset so far): third-party code we run unmodified but do not vouch for, so a
    job under bwrap or docker that names no `runtime.network` gets `proxy_only`
    (runtimes/options.py `effective_network`). True keeps the node's network by default."""

    def check_options(self, options: PresetOptions) -> None:
        """Refuse (ValueError) what this harness cannot take: MCP servers, skills."""
        refused = [
            name
            for name, given, taken in (
                ("mcp_servers", options.mcp_servers, self.takes_mcp),
                ("skills", options.skills, self.takes_skills),
            )
            if given and not taken
        ]
        if refused:
            raise ValueError(f"the {self.name} preset takes no {' or '.join(refused)}")

    @abstractmethod
    def argv(self, run: PresetRun) -> list[str]:
        """The program and its arguments (the instruction passed as the harness takes it)."""

    def files(self, run: PresetRun) -> dict[str, str]:
        """Config files, workspace-relative path -> text, written before the agent starts."""
        return {}

    def env(self, run: PresetRun) -> dict[str, str]:
        """Harness-specific variables (on top of HOME, PATH and the proxy wiring)."""
        return {}

    def command(self, run: PresetRun) -> str:
        """The shell command line: every argument quoted, so no value reaches the shell."""
        return shlex.join([*self.argv(run), *run.options.extra_args])
