"""The `command` harness: any shell command, with the task reachable by placeholders and env.

Placeholders are replaced one by one (not with `str.format`) so that shell braces such as
`${HOME}` or `awk '{print $1}'` in user commands pass through untouched.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from polar_mq.harnesses.auxiliary import AuxiliaryRule
from polar_mq.harnesses.base import AgentContext, Harness
from polar_mq.harnesses.env import check_user_env

PLACEHOLDERS = ("instruction", "task_file", "workdir", "rollout_id", "model", "python")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
PLACEHOLDER_ENV = {
    "instruction": "POLAR_INSTRUCTION",
    "task_file": "POLAR_TASK_FILE",
    "workdir": "POLAR_WORKDIR",
    "rollout_id": "POLAR_ROLLOUT_ID",
    "model": "POLAR_MODEL",
    "python": "POLAR_PYTHON",
}
"""Each placeholder's value is also in the agent's environment under this name."""

_UNQUOTED, _SINGLE, _DOUBLE = "unquoted", "single", "double"


def _values(ctx: AgentContext) -> dict[str, str]:
    return {
        "instruction": ctx.instruction,
        "task_file": ctx.task_file,
        "workdir": ctx.workdir,
        "rollout_id": ctx.rollout_id,
        "model": ctx.model,
        "python": ctx.python,
    }


def _reference(name: str, context: str) -> str:
    """A reference to the placeholder's variable that reads as one literal word in `context`.

    The shell expands a variable once and never re-reads the result as code, so a value such as
    `$(touch ~/owned)` stays text whatever quotes surround the placeholder.
    """
    var = "${" + PLACEHOLDER_ENV[name] + "}"
    if context == _DOUBLE:
        return var
    if context == _SINGLE:
        return "'\"" + var + "\"'"  # close the single quotes, expand in double, reopen
    return '"' + var + '"'


def _enter(stack: list[str], closers: list[str], state: str, closer: str) -> None:
    stack.append(state)
    closers.append(closer)


def _leave(stack: list[str], closers: list[str]) -> None:
    stack.pop()
    closers.pop()


def _to_variables(template: str) -> str:
    """Replace each placeholder by a variable reference fitting its quoting context.

    A small POSIX-sh scanner: single and double quotes, backslash escapes, and `$(...)` / backticks
    (a new unquoted context, also inside double quotes).
    """
    out: list[str] = []
    stack = [_UNQUOTED]  # contexts; `$(` and backticks push an unquoted one
    closers = [""]  # what ends each pushed context
    i = 0
    while i < len(template):
        state = stack[-1]
        match = _PLACEHOLDER.match(template, i)
        if match:
            out.append(_reference(match.group(1), state))
            i = match.end()
            continue
        char = template[i]
        pair = template[i : i + 2]
        out.append(char)
        i += 1
        if state == _SINGLE:
            if char == "'":
                _leave(stack, closers)
        elif char == "\\" and i < len(template):
            out.append(template[i])
            i += 1
        elif state == _UNQUOTED and len(stack) > 1 and char == closers[-1]:
            _leave(stack, closers)  # the end of a `$(...)` or a backtick substitution
        elif state == _DOUBLE and char == '"':
            _leave(stack, closers)
        elif pair == "$(":
            out.append("(")
            i += 1
            _enter(stack, closers, _UNQUOTED, ")")
        elif char == "`":
            _enter(stack, closers, _UNQUOTED, "`")
        elif state == _UNQUOTED and char in "'\"":
            _enter(stack, closers, _SINGLE if char == "'" else _DOUBLE, char)
    return "".join(out)


def substitute(template: str, ctx: AgentContext, *, quote: bool) -> str:
    """Fill the known placeholders.

    `quote` (command lines): each placeholder becomes a reference to the environment variable that
    carries its value (`_to_variables`), so no value is ever parsed by the shell. Otherwise (env
    values, which the shell never sees) the value itself.
    """
    if quote:
        return _to_variables(template)
    values = _values(ctx)
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)


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
