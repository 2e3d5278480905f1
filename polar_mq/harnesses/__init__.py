"""Harnesses: how an unmodified agent program is started inside a runtime.

`get_harness` turns a job's harness spec into a `Harness`; the API calls it at submission time so
that a bad spec is a 4xx, never a failed rollout.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from polar_mq.harnesses.auxiliary import AuxiliaryRule, parse_rules
from polar_mq.harnesses.base import (
    DEFAULT_ANSWER,
    PROXY_ENV_VARS,
    AgentContext,
    AnswerSource,
    Harness,
    proxy_env,
)
from polar_mq.harnesses.command import PLACEHOLDERS, CommandHarness
from polar_mq.harnesses.presets.harness import PresetHarness
from polar_mq.harnesses.presets.registry import get_preset, presets

REFERENCE_AGENT_MODULE = "polar_mq.agents.tool_agent"


REFERENCE_TEMPLATE = f"{{python}} -m {REFERENCE_AGENT_MODULE}"
"""Started with the runtime's interpreter (`AgentContext.python`), which must have polar_mq's
agent and the openai SDK: the worker's own for `local`/`bwrap`, the image's for `docker` (see
scripts/build_agent_image.sh for an image that has both)."""


def reference_command(python: str = sys.executable) -> str:
    """The built-in tool agent's command line for the interpreter `python`."""
    return f"{shlex.quote(python)} -m {REFERENCE_AGENT_MODULE}"


def _rules(spec: Mapping[str, Any]) -> tuple[AuxiliaryRule, ...]:
    try:
        return parse_rules(spec.get("auxiliary_calls"))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"bad 'auxiliary_calls': {first.get('msg')}") from exc


def _command(spec: Mapping[str, Any]) -> Harness:
    _check_keys(spec, {"type", "command", "env", "auxiliary_calls", "artifacts"})
    return CommandHarness(
        spec.get("command", ""), spec.get("env"), _rules(spec), spec.get("artifacts")
    )


def _reference(spec: Mapping[str, Any]) -> Harness:
    _check_keys(spec, {"type", "env"})
    return CommandHarness(REFERENCE_TEMPLATE, spec.get("env"))


HARNESS_TYPES: dict[str, Callable[[Mapping[str, Any]], Harness]] = {
    "command": _command,
    "reference": _reference,
}


def get_harness(spec: Mapping[str, Any]) -> Harness:
    """Build a harness from `{"type": "command", "command": ..., "env": {...}}` and the like."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"harness spec must be a mapping, got {type(spec).__name__}")
    kind = spec.get("type")
    env = spec.get("env")
    if env is not None and not isinstance(env, Mapping):
        raise ValueError("harness 'env' must be a mapping of str to str")
    factory = HARNESS_TYPES.get(kind) if isinstance(kind, str) else None
    if factory is not None:
        return factory(spec)
    preset = get_preset(kind) if isinstance(kind, str) else None
    if preset is None:
        known = ", ".join([*sorted(HARNESS_TYPES), *presets()])
        raise ValueError(f"unknown harness type {kind!r}; known types: {known}")
    return PresetHarness(preset, spec)


def _check_keys(spec: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(map(repr, unknown))} in {spec.get('type')!r} harness spec; "
            f"allowed: {', '.join(sorted(allowed))}"
        )


__all__ = [
    "DEFAULT_ANSWER",
    "HARNESS_TYPES",
    "PLACEHOLDERS",
    "PROXY_ENV_VARS",
    "REFERENCE_AGENT_MODULE",
    "AgentContext",
    "AnswerSource",
    "AuxiliaryRule",
    "CommandHarness",
    "Harness",
    "PresetHarness",
    "get_harness",
    "proxy_env",
    "reference_command",
]
