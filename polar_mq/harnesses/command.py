"""The `command` harness: any shell command, with the task reachable by placeholders and env.

Placeholders are replaced one by one (not with `str.format`) so that shell braces such as
`${HOME}` or `awk '{print $1}'` in user commands pass through untouched.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

from polar_mq.harnesses.auxiliary import AuxiliaryRule
from polar_mq.harnesses.base import AgentContext, Harness
from polar_mq.harnesses.env import check_user_env

PLACEHOLDERS = ("instruction", "task_file", "workdir", "rollout_id", "model", "python")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")


def _values(ctx: AgentContext) -> dict[str, str]:
    return {
        "instruction": ctx.instruction,
        "task_file": ctx.task_file,
        "workdir": ctx.workdir,
        "rollout_id": ctx.rollout_id,
        "model": ctx.model,
        "python": ctx.python,
    }


def substitute(template: str, ctx: AgentContext, *, quote: bool) -> str:
    """Fill the known placeholders; `quote` shell-quotes each value (for command lines)."""
    values = _values(ctx)

    def fill(match: re.Match[str]) -> str:
        value = values[match.group(1)]
        return shlex.quote(value) if quote else value

    return _PLACEHOLDER.sub(fill, template)


class CommandHarness(Harness):
    """Runs `command` through the shell; `env` values may use the same placeholders, unquoted.

    The proxy variables are reserved: a job that tries to set them is refused at construction,
    before any rollout runs, rather than silently bypassing token capture.
    """

    type = "command"

    def __init__(
        self,
        command: str,
        env: Mapping[str, str] | None = None,
        auxiliary_rules: tuple[AuxiliaryRule, ...] = (),
        artifacts: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(command, str) or not command.strip():
            raise ValueError("command harness needs a non-empty 'command' string")
        self.template = command
        self.user_env = check_user_env(env)
        self.auxiliary_rules = auxiliary_rules
        self.artifacts = check_artifacts(artifacts)

    def command(self, ctx: AgentContext) -> str:
        return substitute(self.template, ctx, quote=True)

    def env(self, ctx: AgentContext) -> dict[str, str]:
        """Harness env, then the rollout's extra env, then the proxy wiring (which always wins)."""
        user = {key: substitute(value, ctx, quote=False) for key, value in self.user_env.items()}
        return {**user, **super().env(ctx)}

    def __repr__(self) -> str:
        return f"CommandHarness({self.template!r})"


_ARTIFACT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_artifacts(artifacts: object) -> dict[str, str]:
    """`{"name": "workspace/relative/path"}`: names are simple, paths stay inside the workspace."""
    if artifacts is None:
        return {}
    if not isinstance(artifacts, Mapping):
        raise ValueError("harness 'artifacts' must map names to workspace-relative paths")
    for name, path in artifacts.items():
        if not isinstance(name, str) or not _ARTIFACT_NAME.fullmatch(name):
            raise ValueError(f"artifact name {name!r}: use 1-64 of [A-Za-z0-9._-]")
        parts = path.split("/") if isinstance(path, str) else []
        if not parts or path.startswith("/") or ".." in parts:
            raise ValueError(f"artifact {name!r}: {path!r} is not a workspace-relative path")
    return dict(artifacts)
