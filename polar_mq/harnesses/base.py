"""What every harness shares: the rollout context and the proxy wiring through env vars.

A harness is an unmodified agent program; polar_mq only decides its command line and its
environment. The proxy wiring is the same for all harnesses, so it lives here and harnesses
cannot override it (an agent talking to the inference server directly would leave no tokens).
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from polar_mq.harnesses.auxiliary import AuxiliaryRule

# Variables that route the agent through the proxy and tell it its task; reserved for polar_mq.
PROXY_ENV_VARS = frozenset(
    {
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "GEMINI_API_KEY",
        "GOOGLE_API_KEY",
        "GOOGLE_GEMINI_BASE_URL",
        "POLAR_ROLLOUT_ID",
        "POLAR_INSTRUCTION",
        "POLAR_TASK_FILE",
        "POLAR_WORKDIR",
        "POLAR_MODEL",
        "POLAR_PYTHON",
    }
)


@dataclass(frozen=True, slots=True)
class AgentContext:
    """Everything a harness needs to start one rollout's agent.

    `proxy_base_url` is the OpenAI-style base (ending in `/v1`); `api_key` is the rollout's
    capability token, so the proxy can attribute every call to this rollout. `python` is the
    runtime's own interpreter (`Runtime.python`): the worker's for `local` and `bwrap`, the image's
    for `docker`; the reference agent is started with it (placeholder `{python}`).
    """

    rollout_id: str
    instruction: str
    task_file: str
    workdir: str
    proxy_base_url: str
    api_key: str
    model: str
    python: str = sys.executable
    extra_env: dict[str, str] = field(default_factory=dict)
    harness_root: Path | None = None
    """Where this node's installed presets are (`Settings.harness_root`)."""


@dataclass(frozen=True, slots=True)
class AnswerSource:
    """Where the graded answer comes from: `file` (workspace-relative) when the agent wrote it,
    else the last assistant message of the main loop (auxiliary calls excluded)."""

    file: str | None
    description: str


ANSWER_FILE = "answer.txt"
DEFAULT_ANSWER = AnswerSource(ANSWER_FILE, f"{ANSWER_FILE} if written, else the last message")


def proxy_env(ctx: AgentContext) -> dict[str, str]:
    """The variables that point OpenAI-, Anthropic- and Gemini-style agents at the proxy.

    Anthropic and Gemini clients append their own paths (`/v1/messages`, `/v1beta/models/...`)
    to the proxy's root; OpenAI clients take the `/v1` base. Every key is the rollout's token.
    """
    openai_base = ctx.proxy_base_url.rstrip("/")
    root = openai_base.removesuffix("/v1")
    return {
        "OPENAI_BASE_URL": openai_base,
        "OPENAI_API_KEY": ctx.api_key,
        "ANTHROPIC_BASE_URL": root,
        "ANTHROPIC_API_KEY": ctx.api_key,
        "ANTHROPIC_AUTH_TOKEN": ctx.api_key,
        "GEMINI_API_KEY": ctx.api_key,
        "GOOGLE_API_KEY": ctx.api_key,
        "GOOGLE_GEMINI_BASE_URL": root,
        "POLAR_ROLLOUT_ID": ctx.rollout_id,
        "POLAR_INSTRUCTION": ctx.instruction,
        "POLAR_TASK_FILE": ctx.task_file,
        "POLAR_WORKDIR": ctx.workdir,
        "POLAR_MODEL": ctx.model,
        "POLAR_PYTHON": ctx.python,
    }


class Harness(ABC):
    """Turns a rollout context into a shell command and an environment for the runtime."""

    type: ClassVar[str] = "preset"
    answer: AnswerSource = DEFAULT_ANSWER
    auxiliary_rules: tuple[AuxiliaryRule, ...] = ()
    """Rules recognising the harness's side calls (stored with purpose `auxiliary`)."""
    artifacts: Mapping[str, str] = {}
    """Artifact name -> workspace-relative file the harness writes (saved after the agent)."""

    @abstractmethod
    def command(self, ctx: AgentContext) -> str:
        """The shell command (run via `/bin/sh -c`) that starts the agent."""

    def files(self, ctx: AgentContext) -> dict[str, str]:
        """Config files (workspace-relative path -> text) written before the agent starts."""
        return {}

    def env(self, ctx: AgentContext) -> dict[str, str]:
        """Per-rollout extras first, then the proxy wiring, which always wins."""
        return {**ctx.extra_env, **proxy_env(ctx)}
